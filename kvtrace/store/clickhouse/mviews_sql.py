"""The SQL of kvtrace's materialized tables on an ``otel_traces`` table (:mod:`.mviews` manages
them): the tables, the materialized views that fill them on every insert, the backfill, and what the
store reads from them.

Four tables, each fed by a ``MATERIALIZED VIEW ... TO`` it (``<target>_mv``), so every insert
shapes its own spans and nothing runs on the exporter's request path beyond ClickHouse's insert:

- ``<table>_kvtrace_scan`` (MergeTree, a partition per day, sorted by ``start_ns``): the breakdown's
  classified rows, the ``kvtrace_scan`` view's (:data:`kvtrace.store.views.agents.SCAN_SQL`) columns,
  computed by the same transpiled SQL: that view is a projection and filter of one span at a time, so
  its rows over each insert are its rows over the table.  Every row keeps its span's ``TraceId`` /
  ``SpanId`` (for the backfill, which skips spans the view already shaped, and for a bloom filter on
  the trace), so the view's ``trace_id`` / ``span_id`` (the same ids, on the rows that need them) are
  not stored but derived on read (:func:`scan_read_sql`), and the table keeps ClickHouse's default
  codec (LZ4): both for the writer, whose every insert computes and compresses these rows
  (docs/benchmarks.md, "Where the scan view's cost goes");
- ``<table>_kvtrace_sessions`` (ReplacingMergeTree, sorted by session): ``(SessionId, TraceId)`` for
  every span naming a session in any convention's attribute (:data:`kvtrace.semconv.SESSION_ATTRIBUTES`);
- ``<table>_kvtrace_traces`` (AggregatingMergeTree, by trace): first span start and last span end;
- ``<table>_kvtrace_windows`` (AggregatingMergeTree, by session and trace): the first start and last
  end of the spans that delimit a session's window (kvtrace's session and request spans and every
  trace's root, the session the first present of the conventions' attributes: what
  :meth:`.store.ClickHouseStore.window_bounds` reads on the raw table);
- ``<table>_kvtrace_requests`` (AggregatingMergeTree, by request): the first start and last end of the
  spans naming each request id, and of each retention span naming none (keyed ``#`` + its span id): the
  DuckDB requests lookup's rows (:data:`kvtrace.store.lookup.REQUESTS_SQL`), so a KV reuse question finds
  the whole of every request it selects (:meth:`.store.ClickHouseStore.requests_bounds`);
- ``<table>_kvtrace_prefills`` and ``<table>_kvtrace_d2p`` (MergeTree): P's prefill rows of the
  ``engine_requests`` view and the d2p rows of ``kv_transfers``, the columns a prefill rate reads
  (:data:`kvtrace.store.lookup.PREFILLS_COLUMNS`, ``D2P_COLUMNS``) and the span's ids (for the
  backfill): the whole table's prefill rates are computed from them, not from its spans
  (:mod:`kvtrace.analysis.reuse`).  Both views are projections and filters of one span at a time.

The small aggregating ones hold partial aggregates (min / max, distinct pairs) that merge across
inserts and parts, and their readers aggregate again, so a row repeated (a backfill rerun) changes
nothing; the backfill of the others skips spans already shaped.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store import lookup
from kvtrace.store.clickhouse import ddl
from kvtrace.store.clickhouse.dialect import SETTINGS
from kvtrace.store.sql import CLICKHOUSE, ident, literal
from kvtrace.store.views.agents import SCAN, SCAN_COLUMNS, SCAN_KEEPS_TRACE, scan_ids

SCAN_T, SESSIONS, TRACES, WINDOWS = "_kvtrace_scan", "_kvtrace_sessions", "_kvtrace_traces", "_kvtrace_windows"
REQUESTS, PREFILLS, D2P = "_kvtrace_requests", "_kvtrace_prefills", "_kvtrace_d2p"
MV = "_mv"
TARGETS = (SCAN_T, SESSIONS, TRACES, WINDOWS, REQUESTS, PREFILLS, D2P)


def target(table: str, suffix: str) -> str:
    return table + suffix


def _a(name: str) -> str:
    return f"SpanAttributes[{literal(name, CLICKHOUSE)}]"


# a span's session ids: each convention's attribute, when present and not empty
_SESSION_IDS = "arrayDistinct(arrayFilter(s -> s != '', [{}]))".format(", ".join(_a(a) for a in sc.SESSION_ATTRIBUTES))
# the session a span names: the first present of the conventions' attributes ('' for none)
_OTHER = [a for a in sc.SESSION_ATTRIBUTES if a not in (sc.SESSION_ID, sc.GEN_AI_CONVERSATION_ID)]
SESSION_EXPR = "multiIf({first} != '', {first}, {rest}, '')".format(
    first=ddl.SESSION_ID_EXPR,
    rest=", ".join(f"mapContains(SpanAttributes, {literal(a, CLICKHOUSE)}), {_a(a)}" for a in _OTHER),
)
# the spans that define a session's window (the ``sessions`` view: agent session spans, else requests; and
# every trace's root, where another convention's agent names its session)
WINDOW_SPANS = "SpanName IN ({}) OR ParentSpanId = ''".format(
    ", ".join(literal(n, CLICKHOUSE) for n in (sc.SPAN_AGENT_SESSION, sc.SPAN_PROXY_REQUEST))
)
_START = "toUnixTimestamp64Nano(Timestamp)"
_END = "toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)"

# every span, an empty trace id too (invalid, but the raw path reads it: the store must not differ)
_SESSIONS_SELECT = f"SELECT DISTINCT arrayJoin({_SESSION_IDS}) AS SessionId, TraceId FROM {{src}}"
_TRACES_SELECT = f"SELECT TraceId, min({_START}) AS Start, max({_END}) AS End FROM {{src}} GROUP BY TraceId"
# (``s``, not ``SessionId``: with kvtrace's recommended DDL the table has a ``SessionId`` column, which
# kvtrace's settings would read in place of an alias of that name)
_WINDOWS_SELECT = (
    f"SELECT s AS SessionId, TraceId, min({_START}) AS Start, max({_END}) AS End FROM "
    f"(SELECT {SESSION_EXPR} AS s, TraceId, Timestamp, Duration FROM {{src}} WHERE {WINDOW_SPANS}) "
    "WHERE s != '' GROUP BY s, TraceId"
)


def _settings(extra: dict | None = None) -> str:
    """A SELECT's SETTINGS clause: an MV's SELECT runs with the inserting session's settings (the
    exporter's defaults), so it carries kvtrace's (DuckDB's semantics, :data:`.dialect.SETTINGS`);
    aggregates into a target keep their non-Nullable types (``aggregate_functions_null_for_empty = 0``)."""
    merged = {**SETTINGS, **(extra or {})}
    listed = (f"{k} = {literal(v, CLICKHOUSE) if isinstance(v, str) else v}" for k, v in merged.items())
    return " SETTINGS " + ", ".join(listed)


_AGG = _settings({"aggregate_functions_null_for_empty": 0})

_SCAN_TYPES = {
    "role": "Nullable(String)",
    "convention": "LowCardinality(Nullable(String))",
    "fgn": "UInt8",
    "nt": "UInt8",
    "session_id": "Nullable(String)",
    "turn": "Nullable(Int32)",
    "start_ns": "Int64",
    "end_ns": "Int64",
    "trace_id": "Nullable(String)",
    "span_id": "Nullable(String)",
    "request_id": "Nullable(String)",
    "ttft_ms": "Nullable(Float64)",
    "kv_byte_s": "Nullable(Float64)",
}
assert tuple(_SCAN_TYPES) == tuple(c.strip() for c in SCAN_COLUMNS.split(","))  # the view's columns, in order
_IDS = ("TraceId", "SpanId")
# the view's columns read off the span's ids instead of stored (each a CASE that is standard SQL)
_DERIVED = dict(zip(("trace_id", "span_id"), scan_ids(*_IDS), strict=True))
SCAN_STORED = {n: ty for n, ty in _SCAN_TYPES.items() if n not in _DERIVED}
"""The scan table's columns besides the ids, and their ClickHouse types."""


def scan_select(table: str, where: str = "") -> str:
    """The classified rows of ``table``'s spans (``where``: on its columns) as the scan table stores
    them, with ``TraceId`` and ``SpanId``: the ``kvtrace_scan`` view as :mod:`.store` transpiles it,
    the raw relation keeping the two ids, less the columns derived from them."""
    from kvtrace.store.clickhouse.statement import assemble  # statement imports this module

    cols = ", ".join((*SCAN_STORED, *_IDS))
    return assemble(f"SELECT {cols} FROM {SCAN}", (), table, False, raw_where=where, keep_ids=True)


# The DuckDB store's requests, prefills and d2p lookups (kvtrace.store.lookup), as DuckDB SQL over kvtrace's
# views (transpiled like the scan view's), the row tables with their spans' ids (the backfill's key)
_REQUESTS_ROWS = lookup.REQUESTS_SQL.replace("{spans}", "SELECT * FROM spans")
_ROWS = {
    PREFILLS: (
        f"trace_id, span_id, {lookup.PREFILLS_COLUMNS}",
        f"engine_requests WHERE phase = {literal(sc.ROLE_PREFILL)}",
    ),
    D2P: (f"trace_id, span_id, {lookup.D2P_COLUMNS}", f"kv_transfers WHERE direction = {literal(sc.DIRECTION_D2P)}"),
}
_ROW_TYPES = {
    PREFILLS: "prompt_tokens Nullable(Int64), cached_tokens Nullable(Int64), duration_ms Float64",
    D2P: "status Nullable(String), tokens Nullable(Int64), duration_ms Float64",
}
_ROW_IDS = ", ".join(f"{c} Nullable(String)" for c in ("trace_id", "span_id", "request_id", "engine_id"))


def _views_select(table: str, sql: str, where: str = "") -> str:
    """DuckDB ``sql`` over kvtrace's views as a ClickHouse ``SELECT`` over ``table`` (``where``: on its
    columns), as :mod:`.store` transpiles every question."""
    from kvtrace.store.clickhouse.statement import assemble  # statement imports this module

    return assemble(sql, (), table, False, raw_where=where)


def rows_select(table: str, kind: str, where: str = "") -> str:
    """The rows of the ``kind`` table (:data:`PREFILLS` or :data:`D2P`) over ``table``'s spans."""
    cols, source = _ROWS[kind]
    return _views_select(table, f"SELECT {cols} FROM {source}", where)


def requests_select(table: str, where: str = "") -> str:
    """The requests table's rows (partial min / max) over ``table``'s spans."""
    return _views_select(table, _REQUESTS_ROWS, where)


def ddl_statements(table: str, comment: str, pending: str, only: tuple[str, ...] = TARGETS) -> list[str]:
    """CREATE statements (targets with comment ``pending``, then views with ``comment``), each
    ``IF NOT EXISTS``; ``only``: of these targets (and their views)."""
    src, c, b = ident(table), literal(comment, CLICKHOUSE), literal(pending, CLICKHOUSE)
    t = {s: ident(target(table, s)) for s in TARGETS}
    cols = ",\n    ".join(f"{n} {ty}" for n, ty in SCAN_STORED.items())
    ids = ",\n    ".join(f"{n} String" for n in _IDS)
    tables = {
        SCAN_T: f"CREATE TABLE IF NOT EXISTS {t[SCAN_T]} (\n    {cols},\n    {ids},\n"
        "    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1\n) ENGINE = MergeTree\n"
        "PARTITION BY toDate(fromUnixTimestamp64Nano(start_ns))\nORDER BY start_ns\n"
        f"COMMENT {b}",
        SESSIONS: f"CREATE TABLE IF NOT EXISTS {t[SESSIONS]} (\n    SessionId String CODEC(ZSTD(1)),\n"
        "    TraceId String CODEC(ZSTD(1))\n) ENGINE = ReplacingMergeTree\nORDER BY (SessionId, TraceId)\n"
        f"COMMENT {b}",
        TRACES: f"CREATE TABLE IF NOT EXISTS {t[TRACES]} (\n    TraceId String CODEC(ZSTD(1)),\n"
        "    Start SimpleAggregateFunction(min, Int64),\n    End SimpleAggregateFunction(max, Int64)\n"
        f") ENGINE = AggregatingMergeTree\nORDER BY TraceId\nCOMMENT {b}",
        WINDOWS: f"CREATE TABLE IF NOT EXISTS {t[WINDOWS]} (\n    SessionId String CODEC(ZSTD(1)),\n"
        "    TraceId String CODEC(ZSTD(1)),\n    Start SimpleAggregateFunction(min, Int64),\n"
        "    End SimpleAggregateFunction(max, Int64)\n"
        f") ENGINE = AggregatingMergeTree\nORDER BY (SessionId, TraceId)\nCOMMENT {b}",
        REQUESTS: f"CREATE TABLE IF NOT EXISTS {t[REQUESTS]} (\n    request_id String CODEC(ZSTD(1)),\n"
        "    lo SimpleAggregateFunction(min, Int64),\n    hi SimpleAggregateFunction(max, Int64)\n"
        f") ENGINE = AggregatingMergeTree\nORDER BY request_id\nCOMMENT {b}",
        **{
            kind: f"CREATE TABLE IF NOT EXISTS {t[kind]} ({_ROW_IDS}, {_ROW_TYPES[kind]}) ENGINE = MergeTree\n"
            f"ORDER BY tuple()\nCOMMENT {b}"
            for kind in (PREFILLS, D2P)
        },
    }
    views = _mv_selects(src, table)
    return [tables[s] for s in only] + [
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {ident(target(table, s) + MV)} TO {t[s]}\nAS {views[s]}\nCOMMENT {c}"
        for s in only
    ]


def _mv_selects(src: str, table: str) -> dict[str, str]:
    return {
        SCAN_T: scan_select(table) + _settings(),
        SESSIONS: _SESSIONS_SELECT.format(src=src) + _AGG,
        TRACES: _TRACES_SELECT.format(src=src) + _AGG,
        WINDOWS: _WINDOWS_SELECT.format(src=src) + _AGG,
        REQUESTS: requests_select(table) + _AGG,
        PREFILLS: rows_select(table, PREFILLS) + _settings(),
        D2P: rows_select(table, D2P) + _settings(),
    }


def day_filter(day: str) -> str:
    """Source spans of UTC day ``day`` (``YYYY-MM-DD``, a constant): one partition of the table."""
    d = literal(day, CLICKHOUSE)
    return f"Timestamp >= toDateTime64({d}, 9, 'UTC') AND Timestamp < toDateTime64({d}, 9, 'UTC') + INTERVAL 1 DAY"


def backfill_statements(table: str, day: str, only: tuple[str, ...] = TARGETS) -> list[str]:
    """INSERT ... SELECT of day ``day``'s spans already in ``table``: the classified, prefill and d2p
    rows of the spans those views have not shaped yet (by trace and span id; the views already see new
    inserts), the lookups' rows of all (repeats change nothing); ``only``: into these targets."""
    where = day_filter(day)
    scan = ident(target(table, SCAN_T))
    fresh = f"({where}) AND (TraceId, SpanId) NOT IN (SELECT TraceId, SpanId FROM {scan})"
    src = f"(SELECT * FROM {ident(table)} WHERE {where})"
    cols = ", ".join((*SCAN_STORED, *_IDS))
    into = {s: ident(target(table, s)) for s in TARGETS}
    statements = {
        SCAN_T: f"INSERT INTO {scan} ({cols}) {scan_select(table, fresh)}{_settings()}",
        SESSIONS: f"INSERT INTO {into[SESSIONS]} (SessionId, TraceId) {_SESSIONS_SELECT.format(src=src)}{_AGG}",
        TRACES: f"INSERT INTO {into[TRACES]} (TraceId, Start, End) {_TRACES_SELECT.format(src=src)}{_AGG}",
        WINDOWS: f"INSERT INTO {into[WINDOWS]} (SessionId, TraceId, Start, End) "
        f"{_WINDOWS_SELECT.format(src=src)}{_AGG}",
        REQUESTS: f"INSERT INTO {into[REQUESTS]} (request_id, lo, hi) {requests_select(table, where)}{_AGG}",
        **{
            kind: f"INSERT INTO {into[kind]} ({_ROWS[kind][0]}) "
            f"{rows_select(table, kind, _unshaped(table, kind, where))}{_settings()}"
            for kind in (PREFILLS, D2P)
        },
    }
    return [statements[s] for s in only]


def _unshaped(table: str, kind: str, where: str) -> str:
    """``where``, and the span not in the ``kind`` table yet (by its ids, which the views keep as they are
    on every span those tables hold)."""
    return f"({where}) AND (TraceId, SpanId) NOT IN (SELECT trace_id, span_id FROM {ident(target(table, kind))})"


def days_sql(table: str) -> str:
    """The UTC days (``YYYY-MM-DD``) the table holds spans of: its partitions (``system.parts``)."""
    return (
        "SELECT DISTINCT toString(toDate(min_time)) AS day FROM system.parts "
        f"WHERE {_in_database(table)} AND table = {literal(short_name(table), CLICKHOUSE)} AND active ORDER BY day"
    )


def parts_sql(table: str) -> str:
    """A fingerprint of the active parts of ``table`` and its targets (``system.parts``): how many, their
    rows and the XOR of their names' hashes.  Every insert, merge or mutation makes new parts, so it
    changes whenever what the tables hold may have changed."""
    names = ", ".join(literal(short_name(n), CLICKHOUSE) for n in [table, *(target(table, s) for s in TARGETS)])
    return (
        "SELECT count() AS parts, sum(rows) AS rows, groupBitXor(cityHash64(name, table)) AS names "
        f"FROM system.parts WHERE active AND {_in_database(table)} AND table IN ({names})"
    )


def short_name(table: str) -> str:
    """``table`` without its database."""
    return table.rsplit(".", 1)[-1]


def _in_database(table: str) -> str:
    """A ``system`` table's rows of ``table``'s database (its own, else the current one)."""
    db = table.rsplit(".", 1)[0] if "." in table else None
    return f"database = {literal(db, CLICKHOUSE)}" if db else "database = currentDatabase()"


def objects(table: str) -> list[str]:
    """Every object's name (targets, then views)."""
    return [target(table, s) for s in TARGETS] + [target(table, s) + MV for s in TARGETS]


def drop_statements(table: str) -> list[str]:
    """DROP of every object, views first (nothing else is touched)."""
    views = [f"DROP VIEW IF EXISTS {ident(target(table, s) + MV)}" for s in TARGETS]
    return views + [f"DROP TABLE IF EXISTS {ident(target(table, s))}" for s in TARGETS]


def mark_statements(table: str, comment: str, only: tuple[str, ...] = TARGETS, views: bool = False) -> list[str]:
    """The targets' comment set to ``comment`` (the tables are complete); ``views``: their views' too
    (an older set upgraded in place, :func:`.mviews.init`)."""
    c = literal(comment, CLICKHOUSE)
    names = [target(table, s) for s in only] + ([target(table, s) + MV for s in only] if views else [])
    return [f"ALTER TABLE {ident(n)} MODIFY COMMENT {c}" for n in names]


# ------------------------------------------------------------------------------------- reads


def scope_sql(table: str, param: str) -> str:
    """The trace ids of the session bound as ``{param:String}`` (a subquery on the lookup)."""
    return f"SELECT TraceId FROM {ident(target(table, SESSIONS))} WHERE SessionId = {{{param}:String}}"


def bounds_sql(table: str, param: str) -> str:
    """``lo`` / ``hi`` (first start, last end, epoch ns; NULL: no such session) of the session's traces."""
    return (
        f"SELECT min(Start) AS lo, max(End) AS hi FROM {ident(target(table, TRACES))} "
        f"WHERE TraceId IN ({scope_sql(table, param)})"
    )


def time_span_sql(table: str) -> str:
    """``start_ns`` / ``end_ns`` / ``spans`` of the whole table: the traces table's first start and
    last end (a row per trace) and the table's count (ClickHouse answers it from its parts' metadata),
    instead of reading every span's ``Timestamp`` and ``Duration``."""
    traces = ident(target(table, TRACES))
    return (
        f"SELECT (SELECT min(Start) FROM {traces}) AS start_ns, (SELECT max(End) FROM {traces}) AS end_ns, "
        f"(SELECT count() FROM {ident(table)}) AS spans"
    )


def window_bounds_sql(table: str, lo: bool, hi: bool) -> str:
    """``lo`` / ``hi`` of the traces of every session whose window overlaps ``[{lo}, {hi}]`` (each
    bound optional), from the windows and traces tables."""
    w = ident(target(table, WINDOWS))
    conds = ("max(End) >= {lo:Int64}" if lo else "", "min(Start) <= {hi:Int64}" if hi else "")
    having = " AND ".join(c for c in conds if c)
    chosen = f"SELECT SessionId FROM {w} GROUP BY SessionId" + (f" HAVING {having}" if having else "")
    traces = f"SELECT TraceId FROM {w} WHERE SessionId IN ({chosen})"
    return f"SELECT min(Start) AS lo, max(End) AS hi FROM {ident(target(table, TRACES))} WHERE TraceId IN ({traces})"


def scan_read_sql(table: str, bounded: bool, lo: str, hi: str, scope: str | None) -> str:
    """The ``kvtrace_scan`` relation read from the scan table: rows starting in ``[{lo}, {hi}]``
    when ``bounded``; ``scope`` (a session parameter): the session's traces' rows and every row
    carrying a trace id (those that can join a session by time or change a trace's session)."""
    conds = []
    if bounded:
        conds.append(f"start_ns >= {{{lo}:Int64}} AND start_ns <= {{{hi}:Int64}}")
    if scope is not None:
        conds.append(f"(TraceId IN ({scope_sql(table, scope)}) OR ({SCAN_KEEPS_TRACE}))")
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    cols = ", ".join(f"{_DERIVED[n]} AS {n}" if n in _DERIVED else n for n in _SCAN_TYPES)
    return f"SELECT {cols} FROM {ident(target(table, SCAN_T))}{where}"


def requests_bounds_sql(table: str) -> str:
    """``lo`` / ``hi`` of the spans of every request whose spans overlap ``[{lo}, {hi}]`` (the DuckDB
    store's :data:`kvtrace.store.lookup.REQUESTS_BOUNDS_SQL`, on the requests table)."""
    r = ident(target(table, REQUESTS))
    return (
        f"SELECT min(lo) AS lo, max(hi) AS hi FROM (SELECT request_id, min(lo) AS lo, max(hi) AS hi FROM {r} "
        "GROUP BY request_id) WHERE hi >= {lo:Int64} AND lo <= {hi:Int64}"
    )


def rows_relation(table: str, kind: str) -> str:
    """The ``kind`` table (:data:`PREFILLS` or :data:`D2P`) as the DuckDB relation a prefill rate reads
    (:data:`kvtrace.store.lookup.PREFILLS_COLUMNS` or ``D2P_COLUMNS``)."""
    cols = lookup.PREFILLS_COLUMNS if kind == PREFILLS else lookup.D2P_COLUMNS
    return f"(SELECT {cols} FROM {ident(target(table, kind))})"


def building(comment: str) -> str:
    """The targets' comment until the backfill completes (:mod:`.mviews` reads them only after)."""
    return f"{comment} (building)"


def sql_file(table: str, comment: str) -> str:
    """The DDL as one script (``collectors/clickhouse-kvtrace-views.sql``); the backfill is
    ``kvtrace clickhouse init`` (it runs per day, skipping spans already shaped)."""
    head = (
        f"-- kvtrace's materialized tables on the ClickHouse exporter's {table} table ({comment}).\n"
        "-- Generated from kvtrace/store/clickhouse/mviews_sql.py; `kvtrace clickhouse init` runs the same\n"
        "-- statements, then backfills the rows already in the table (a day at a time) and marks the tables\n"
        "-- complete (their COMMENT): kvtrace reads them only then. After running this script, e.g.\n"
        "--   clickhouse-client --database otel --multiquery < clickhouse-kvtrace-views.sql\n"
        "-- run `kvtrace clickhouse init --clickhouse URL` to backfill and mark them.\n"
    )
    body = ";\n\n".join(ddl_statements(table, comment, building(comment)))
    return f"{head}\n{body};\n"
