"""Opening a trace directory: one DuckDB connection with every registered view.

:func:`connect` is how everything reads a store: ``kvtrace query``, ``kvtrace report``, the
dashboard, ``kvtrace demo`` and Python code (``kvtrace.store.connect(DIR)``).  It

1. lists the directory's complete files (:func:`kvtrace.store.files.list_files`: dot-files being
   written and batch files a rolled segment supersedes are left out, so no span counts twice);
2. skips, with a warning naming it, any ``.parquet`` file that is not Parquet (no ``PAR1`` magic
   at both ends; checked once per file version), so one stray file cannot fail every query;
3. refuses a directory that holds several runs (:mod:`kvtrace.store.runs`), naming them;
4. binds the list to ``read_parquet`` as a parameter, largest file first (a parallel scan then
   ends with small files on every thread), each path glob-escaped (DuckDB expands ``*``, ``?``
   and ``[`` even inside a list, so a file named ``x*.parquet`` would otherwise read every
   ``x...`` file too);
5. creates every view of :data:`kvtrace.store.views.VIEWS`.

The file list is fixed until :func:`refresh`.  Writers delete superseded batch files a few
seconds after a roll (:mod:`kvtrace.store.exporter`), so a connection kept open longer may name
a file that is gone: :func:`query` (which the analysis functions use) then re-lists and runs the
query again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar, cast

import duckdb
import pyarrow as pa

from kvtrace.store import runs
from kvtrace.store.files import list_files
from kvtrace.store.schema import SCHEMA
from kvtrace.store.sql import literal
from kvtrace.store.views import VIEWS
from kvtrace.store.views.spans import RAW

if TYPE_CHECKING:  # a type only: clickhouse.store imports this package
    from kvtrace.store.clickhouse.store import ClickHouseStore

log = logging.getLogger(__name__)

READ_FILES = (
    "SELECT * FROM read_parquet($files, hive_partitioning = true, union_by_name = true, "
    "hive_types = {'date': DATE, 'hour': INTEGER})"
)
SOURCE = "kvtrace_source"
"""One-row table on each connection: the directory it reads (so :func:`refresh` of a cursor can re-list)."""
_RETRIES = 5
T = TypeVar("T")
_MAGIC = b"PAR1"


class StoreError(Exception):
    """No single run of trace data where it was asked for (one-line message)."""


_checked: dict[str, tuple[int, int, str | None]] = {}  # path -> (size, mtime_ns, why not Parquet)


def _not_parquet(path: str) -> str | None:
    """Why ``path`` is not a Parquet file, or None (magic bytes at both ends, sane footer length)."""
    try:
        st = os.stat(path)
        seen = _checked.get(path)
        if seen is not None and seen[:2] == (st.st_size, st.st_mtime_ns):
            return seen[2]
        why = None
        if st.st_size < 12:
            why = f"{st.st_size} bytes"
        else:
            with open(path, "rb") as f:
                head = f.read(4)
                f.seek(-8, os.SEEK_END)
                tail = f.read(8)
            footer = int.from_bytes(tail[:4], "little")
            if head != _MAGIC or tail[4:] != _MAGIC:
                why = "no Parquet magic bytes"
            elif footer > st.st_size - 12:
                why = "footer longer than the file"
        _checked[path] = (st.st_size, st.st_mtime_ns, why)
        return why
    except FileNotFoundError:
        raise
    except OSError as exc:
        return exc.strerror or str(exc)


def trace_files(directory: str | os.PathLike) -> list[str]:
    """The complete, readable Parquet files of ``directory`` (see module doc, steps 1-2)."""
    out = []
    for path in list_files(directory):
        try:
            why = _not_parquet(path)
        except FileNotFoundError:  # a superseded batch file swept since the listing
            continue
        if why is None:
            out.append(path)
        else:
            log.warning("kvtrace: skipping %s: not a Parquet file (%s)", path, why)
    return out


def _size(path: str) -> int:
    seen = _checked.get(path)
    return seen[0] if seen is not None else 0


def glob_escape(path: str) -> str:
    """``path`` as a DuckDB glob that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def _empty_raw() -> pa.Table:
    schema = SCHEMA.append(pa.field("date", pa.date32())).append(pa.field("hour", pa.int32()))
    return schema.empty_table()


def check_one_run(directory: str | os.PathLike, files: list[str] | None = None) -> None:
    """Raise :class:`StoreError` when ``directory`` holds more than one run."""
    root = os.fspath(directory)
    if files is None:
        try:
            files = list_files(root)
        except FileNotFoundError:
            return
    found = runs.runs(files, root)
    if len(found) > 1:
        raise StoreError(runs.several_runs_message(root, found))


def _bind(con: duckdb.DuckDBPyConnection, directory: str, allow_empty: bool) -> None:
    """(Re)define the raw relation over the directory's current files."""
    try:
        files = trace_files(directory)
    except FileNotFoundError:
        if not allow_empty:
            raise StoreError(f"trace directory {directory} does not exist") from None
        files = []
    check_one_run(directory, files)
    if not files and not allow_empty:
        raise StoreError(f"no trace files in {directory}")
    if files:
        # largest first: DuckDB scans a file's row group on one thread, and a large one started
        # last would leave the other threads idle while it finishes
        by_size = sorted(files, key=lambda f: (-_size(f), f))
        con.sql(READ_FILES, params={"files": [glob_escape(f) for f in by_size]}).create_view(RAW, replace=True)
    else:
        con.from_arrow(_empty_raw()).create_view(RAW, replace=True)
    con.execute(
        f"CREATE OR REPLACE TABLE {SOURCE} AS SELECT {literal(directory)} AS directory, "
        f"{'true' if allow_empty else 'false'} AS allow_empty"
    )


def connect(
    directory: str | os.PathLike, *, allow_empty: bool = False, con: duckdb.DuckDBPyConnection | None = None
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection (or ``con``) over one run's trace files with every view of
    :data:`kvtrace.store.views.VIEWS` defined.  Time zone UTC.

    Raises :class:`StoreError` for a directory holding several runs, and for a missing or empty
    one unless ``allow_empty`` (then every view exists with its columns and zero rows)."""
    con = con or duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")

    def bind() -> duckdb.DuckDBPyConnection:
        _bind(con, os.fspath(directory), allow_empty)
        _create_views(con)  # binds the files (DuckDB reads their footers)
        return con

    return _retrying(bind)


def _retrying(attempt: Callable[[], T], before_retry: Callable[[], None] | None = None) -> T:
    """``attempt()``, run again (after ``before_retry()``) while it raises :class:`duckdb.IOException`
    (a listed file was swept meanwhile, so listing again finds the files that replaced it); the
    last of ``_RETRIES`` extra tries lets the error through."""
    for _ in range(_RETRIES):
        try:
            return attempt()
        except duckdb.IOException:
            if before_retry is not None:
                before_retry()
    return attempt()


def _create_views(con: duckdb.DuckDBPyConnection) -> None:
    for view in VIEWS:
        con.execute(view.create())


def refresh(
    con: duckdb.DuckDBPyConnection, directory: str | os.PathLike | None = None, *, allow_empty: bool | None = None
) -> None:
    """Re-list the directory (by default the one ``con`` was opened on) so the views see the
    files written, rolled and removed since."""
    ((src_dir, src_empty),) = con.execute(f"SELECT directory, allow_empty FROM {SOURCE}").fetchall()
    directory = os.fspath(directory) if directory is not None else src_dir
    _retrying(lambda: _bind(con, directory, src_empty if allow_empty is None else allow_empty))


def query(con: duckdb.DuckDBPyConnection, sql: str, params: dict | None = None) -> pa.Table | None:
    """Run ``sql`` with bound ``params``; the result as an Arrow table (None for a statement
    without one).  When a listed file has gone meanwhile (a writer swept a superseded batch file),
    re-list and run it again.  ``con`` may also be a
    :class:`~kvtrace.store.clickhouse.store.ClickHouseStore` (the same SQL, run on ClickHouse)."""
    if getattr(con, "is_clickhouse", False):
        return cast("ClickHouseStore", con).query(sql, params)

    def run() -> pa.Table | None:
        rel = con.sql(sql, params=params or None)
        return None if rel is None else rel.to_arrow_table()

    return _retrying(run, lambda: refresh(con))


def view_columns(con: duckdb.DuckDBPyConnection | None = None) -> dict[str, list[str]]:
    """View name -> its columns as DuckDB defines them (an empty store when ``con`` is None)."""
    if con is None:
        con = duckdb.connect()
        con.from_arrow(_empty_raw()).create_view(RAW, replace=True)
        _create_views(con)
    return {v.name: [row[0] for row in con.execute(f"DESCRIBE {v.name}").fetchall()] for v in VIEWS}
