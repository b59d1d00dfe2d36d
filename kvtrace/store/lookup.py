"""Per-file lookups beside the scan index: the sessions a trace file names, where each of its trace
parts lies in time, and its facets, so that a one-session or one-day question finds the time bounds
it needs, and the dashboard its facets, from a few small files instead of every raw span.

A trace file's lookups are written with its scan index (:mod:`kvtrace.store.scan_index`, same
directory, same key, so they go stale and are swept with it), six small Parquet files:

- ``<file>.<key>.kvsess``: ``(session_id, trace_id)`` for every span naming a session (any
  convention's attribute, :data:`kvtrace.semconv.SESSION_ATTRIBUTES`, each value a row), distinct;
- ``<file>.<key>.kvtrc``: ``(trace_id, lo, hi)``, the first start and last end (epoch ns) of each
  trace's spans in that file (a *part*: a trace may span files);
- ``<file>.<key>.kvfacet``: spans, first start and last end per (service, substrate);
- ``<file>.<key>.kvreq``: ``(request_id, lo, hi)``, the first start and last end of the spans naming
  each request id (``gen_ai.request.id``) in that file (and of each retention span naming none), so a
  time range's KV reuse and retention questions find the whole of every request they select
  (:func:`kvtrace.store.bounds.requests_bounds`);
- ``<file>.<key>.kvpre`` and ``.kvd2p``: P's prefill spans and the ``d2p`` transfers, a few columns
  each (:data:`PREFILLS_COLUMNS`, :data:`D2P_COLUMNS`): what the whole store's prefill rates and the
  transfer cost fit are computed from (:mod:`kvtrace.analysis.reuse`), so a bounded question still
  prices recompute at the store's rates without reading its raw spans.

They merge at query time because each is a set of rows or a min / max: a session's traces are the
union over files, a trace's (or a request's) bounds the min / max over its parts, the store's facets
the union and sums of the files', the prefills and transfers the union of the files' rows.  The
reader (:func:`kvtrace.store.reader.connect`) defines each view (:data:`KINDS`) as the union of the
lookups of the files that have them and the same SQL over the raw rows of the files that do not
(small ones, new ones, ``scan_index=False``), so an answer never depends on which files are indexed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import duckdb

from kvtrace import semconv as sc
from kvtrace.store.sql import literal, str_attr
from kvtrace.store.views.raw import RAW, spans_sql
from kvtrace.store.views.spans import ENGINE_REQUESTS, KV_TRANSFERS

SESSIONS, TRACES, FACETS = "kvtrace_lookup_sessions", "kvtrace_lookup_traces", "kvtrace_file_facets"
"""The views over every file's lookups (module doc)."""
GENERATION = "kvtrace_lookup_generation"
"""A one-row table of a fresh id each time :func:`bind` (re)defines the views: what is computed from
them alone (a question's bounds, the store's prefill rates) may be kept while it holds the same id
(:func:`kept`)."""
REQUESTS, PREFILLS, D2P = "kvtrace_lookup_requests", "kvtrace_lookup_prefills", "kvtrace_lookup_d2p"
"""The views over every file's request bounds, prefill spans and d2p transfers (module doc)."""
PREFILLS_COLUMNS = "request_id, engine_id, prompt_tokens, cached_tokens, duration_ms"
"""Of ``engine_requests``' prefill rows: what a prefill rate reads."""
D2P_COLUMNS = "request_id, engine_id, status, tokens, duration_ms"
"""Of ``kv_transfers``' d2p rows: what a prefill rate (its transfer time) and the transfer cost fit read."""

_NAMED = ", ".join(str_attr(a) for a in sc.SESSION_ATTRIBUTES)
# what each lookup is over a relation ``{raw}`` with the raw columns (one file's, or several files')
SESSIONS_SQL = f"""
SELECT DISTINCT session_id, TraceId AS trace_id
FROM (SELECT TraceId, unnest([{_NAMED}]) AS session_id FROM {{raw}}) AS n
WHERE session_id IS NOT NULL AND session_id <> ''
"""
TRACES_SQL = """
SELECT TraceId AS trace_id, min(epoch_ns(Timestamp)) AS lo, max(epoch_ns(Timestamp) + Duration) AS hi
FROM {raw} GROUP BY TraceId
"""
FACETS_SQL = """
SELECT service_name, substrate, count(*) AS spans, min(start_ns) AS start_ns, max(end_ns) AS end_ns
FROM ({spans}) AS s GROUP BY service_name, substrate
"""
# a retention span naming no request is a unit of its own, keyed '#' + its span id (a request id spelt
# the same would only widen both bounds), so the retention page's rows, which overlap a range rather
# than start in it, are read whole too
REQUESTS_SQL = f"""
SELECT coalesce(nullif(request_id, ''), '#' || span_id) AS request_id, min(start_ns) AS lo, max(end_ns) AS hi
FROM ({{spans}}) AS s
WHERE (request_id IS NOT NULL AND request_id <> '') OR name = {literal(sc.SPAN_KV_RETENTION)}
GROUP BY 1
"""
# the rows of the views themselves (their SELECT over a ``spans`` of the file's raw rows), so a
# lookup's row is the view's row, whatever the views come to extract
PREFILLS_SQL = f"""
WITH spans AS ({{spans}})
SELECT {PREFILLS_COLUMNS} FROM ({ENGINE_REQUESTS.select}) AS e WHERE phase = {literal(sc.ROLE_PREFILL)}
"""
D2P_SQL = f"""
WITH spans AS ({{spans}})
SELECT {D2P_COLUMNS} FROM ({KV_TRANSFERS.select}) AS x WHERE direction = {literal(sc.DIRECTION_D2P)}
"""
_OVER_SPANS = {FACETS: FACETS_SQL, REQUESTS: REQUESTS_SQL, PREFILLS: PREFILLS_SQL, D2P: D2P_SQL}

# (view, file suffix, columns)
KINDS = (
    (SESSIONS, ".kvsess", "session_id, trace_id"),
    (TRACES, ".kvtrc", "trace_id, lo, hi"),
    (REQUESTS, ".kvreq", "request_id, lo, hi"),
    (PREFILLS, ".kvpre", PREFILLS_COLUMNS),
    (D2P, ".kvd2p", D2P_COLUMNS),
    (FACETS, ".kvfacet", "service_name, substrate, spans, start_ns, end_ns"),
)
SUFFIXES = tuple(suffix for _, suffix, _ in KINDS)
FACETS_SUFFIX = dict((view, suffix) for view, suffix, _ in KINDS)[FACETS]


def sql(view: str, raw: str) -> str:
    """The lookup ``view`` over relation ``raw`` (raw columns)."""
    if view == SESSIONS:
        return SESSIONS_SQL.format(raw=raw)
    if view == TRACES:
        return TRACES_SQL.format(raw=raw)
    return _OVER_SPANS[view].replace("{spans}", spans_sql(raw))


COPY_OPTIONS = "(FORMAT parquet, COMPRESSION zstd, PARQUET_VERSION V2)"
"""How every file beside a trace file is written (the scan index, the lookups, the partials):
Parquet's version 2 encodings (delta for the sorted times and ids) make them 3 to 14 times smaller
than version 1's, written and read as fast (docs/benchmarks.md); only kvtrace's DuckDB reads them."""


def copy_sql(view: str, raw: str, target: str) -> str:
    """``COPY`` of one file's lookup ``view`` to ``target`` (a quoted path)."""
    return f"COPY ({sql(view, raw)}) TO {target} {COPY_OPTIONS}"


VERSION_TEXT = SESSIONS_SQL + TRACES_SQL + "".join(_OVER_SPANS.values()) + repr(KINDS) + COPY_OPTIONS
"""What the lookups' rows depend on (part of the index key: :data:`kvtrace.store.scan_index.VERSION`)."""

# Questions answered from the lookups (bound parameters only).  A session's bounds: the first start
# and last end of every part of every trace naming it (the same rows kvtrace.store.bounds reads from
# the raw spans).  A time range's: those of every session whose traces' hull overlaps it (a superset of
# the sessions whose window does: a window lies within its traces), so every such session is read whole.
SESSION_BOUNDS_SQL = f"""
SELECT min(lo) AS lo, max(hi) AS hi FROM {TRACES}
WHERE trace_id IN (SELECT trace_id FROM {SESSIONS} WHERE session_id = $sid)
"""
WINDOW_BOUNDS_SQL = f"""
WITH t AS (SELECT trace_id, min(lo) AS lo, max(hi) AS hi FROM {TRACES} GROUP BY trace_id),
s AS (
    SELECT n.session_id, min(t.lo) AS lo, max(t.hi) AS hi
    FROM (SELECT DISTINCT session_id, trace_id FROM {SESSIONS}) AS n JOIN t USING (trace_id)
    GROUP BY n.session_id
)
SELECT min(lo) AS lo, max(hi) AS hi FROM s WHERE hi >= $lo AND lo <= $hi
"""
# The requests a time range (or a session's bounds) can select rows of, and the first start and last
# end of all their spans: every span naming one of them starts inside (kvtrace.store.bounds.requests_bounds).
REQUESTS_BOUNDS_SQL = f"""
SELECT min(lo) AS lo, max(hi) AS hi
FROM (SELECT request_id, min(lo) AS lo, max(hi) AS hi FROM {REQUESTS} GROUP BY request_id) AS r
WHERE hi >= $lo AND lo <= $hi
"""
STORE_FACETS_SQL = f"""
SELECT list(DISTINCT service_name ORDER BY service_name) FILTER (WHERE service_name IS NOT NULL AND service_name <> '')
           AS services,
       list(DISTINCT substrate ORDER BY substrate) FILTER (WHERE substrate IS NOT NULL) AS substrates,
       min(start_ns) AS start_ns, max(end_ns) AS end_ns, COALESCE(sum(spans), 0)::BIGINT AS spans
FROM {FACETS}
"""


_UNLOOKED = "kvtrace_raw_unlooked"  # the raw rows of the files without lookups (no Timestamp bounds)


def loaded(view: str) -> str:
    """The table :func:`bind` loads the lookup files of ``view`` into (the facets' with each row's
    ``filename``: :mod:`kvtrace.store.narrow` takes each file's range from it)."""
    return f"{view}_loaded"


def bind(con, found: dict[str, list[str]], rest: list[str]) -> None:
    """(Re)define :data:`SESSIONS`, :data:`TRACES` and :data:`FACETS` on ``con``: the rows of the
    lookup files ``found[view]`` and the same SQL over the raw rows of the trace files ``rest``
    (those without a complete set of lookups).  The lookup files are read once, here, into tables
    (:func:`loaded`): a question then reads a few narrow in-memory columns, not hundreds of small
    files (their number grows with the history kept; their rows are a small fraction of the spans)."""
    from kvtrace.store.sql import glob_escape
    from kvtrace.store.views.raw import READ_FILES

    if rest:
        con.sql(READ_FILES, params={"files": [glob_escape(f) for f in rest]}).create_view(_UNLOOKED, replace=True)
    for view, _, columns in KINDS:
        parts = []
        if found.get(view):
            kept = f"{columns}, filename" if view == FACETS else columns
            con.execute(
                f"CREATE OR REPLACE TABLE {loaded(view)} AS SELECT {kept} "
                "FROM read_parquet($lookups, hive_partitioning = false, filename = true)",
                {"lookups": [glob_escape(f) for f in found[view]]},
            )
            parts.append(f"SELECT {columns} FROM {loaded(view)}")
        else:
            con.execute(f"DROP TABLE IF EXISTS {loaded(view)}")
        if rest or not parts:  # no file at all: the (empty) raw relation gives the columns
            parts.append(f"SELECT {columns} FROM ({sql(view, _UNLOOKED if rest else RAW)}) AS r")
        con.execute(f"CREATE OR REPLACE VIEW {view} AS {' UNION ALL '.join(parts)}")
    con.execute(f"CREATE OR REPLACE TABLE {GENERATION} AS SELECT uuid()::VARCHAR AS generation")


def generation(con) -> str | None:
    """The id of ``con``'s lookups as :func:`bind` last defined them (:data:`GENERATION`); None for a
    connection that has none (not a store's).  A ClickHouse store gives its own
    (:meth:`kvtrace.store.clickhouse.store.ClickHouseStore.generation`: its tables' parts)."""
    own = getattr(con, "generation", None)
    if own is not None:
        return own()
    try:
        rows = con.execute(f"SELECT generation FROM {GENERATION}").fetchall()
    except duckdb.CatalogException:
        return None
    return rows[0][0] if rows else None


T = TypeVar("T")
# (generation, key) -> value, oldest first; the dashboard's script threads share it
_KEPT: dict[tuple, object] = {}
_KEEP = 256
_KEPT_LOCK = threading.Lock()


def kept(con, key: tuple, compute: Callable[[], T]) -> T:
    """``compute()``, computed once per generation of ``con``'s lookups and ``key`` (hashable) and kept
    (the last :data:`_KEEP`); computed every time on a connection that has none.  ``compute`` must read
    the lookups only (no raw span, nothing a cursor's bounds change), and its value must not be mutated."""
    gen = generation(con)
    if gen is None:
        return compute()
    k = (gen, *key)
    with _KEPT_LOCK:
        if k in _KEPT:
            return _KEPT[k]  # type: ignore[return-value]
    value = compute()
    with _KEPT_LOCK:
        while len(_KEPT) >= _KEEP:
            _KEPT.pop(next(iter(_KEPT)))
        _KEPT[k] = value
    return value
