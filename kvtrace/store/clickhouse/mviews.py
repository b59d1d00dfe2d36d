"""kvtrace's materialized tables on an ``otel_traces`` table (``kvtrace clickhouse init``): data
shaped at ingest, so what a question costs grows with its answer, not with the history kept.

Incremental materialized views fill seven tables on every insert the exporter makes
(:mod:`.mviews_sql` has them and their SQL): the breakdown's classified rows (``kvtrace_scan``), a
session -> trace ids lookup, trace id -> first start / last end (like the exporter's own
``otel_traces_trace_id_ts``), each session's window per trace, each request's first start / last end,
and P's prefills and the d2p transfers (what a prefill rate reads).  :class:`.store.ClickHouseStore`
then reads the classified rows instead of classifying raw spans (``session_breakdown`` /
``turn_breakdown`` read the raw table no more), finds a session's, a time range's or its requests'
bounds in the small tables, and the KV reuse questions price recompute from the prefill tables
(:mod:`kvtrace.analysis.pushdown`, :mod:`kvtrace.analysis.reuse`); every other view reads the raw
table (within those bounds) as before.

**Versions.**  Every object carries a comment (:data:`COMMENT`, kvtrace's version of the DDL):
:func:`state` tells a current set from an absent, partial (a target still marked ``(building)``:
:func:`init` did not finish) or older one (the v1 session lookup, any other version), and the store
uses only a current one; otherwise it reads the raw table as without them, and ``kvtrace doctor``
says in one line (:func:`advice`) how to add, complete or rebuild them.  A set one version older whose
tables this version keeps as they are (:data:`UPGRADES`: v3) is completed in place by :func:`init`,
so a long history's classified rows are not written again.

**Backfill.**  :func:`init` creates the targets (marked ``(building)``) and the views, then inserts
what the table held before, a day (partition) at a time; the classified rows only of spans not
already shaped by the views (by trace and span id), so a span inserted meanwhile is counted once,
and a rerun after an interruption completes the tables.  Only then are the targets marked current.
(An insert in flight at the very moment a day's backfill starts may be in both: run ``init`` before
the exporter writes, or while it is quiet, on a table with history.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtrace.store.clickhouse import ddl, mviews_sql
from kvtrace.store.sql import CLICKHOUSE, ident, literal

VERSION = 4
"""Bump when the DDL of :mod:`.mviews_sql` changes: older tables are then ignored until
``kvtrace clickhouse init --replace`` rebuilds them (or ``init`` completes them, :data:`UPGRADES`).
1: the session lookup alone; 2: the four tables; 3: the scan table derives ``trace_id`` /
``span_id`` on read and keeps the default codec; 4: the requests, prefills and d2p tables (the KV
reuse and retention pages' bounds and rates)."""

_MARK = "kvtrace materialized tables v"


def comment(version: int = VERSION) -> str:
    return f"{_MARK}{version}"


COMMENT = comment()

SESSIONS, TRACES = mviews_sql.SESSIONS, mviews_sql.TRACES
_V1_OBJECTS = ("_kvtrace_sessions", "_kvtrace_traces", "_kvtrace_sessions_mv", "_kvtrace_traces_mv")


@dataclass(frozen=True)
class Names:
    """The objects for one ``otel_traces`` table (same database)."""

    table: str
    sessions: str
    traces: str
    scan: str
    windows: str
    requests: str
    prefills: str
    d2p: str

    @property
    def objects(self) -> tuple[str, ...]:
        return tuple(mviews_sql.objects(self.table))


def names(table: str = ddl.TABLE) -> Names:
    m = mviews_sql
    suffixes = (SESSIONS, TRACES, m.SCAN_T, m.WINDOWS, m.REQUESTS, m.PREFILLS, m.D2P)
    return Names(table, *(m.target(table, s) for s in suffixes))


def ddl_statements(
    table: str = ddl.TABLE, version: int = VERSION, only: tuple[str, ...] = mviews_sql.TARGETS
) -> list[str]:
    """CREATE statements (targets marked building, then views), each idempotent (``IF NOT EXISTS``);
    ``only``: of these targets (and their views)."""
    c = comment(version)
    return mviews_sql.ddl_statements(table, c, mviews_sql.building(c), only)


def drop_statements(table: str = ddl.TABLE) -> list[str]:
    return mviews_sql.drop_statements(table)


def sql_file(table: str = ddl.TABLE) -> str:
    """``collectors/clickhouse-kvtrace-views.sql`` (a test keeps them equal)."""
    return mviews_sql.sql_file(table, COMMENT)


@dataclass(frozen=True)
class State:
    """What a table's materialized tables are: ``current`` (usable), ``absent``, ``partial`` or ``old``."""

    kind: str
    versions: tuple[str, ...] = ()
    found: frozenset[str] = field(default=frozenset(), compare=False)
    """The objects present (names without the database)."""

    @property
    def current(self) -> bool:
        return self.kind == "current"


def state(backend, table: str = ddl.TABLE) -> State:
    """The state for ``table`` (reads ``system.tables`` only)."""
    db = table.rsplit(".", 1)[0] if "." in table else None
    wanted = [mviews_sql.short_name(o) for o in mviews_sql.objects(table)]
    older = [mviews_sql.short_name(table) + o for o in _V1_OBJECTS]
    where_db = "database = {db:String}" if db else "database = currentDatabase()"
    listed = ", ".join(literal(w, CLICKHOUSE) for w in sorted(set(wanted + older)))
    rows = backend.query(
        f"SELECT name, comment FROM system.tables WHERE {where_db} AND name IN ({listed})", {"db": db} if db else None
    ).to_pylist()
    return classify({r["name"]: r["comment"] for r in rows}, wanted)


def classify(found: dict[str, str], wanted: list[str]) -> State:
    """:class:`State` from ``name -> comment`` of the objects present."""
    if not found:
        return State("absent")
    pending = mviews_sql.building(COMMENT)
    other = tuple(sorted({c for c in found.values() if c not in (COMMENT, pending)}))
    if other:
        return State("old", other, frozenset(found))
    complete = len(found) == len(wanted) and pending not in found.values()
    return State("current") if complete else State("partial")


UPGRADES = {comment(3): (mviews_sql.REQUESTS, mviews_sql.PREFILLS, mviews_sql.D2P)}
"""An older set :func:`init` completes in place (its comment -> the targets this version added to it):
its tables stay as they are, the added ones are created and backfilled, then every object is marked
current.  Any other older set is rebuilt (``--replace``)."""


def added(table: str, st: State) -> tuple[str, ...] | None:
    """The targets :func:`init` adds to ``table``'s older set ``st`` in place (:data:`UPGRADES`); None
    if it must be rebuilt: another version, or an object of the older set missing (an upgrade
    interrupted may have left some of the added ones, marked ``(building)``)."""
    if st.kind != "old" or len(st.versions) != 1 or st.versions[0] not in UPGRADES:
        return None
    new = UPGRADES[st.versions[0]]
    kept = [s for s in mviews_sql.TARGETS if s not in new]
    short = mviews_sql.short_name(table)
    needed = {short + s for s in kept} | {short + s + mviews_sql.MV for s in kept}
    return new if needed <= st.found else None


def advice(table: str, st: State, url: str = "URL") -> str | None:
    """One line saying how to add (or rebuild) the tables, else None (current)."""
    if st.current:
        return None
    flag = "" if table == ddl.TABLE else f" --table {table}"
    cmd = f"kvtrace clickhouse init --clickhouse {url}{flag}"
    if added(table, st):
        return (
            f"{table}: materialized tables are {st.versions[0]}, this kvtrace reads {COMMENT} (until then it reads "
            f"the raw table): add what {COMMENT} adds with `{cmd}` (the tables already there are kept)"
        )
    if st.kind == "old":
        found = ", ".join(st.versions) or "unversioned"
        return (
            f"{table}: materialized tables are {found}, this kvtrace reads {COMMENT} (until then it reads the "
            f"raw table): rebuild them with `{cmd} --replace`"
        )
    if st.kind == "partial":
        return f"{table}: materialized tables incomplete (kvtrace reads the raw table): complete them with `{cmd}`"
    return f"{table}: no materialized tables (every answer reads the raw table): add them with `{cmd}`"


def note(store, url: str = "URL") -> str | None:
    """For a :class:`.store.ClickHouseStore` (``kvtrace doctor``, the dashboard): :func:`advice` for its
    table, None when its tables are current or ``system.tables`` cannot be read."""
    from kvtrace.store.clickhouse.backend import BackendError

    try:
        st = state(store.backend, store.table)
    except BackendError:
        return None
    return advice(store.table, st, url)


def init(backend, table: str = ddl.TABLE, *, replace: bool = False) -> dict[str, int]:
    """Create the tables for ``table``, backfill them and mark them current (module doc);
    ``replace``: drop existing ones first (an older version is refused without it, but for one it
    completes in place: :data:`UPGRADES`).  Nothing to do on current tables.  Returns the sessions
    and traces the lookup then holds.  Raises :class:`.backend.BackendError` (one line)."""
    from kvtrace.store.clickhouse.backend import BackendError

    try:
        backend.query(f"SELECT 1 FROM {ident(table)} LIMIT 0")
    except BackendError as exc:
        raise BackendError(f"table {table}: {exc}") from None
    st = state(backend, table)
    upgrade = None if replace else added(table, st)
    if st.kind == "old" and not replace and upgrade is None:
        raise BackendError(advice(table, st, backend.description) or "")
    if replace or not st.current:
        try:
            _build(backend, table, replace, upgrade or mviews_sql.TARGETS)
        except BackendError as exc:
            raise BackendError(
                f"cannot create the materialized tables of {table}: {exc} (needs a user allowed CREATE TABLE, "
                "CREATE VIEW, ALTER TABLE and INSERT in its database)"
            ) from None
    return counts(backend, table)


def _build(backend, table: str, replace: bool, only: tuple[str, ...] = mviews_sql.TARGETS) -> None:
    """The targets ``only`` and their views created (``replace``: the set dropped first), backfilled,
    then every object marked current.  Fewer than all: added to an older set, whose tables are not
    touched, and whose views this marks current too (:data:`UPGRADES`)."""
    for sql in (drop_statements(table) if replace else []) + ddl_statements(table, only=only):
        backend.command(sql)
    for row in backend.query(mviews_sql.days_sql(table)).to_pylist():
        for sql in mviews_sql.backfill_statements(table, row["day"], only):
            backend.command(sql)
    for sql in mviews_sql.mark_statements(table, COMMENT, views=True):
        backend.command(sql)


def counts(backend, table: str = ddl.TABLE) -> dict[str, int]:
    """Distinct sessions and traces the lookup holds, and the classified rows."""
    n = names(table)
    one = backend.query(
        f"SELECT (SELECT uniqExact(SessionId) FROM {ident(n.sessions)}) AS sessions, "
        f"(SELECT uniqExact(TraceId) FROM {ident(n.traces)}) AS traces, "
        f"(SELECT count() FROM {ident(n.scan)}) AS rows"
    ).to_pylist()[0]
    return {k: int(one[k] or 0) for k in ("sessions", "traces", "rows")}
