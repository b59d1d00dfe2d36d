"""kvtrace's session lookup on an ``otel_traces`` table: two small tables that incremental
materialized views fill on every insert, so a one-session query reads the session's traces only.

Like the exporter's own ``otel_traces_trace_id_ts`` (trace id -> first and last second), in two
steps, because a session is a property of whole traces and the span naming it need not be the
first of its trace (OpenLLMetry's workflow span starts before the proxy request that carries it),
nor in the same insert as the trace's other spans:

- ``<table>_kvtrace_sessions`` (ReplacingMergeTree, sorted by session): ``(SessionId, TraceId)``
  for every span naming a session in any convention's attribute (:data:`kvtrace.semconv.SESSION_ATTRIBUTES`,
  each value a row: the same spans :meth:`.store.ClickHouseStore.session_bounds` finds);
- ``<table>_kvtrace_traces`` (AggregatingMergeTree, sorted by trace id): ``TraceId -> Start``
  (first span start, epoch ns), ``End`` (last span end), over every span.

Each is fed by a ``MATERIALIZED VIEW ... TO`` it (``..._mv``).  Rows may repeat (an insert's block
per part, a backfill rerun): readers take distinct trace ids and min / max, so :func:`init` may
backfill again at any time and creates the views before it backfills (a span inserted meanwhile is
counted twice, never missed).  The four objects carry :data:`COMMENT` (kvtrace's lookup version):
:func:`state` tells a current lookup from an absent, partial or older one, and the store uses only
a current one.  ``collectors/clickhouse-kvtrace-views.sql`` is :func:`sql_file` for ``otel_traces``
(a test keeps them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtrace import semconv as sc
from kvtrace.store.clickhouse import ddl
from kvtrace.store.sql import CLICKHOUSE, ident, literal

VERSION = 1
"""Bump when the DDL below changes: an older lookup is then ignored until ``kvtrace clickhouse
init --replace`` rebuilds it."""

_MARK = "kvtrace session lookup v"


def comment(version: int = VERSION) -> str:
    return f"{_MARK}{version}"


COMMENT = comment()

SESSIONS, TRACES = "_kvtrace_sessions", "_kvtrace_traces"
_MV = "_mv"


@dataclass(frozen=True)
class Names:
    """The lookup's objects for one ``otel_traces`` table (same database)."""

    table: str
    sessions: str
    traces: str
    sessions_mv: str
    traces_mv: str

    @property
    def objects(self) -> tuple[str, str, str, str]:
        return (self.sessions, self.traces, self.sessions_mv, self.traces_mv)


def names(table: str = ddl.TABLE) -> Names:
    return Names(table, table + SESSIONS, table + TRACES, table + SESSIONS + _MV, table + TRACES + _MV)


# a span's session ids: each convention's attribute, when present and not empty
_SESSION_IDS = "arrayDistinct(arrayFilter(s -> s != '', [{}]))".format(
    ", ".join(f"SpanAttributes[{literal(a, CLICKHOUSE)}]" for a in sc.SESSION_ATTRIBUTES)
)
# what one span gives each table (the MVs' SELECTs and the backfill's)
_SESSIONS_SELECT = f"SELECT DISTINCT arrayJoin({_SESSION_IDS}) AS SessionId, TraceId FROM {{src}} WHERE TraceId != ''"
_TRACES_SELECT = (
    "SELECT TraceId, min(toUnixTimestamp64Nano(Timestamp)) AS Start, "
    "max(toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)) AS End FROM {src} WHERE TraceId != '' GROUP BY TraceId"
)
# the inserting session's settings apply to an MV's SELECT; kvtrace's own (dialect.SETTINGS) would
# make min / max Nullable, the exporter's would not: fix what the target receives
_MV_SETTINGS = " SETTINGS aggregate_functions_null_for_empty = 0"


def ddl_statements(table: str = ddl.TABLE, version: int = VERSION) -> list[str]:
    """CREATE statements (targets, then views), each idempotent (``IF NOT EXISTS``)."""
    n, c = names(table), literal(comment(version), CLICKHOUSE)
    src = ident(table)
    return [
        f"CREATE TABLE IF NOT EXISTS {ident(n.sessions)} (\n    SessionId String CODEC(ZSTD(1)),\n"
        "    TraceId String CODEC(ZSTD(1))\n) ENGINE = ReplacingMergeTree\nORDER BY (SessionId, TraceId)\n"
        f"COMMENT {c}",
        f"CREATE TABLE IF NOT EXISTS {ident(n.traces)} (\n    TraceId String CODEC(ZSTD(1)),\n"
        "    Start SimpleAggregateFunction(min, Int64),\n    End SimpleAggregateFunction(max, Int64)\n"
        f") ENGINE = AggregatingMergeTree\nORDER BY TraceId\nCOMMENT {c}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {ident(n.sessions_mv)} TO {ident(n.sessions)}\n"
        f"AS {_SESSIONS_SELECT.format(src=src)}\nCOMMENT {c}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {ident(n.traces_mv)} TO {ident(n.traces)}\n"
        f"AS {_TRACES_SELECT.format(src=src)}{_MV_SETTINGS}\nCOMMENT {c}",
    ]


def backfill_statements(table: str = ddl.TABLE) -> list[str]:
    """INSERT ... SELECT of the rows already in ``table`` (safe to repeat: module doc)."""
    n, src = names(table), ident(table)
    return [
        f"INSERT INTO {ident(n.sessions)} (SessionId, TraceId) {_SESSIONS_SELECT.format(src=src)}",
        f"INSERT INTO {ident(n.traces)} (TraceId, Start, End) {_TRACES_SELECT.format(src=src)}{_MV_SETTINGS}",
    ]


def drop_statements(table: str = ddl.TABLE) -> list[str]:
    """DROP of the lookup's objects, views first (nothing else is touched)."""
    n = names(table)
    return [
        f"DROP VIEW IF EXISTS {ident(n.sessions_mv)}",
        f"DROP VIEW IF EXISTS {ident(n.traces_mv)}",
        f"DROP TABLE IF EXISTS {ident(n.sessions)}",
        f"DROP TABLE IF EXISTS {ident(n.traces)}",
    ]


def sql_file(table: str = ddl.TABLE) -> str:
    """The DDL and backfill as one script (``collectors/clickhouse-kvtrace-views.sql``)."""
    head = (
        f"-- kvtrace's session lookup on the ClickHouse exporter's {table} table ({COMMENT}).\n"
        "-- Generated from kvtrace/store/clickhouse/mviews.py; `kvtrace clickhouse init` runs the same\n"
        "-- statements. Run it against the exporter's database, e.g.\n"
        "--   clickhouse-client --database otel --multiquery < clickhouse-kvtrace-views.sql\n"
        "-- The backfill (last two statements) may be rerun at any time: readers ignore repeated rows.\n"
    )
    body = ";\n\n".join(ddl_statements(table) + backfill_statements(table))
    return f"{head}\n{body};\n"


@dataclass(frozen=True)
class State:
    """What a table's lookup is: ``current`` (usable), ``absent``, ``partial`` or ``old``."""

    kind: str
    versions: tuple[str, ...] = ()

    @property
    def current(self) -> bool:
        return self.kind == "current"


def state(backend, table: str = ddl.TABLE) -> State:
    """The lookup's state for ``table`` (reads ``system.tables`` only)."""
    n = names(table)
    db = table.rsplit(".", 1)[0] if "." in table else None
    wanted = [o.rsplit(".", 1)[-1] for o in n.objects]
    where_db = "database = {db:String}" if db else "database = currentDatabase()"
    listed = ", ".join(literal(w, CLICKHOUSE) for w in wanted)
    rows = backend.query(
        f"SELECT name, comment FROM system.tables WHERE {where_db} AND name IN ({listed})", {"db": db} if db else None
    ).to_pylist()
    found = {r["name"]: r["comment"] for r in rows}
    return classify(found, wanted)


def classify(found: dict[str, str], wanted: list[str]) -> State:
    """:class:`State` from ``name -> comment`` of the objects present."""
    if not found:
        return State("absent")
    other = tuple(sorted({c for c in found.values() if c != COMMENT}))
    if other:
        return State("old", other)
    return State("current") if len(found) == len(wanted) else State("partial")


def advice(table: str, st: State, url: str = "URL") -> str | None:
    """One line saying how to add (or rebuild) the lookup, else None (current)."""
    if st.current:
        return None
    flag = "" if table == ddl.TABLE else f" --table {table}"
    cmd = f"kvtrace clickhouse init --clickhouse {url}{flag}"
    if st.kind == "old":
        found = ", ".join(st.versions) or "unversioned"
        return f"{table}: session lookup is {found}, this kvtrace reads {COMMENT}: rebuild it with `{cmd} --replace`"
    what = "incomplete" if st.kind == "partial" else "absent"
    return f"{table}: session lookup {what} (a one-session query reads the whole table): add it with `{cmd}`"


def init(backend, table: str = ddl.TABLE, *, replace: bool = False) -> dict[str, int]:
    """Create the lookup for ``table`` and backfill it from the rows already there (module doc);
    ``replace``: drop an existing one first (an older version is refused without it).  Returns the
    sessions and traces the lookup then holds.  Raises :class:`.backend.BackendError` (one line)."""
    from kvtrace.store.clickhouse.backend import BackendError

    try:
        backend.query(f"SELECT 1 FROM {ident(table)} LIMIT 0")
    except BackendError as exc:
        raise BackendError(f"table {table}: {exc}") from None
    st = state(backend, table)
    if st.kind == "old" and not replace:
        raise BackendError(advice(table, st, backend.description) or "")
    try:
        for sql in (drop_statements(table) if replace else []) + ddl_statements(table) + backfill_statements(table):
            backend.command(sql)
    except BackendError as exc:
        raise BackendError(
            f"cannot create the session lookup of {table}: {exc} (needs a user allowed CREATE TABLE, "
            "CREATE VIEW and INSERT in its database)"
        ) from None
    return counts(backend, table)


def counts(backend, table: str = ddl.TABLE) -> dict[str, int]:
    """Distinct sessions and traces the lookup holds."""
    n = names(table)
    sessions = backend.query(f"SELECT uniqExact(SessionId) AS n FROM {ident(n.sessions)}").to_pylist()[0]["n"]
    traces = backend.query(f"SELECT uniqExact(TraceId) AS n FROM {ident(n.traces)}").to_pylist()[0]["n"]
    return {"sessions": int(sessions or 0), "traces": int(traces or 0)}


def scope_sql(table: str, param: str) -> str:
    """The trace ids of the session bound as ``{param:String}`` (a subquery on the lookup)."""
    return f"SELECT TraceId FROM {ident(names(table).sessions)} WHERE SessionId = {{{param}:String}}"


def bounds_sql(table: str, param: str) -> str:
    """``lo`` / ``hi`` (first start, last end, epoch ns; NULL: no such session) of the session's traces."""
    return (
        f"SELECT min(Start) AS lo, max(End) AS hi FROM {ident(names(table).traces)} "
        f"WHERE TraceId IN ({scope_sql(table, param)})"
    )
