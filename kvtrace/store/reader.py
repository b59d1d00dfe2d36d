"""Opening a trace directory: one DuckDB connection with every registered view.

:func:`connect` is how everything reads a store: ``kvtrace query``, ``kvtrace report``, the
dashboard, ``kvtrace demo`` and Python code (``kvtrace.store.connect(DIR)``).  It

1. lists the directory's complete files (:func:`kvtrace.store.files.list_files`: dot-files being
   written and batch files a rolled segment supersedes are left out, so no span counts twice);
2. skips, with a warning naming it, any ``.parquet`` file that is not Parquet (no ``PAR1`` magic
   at both ends) or whose schema is not kvtrace's (a column of :data:`~kvtrace.store.schema.SCHEMA`
   missing or of another kind: read from the footer), each checked once per file version, so one
   stray file cannot fail every query;
3. refuses a directory that holds several runs (:mod:`kvtrace.store.runs`), naming them;
4. binds the list to ``read_parquet`` as a parameter, largest file first (a parallel scan then
   ends with small files on every thread), each path glob-escaped (DuckDB expands ``*``, ``?``
   and ``[`` even inside a list, so a file named ``x*.parquet`` would otherwise read every
   ``x...`` file too);
5. creates every view of :data:`kvtrace.store.views.VIEWS`;
6. with ``read_only`` (``kvtrace query --read-only``, every dashboard connection), locks the
   connection down (:func:`lock_down`): no file outside the trace directory can be read or
   written, no extension loaded, no setting changed.

The file list is fixed until :func:`refresh`.  Writers delete superseded batch files a few
seconds after a roll (:mod:`kvtrace.store.exporter`), so a connection kept open longer may name
a file that is gone: :func:`query` (which the analysis functions use) then re-lists and runs the
query again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar, cast

import duckdb
import pyarrow as pa

from kvtrace.store import bounds, lookup, narrow, partials, runs, scan_index
from kvtrace.store.files import list_files
from kvtrace.store.schema import SCHEMA
from kvtrace.store.sql import glob_escape, literal
from kvtrace.store.views import BY_NAME, VIEWS
from kvtrace.store.views.agents import SCAN, SCAN_COLUMNS, scan_sql
from kvtrace.store.views.raw import RAW, read_files, spans_sql

if TYPE_CHECKING:  # a type only: clickhouse.store imports this package
    from kvtrace.store.clickhouse.store import ClickHouseStore

log = logging.getLogger(__name__)

SOURCE = "kvtrace_source"
"""One-row table on each connection: the directory it reads (so :func:`refresh` of a cursor can re-list)."""
_RETRIES = 5
T = TypeVar("T")
_MAGIC = b"PAR1"


class StoreError(Exception):
    """No single run of trace data where it was asked for (one-line message)."""


_checked: dict[str, tuple[int, int, str | None]] = {}  # path -> (size, mtime_ns, why it is skipped)


def _kind(t: pa.DataType) -> str:
    """What DuckDB's union of files cares about in a column type: strings, integers, floats and
    timestamps of any width or unit are alike; lists and maps by their element kinds."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_timestamp(t):
        return "timestamp"
    if pa.types.is_map(t):
        return f"map<{_kind(t.key_type)}, {_kind(t.item_type)}>"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list<{_kind(t.value_type)}>"
    return str(t)


_KINDS = {f.name: _kind(f.type) for f in SCHEMA}


def _schema_mismatch(path: str) -> str | None:
    """Why a Parquet file's schema is not kvtrace's (a missing column, a column of another kind),
    or None.  Extra columns are allowed (the union fills them with NULL elsewhere)."""
    import pyarrow.parquet as pq

    try:
        found = {f.name: _kind(f.type) for f in pq.read_schema(path)}
    except (OSError, pa.ArrowException) as exc:
        return f"unreadable footer: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    missing = [name for name in _KINDS if name not in found]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return f"schema is not kvtrace's: no column {', '.join(missing[:3])}{more}"
    for name, kind in _KINDS.items():
        if found[name] != kind:
            return f"schema is not kvtrace's: column {name} is {found[name]}, not {kind}"
    return None


def _skip_reason(path: str) -> str | None:
    """Why ``path`` is skipped, or None: not Parquet (magic bytes at both ends, sane footer
    length), or Parquet whose schema is not kvtrace's.  Cached per (size, mtime)."""
    try:
        st = os.stat(path)
        seen = _checked.get(path)
        if seen is not None and seen[:2] == (st.st_size, st.st_mtime_ns):
            return seen[2]
        why = None
        if st.st_size < 12:
            why = f"not a Parquet file ({st.st_size} bytes)"
        else:
            with open(path, "rb") as f:
                head = f.read(4)
                f.seek(-8, os.SEEK_END)
                tail = f.read(8)
            footer = int.from_bytes(tail[:4], "little")
            if head != _MAGIC or tail[4:] != _MAGIC:
                why = "not a Parquet file (no Parquet magic bytes)"
            elif footer > st.st_size - 12:
                why = "not a Parquet file (footer longer than the file)"
            else:
                why = _schema_mismatch(path)
        _checked[path] = (st.st_size, st.st_mtime_ns, why)
        return why
    except FileNotFoundError:
        raise
    except OSError as exc:
        return f"not a Parquet file ({exc.strerror or exc})"


def trace_files(directory: str | os.PathLike) -> list[str]:
    """The complete, readable kvtrace Parquet files of ``directory`` (see module doc, steps 1-2)."""
    out = []
    for path in list_files(directory):
        try:
            why = _skip_reason(path)
        except FileNotFoundError:  # a superseded batch file swept since the listing
            continue
        if why is None:
            out.append(path)
        else:
            log.warning("kvtrace: skipping %s: %s", path, why)
    return out


def build_indexes(directory: str | os.PathLike, *, min_bytes: int | None = None) -> list[str]:
    """Build the missing scan indexes of ``directory``'s trace files
    (:func:`kvtrace.store.scan_index.build`); returns those built."""
    return scan_index.build(_listed(directory), min_bytes=min_bytes)


def _listed(directory: str | os.PathLike) -> list[str]:
    try:
        return trace_files(directory)
    except FileNotFoundError:
        return []


def index_keeper(directories: Iterable[str], interval: float | None = None) -> scan_index.Keeper:
    """A :class:`kvtrace.store.scan_index.Keeper` (not started) of trace ``directories``."""
    return scan_index.Keeper(directories, _listed, interval)


def _size(path: str) -> int:
    seen = _checked.get(path)
    return seen[0] if seen is not None else 0


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


def _bind(
    con: duckdb.DuckDBPyConnection, directory: str, allow_empty: bool, index: bool, build: bool = False
) -> list[str]:
    """(Re)define the raw relation over the directory's current files (``index``: the scan reads
    their per-file indexes, :mod:`kvtrace.store.scan_index`; ``build``: build the missing ones
    first); returns the files."""
    try:
        files = trace_files(directory)
    except FileNotFoundError:
        if not allow_empty:
            raise StoreError(f"trace directory {directory} does not exist") from None
        files = []
    check_one_run(directory, files)
    if not files and not allow_empty:
        raise StoreError(f"no trace files in {directory}")
    if build:
        scan_index.build(files)
    if files:
        # largest first: DuckDB scans a file's row group on one thread, and a large one started
        # last would leave the other threads idle while it finishes
        by_size = sorted(files, key=lambda f: (-_size(f), f))
        # a bounded cursor's Timestamp bounds (kvtrace.store.bounds) and its files (kvtrace.store.narrow)
        files_sql = read_files(narrow.listed(narrow.FILES, "$files")) + bounds.FILTER
        con.sql(files_sql, params={"files": [glob_escape(f) for f in by_size]}).create_view(RAW, replace=True)
    else:
        con.from_arrow(_empty_raw()).create_view(RAW, replace=True)
    con.execute(
        f"CREATE OR REPLACE TABLE {SOURCE} AS SELECT {literal(directory)} AS directory, "
        f"{'true' if allow_empty else 'false'} AS allow_empty, {'true' if index else 'false'} AS scan_index"
    )
    return files


_RAW_REST = "kvtrace_raw_unindexed"
# The joins' gate (kvtrace.store.views.agents.JOINS_CTE), read off the indexes' footers: whether any
# row is another convention's span or one of kvtrace's calls without a TTFT (a row group's missing
# statistics count as yes).  Where none is, the joins change no row, so a store indexed whole is read
# without its ids (``_WITHOUT_IDS``): the gate then shuts on constants, and the widest column of the
# scan, ``trace_id``, is never read.
_NEEDS_JOINS_SQL = (
    "SELECT COALESCE(bool_or(stats_max IS NULL OR stats_max <> 'false'), false) "
    "FROM parquet_metadata($indexes) WHERE path_in_schema IN ('fgn', 'nt')"
)
_IDS = ("trace_id", "span_id", "request_id")
_WITHOUT_IDS = ", ".join(f"NULL::VARCHAR AS {c}" if c in _IDS else c for c in SCAN_COLUMNS.split(", "))


def _bind_scan(con: duckdb.DuckDBPyConnection, files: list[str]) -> None:
    """(Re)define ``kvtrace_scan`` (the breakdown's scan) and the per-span views of
    :mod:`.partials` over ``files``: the rows of their current scan indexes and partials and the
    views' SQL over the others, with the same ``Timestamp`` bounds (:mod:`.bounds`); with no index
    (or the connection opened with ``scan_index=False``), the views as registered."""
    ((use,),) = con.execute(f"SELECT scan_index FROM {SOURCE}").fetchall()
    kept = {path: scan_index.sidecars(path) if use else {} for path in files}
    facets = _bind_lookups(con, kept)
    indexed: list[str] = []
    rest: list[str] = []
    with_partials: dict[str, dict[str, str]] = {}
    entries = [(narrow.FILES, glob_escape(f), f) for f in files]
    for path in files:
        found = kept[path].get(scan_index.SUFFIX)
        if found is None or not partials.complete(kept[path]):
            rest.append(path)
        else:
            indexed.append(found)
            with_partials[path] = kept[path]
            entries.append((narrow.INDEXES, glob_escape(found), path))
    entries += [(narrow.REST, glob_escape(f), f) for f in rest] if indexed else []
    narrow.record(con, entries + partials.entries(with_partials), facets)
    if not indexed:
        for name in (SCAN, *partials.VIEWS):
            con.execute(BY_NAME[name].create())
        return
    indexed.sort(key=lambda f: (-os.path.getsize(f), f))  # largest first (see _bind)
    params = {"indexes": [glob_escape(f) for f in indexed]}
    columns = SCAN_COLUMNS
    if not rest and not con.execute(_NEEDS_JOINS_SQL, params).fetchall()[0][0]:
        columns = _WITHOUT_IDS
    indexes = narrow.listed(narrow.INDEXES, "$indexes")
    sql = f"SELECT {columns} FROM read_parquet({indexes}, hive_partitioning = false){bounds.INDEX_FILTER}"
    if rest:
        rest_sql = read_files(narrow.listed(narrow.REST, "$files")) + bounds.FILTER
        con.sql(rest_sql, params={"files": [glob_escape(f) for f in rest]}).create_view(_RAW_REST, replace=True)
        sql += f"\nUNION ALL\nSELECT {SCAN_COLUMNS} FROM ({scan_sql(f'({spans_sql(_RAW_REST)}) AS spans')}) AS rest"
    con.sql(sql, params=params).create_view(SCAN, replace=True)
    partials.bind(con, with_partials, _RAW_REST if rest else None)


def _bind_lookups(con: duckdb.DuckDBPyConnection, kept: dict[str, dict[str, str]]) -> dict[str, str]:
    """(Re)define the lookup views (:mod:`kvtrace.store.lookup`) over the files of ``kept`` (each
    file's current sidecars, :func:`kvtrace.store.scan_index.sidecars`): the lookups of the files that
    have all of them, the raw rows of the others; returns each file's facets lookup (its range,
    :mod:`kvtrace.store.narrow`)."""
    found: dict[str, list[str]] = {view: [] for view, _, _ in lookup.KINDS}
    facets: dict[str, str] = {}
    rest = []
    for path, have in kept.items():
        if all(suffix in have for suffix in lookup.SUFFIXES):
            for view, suffix, _ in lookup.KINDS:
                found[view].append(have[suffix])
            facets[path] = have[lookup.FACETS_SUFFIX]
        else:
            rest.append(path)
    lookup.bind(con, found, rest)
    return facets


def connect(
    directory: str | os.PathLike,
    *,
    allow_empty: bool = False,
    con: duckdb.DuckDBPyConnection | None = None,
    read_only: bool = False,
    scan_index: bool = True,
) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection (or ``con``) over one run's trace files with every view of
    :data:`kvtrace.store.views.VIEWS` defined.  Time zone UTC.  ``read_only``: :func:`lock_down`.

    Raises :class:`StoreError` for a directory holding several runs, and for a missing or empty
    one unless ``allow_empty`` (then every view exists with its columns and zero rows).
    ``scan_index``: the breakdown reads the files' scan indexes (:mod:`kvtrace.store.scan_index`),
    built first for files that lack one unless ``read_only``; False: neither built nor read."""
    con = con or duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")

    def bind() -> duckdb.DuckDBPyConnection:
        files = _bind(con, os.fspath(directory), allow_empty, scan_index, build=scan_index and not read_only)
        _create_views(con)  # binds the files (DuckDB reads their footers)
        _bind_scan(con, files)
        if read_only:
            lock_down(con, directory)
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


READ_ONLY_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})
"""What a read-only query may run: queries (``SELECT``, ``FROM``, ``DESCRIBE``, ``SHOW``,
``SUMMARIZE``, ``VALUES`` parse as SELECT) and ``EXPLAIN``; not COPY, ATTACH, CREATE, SET, ..."""


def lock_down(con: duckdb.DuckDBPyConnection, directory: str | os.PathLike) -> None:
    """From now on ``con`` reads files only below ``directory`` (the views' files, and any
    ``read_parquet`` of them): every other path, URL, ``COPY ... TO``, ``ATTACH`` and extension
    load is a ``PermissionException``, and the configuration is locked so SQL cannot undo it.
    Writing below ``directory`` is still possible through the connection itself; a caller running
    user SQL refuses anything but a query first (:func:`check_read_only`)."""
    root = os.path.join(os.path.abspath(os.fspath(directory)), "")  # trailing "/": not a name prefix
    con.execute(f"SET allowed_directories = [{literal(root)}]")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def check_read_only(sql: str) -> None:
    """Raise :class:`StoreError` unless every statement of ``sql`` is a query
    (:data:`READ_ONLY_STATEMENTS`); a syntax error is left to the query to report."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error:
        return
    for statement in statements:
        if statement.type not in READ_ONLY_STATEMENTS:
            kind = statement.type.name.replace("_STATEMENT", "").replace("_", " ")
            raise StoreError(f"read-only: only queries (SELECT, EXPLAIN) may run, not {kind}")


def _create_views(con: duckdb.DuckDBPyConnection) -> None:
    for view in VIEWS:
        con.execute(view.create())


def refresh(
    con: duckdb.DuckDBPyConnection, directory: str | os.PathLike | None = None, *, allow_empty: bool | None = None
) -> None:
    """Re-list the directory (by default the one ``con`` was opened on) so the views see the
    files written, rolled and removed since."""
    ((src_dir, src_empty, index),) = con.execute(f"SELECT directory, allow_empty, scan_index FROM {SOURCE}").fetchall()
    directory = os.fspath(directory) if directory is not None else src_dir
    empty = src_empty if allow_empty is None else allow_empty
    _retrying(lambda: _bind_scan(con, _bind(con, directory, empty, index)))


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
