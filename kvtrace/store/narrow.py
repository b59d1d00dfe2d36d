"""A bounded cursor reads only the files its bounds can touch, so what it costs follows the bounds,
not the number of files the store has kept.

The views read their files through lists held in DuckDB variables when set
(``read_parquet(COALESCE(getvariable('kvtrace_files'), $files))``): unset (every connection), the
whole list bound when the view was made; set on a cursor (:func:`narrow`, which
:func:`kvtrace.store.bounds.bounded` calls), only the files whose spans can start within the
bounds.  A file's range is its first span start and last span end, from its facets lookup
(:mod:`kvtrace.store.lookup`; a superset of where its spans start); a file without one is always
kept.  The ``Timestamp`` bounds still filter the rows, so the answer is the same: narrowing only
spares DuckDB opening files whose statistics would have excluded them anyway.
"""

from __future__ import annotations

from kvtrace.store import lookup
from kvtrace.store.sql import literal

FILES, INDEXES, REST = "kvtrace_files", "kvtrace_indexes", "kvtrace_rest"
"""The variables: trace files (the raw relation), scan indexes, trace files without an index."""
RANGES = "kvtrace_file_ranges"
"""Table of (list, path, lo, hi): each listed path with its file's range (NULL: unknown, always read)."""


def listed(var: str, param: str) -> str:
    """The list expression a view reads its files from: the cursor's ``var``, else ``param``."""
    return f"COALESCE(getvariable({literal(var)}), {param})"


def record(con, entries: list[tuple[str, str, str]], facets: dict[str, str]) -> None:
    """(Re)create :data:`RANGES` on ``con`` from ``entries`` (list variable, path as listed, the
    trace file it reads) and ``facets`` (trace file -> its facets lookup, already loaded by
    :func:`kvtrace.store.lookup.bind`)."""
    con.execute(f"CREATE OR REPLACE TABLE {RANGES} (list VARCHAR, path VARCHAR, lo BIGINT, hi BIGINT)")
    ranges: dict[str, tuple[int, int]] = {}
    if facets:
        by_lookup = {v: k for k, v in facets.items()}
        rows = con.execute(
            f"SELECT filename, min(start_ns), max(end_ns) FROM {lookup.loaded(lookup.FACETS)} GROUP BY filename"
        ).fetchall()
        ranges = {by_lookup[f]: (lo, hi) for f, lo, hi in rows if f in by_lookup and lo is not None}
    rows = [(var, path, *ranges.get(file, (None, None))) for var, path, file in entries]
    if rows:
        con.executemany(f"INSERT INTO {RANGES} VALUES (?, ?, ?, ?)", rows)


def narrow(cur, lo_ns: int, hi_ns: int) -> None:
    """Set ``cur``'s file lists to the files whose range overlaps ``[lo_ns, hi_ns]`` (module doc).
    A list left with no file keeps its first: read_parquet needs one, and the bounds filter its rows."""
    rows = cur.execute(
        f"SELECT list, list(path ORDER BY rowid) FILTER (WHERE lo IS NULL OR (hi >= $lo AND lo <= $hi)), "
        f"first(path ORDER BY rowid) FROM {RANGES} GROUP BY list",
        {"lo": int(lo_ns), "hi": int(hi_ns)},
    ).fetchall()
    for var, paths, first in rows:
        cur.execute(f"SET VARIABLE {var} = $v::VARCHAR[]", {"v": paths or [first]})
