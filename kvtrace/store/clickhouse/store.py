"""kvtrace's views over an ``otel_traces`` table: :class:`ClickHouseStore`, the ClickHouse twin of
:func:`kvtrace.store.connect`.

A query (DuckDB SQL, the language of every kvtrace view and named query) runs as:

1. one ClickHouse statement with the views it reads as CTEs (:func:`.statement.assemble`);
2. where that statement would hold a data-reading CTE more than once, split into stages
   (:mod:`.staged`): each such CTE made once into a temporary table of the query's own session,
   except the span relations read whole (:data:`.statement.INLINE`);
3. run on the backend (:mod:`.backend`) with its parameters bound.  Nothing lasting is created on
   the server: a read-only user suffices (with ``readonly = 1``, which forbids even temporary
   tables, the single statement of step 1 runs).

**Time bounds.**  :meth:`ClickHouseStore.bounded` gives a store whose ``kvtrace_raw`` reads only
spans starting in ``[lo_ns, hi_ns]`` (a ``WHERE`` on ``Timestamp``, the table's partition key and
part of its sort key, so ClickHouse skips other days' parts and granules), bound as the
parameters ``kvtrace_lo_ns`` / ``kvtrace_hi_ns``.  :mod:`kvtrace.analysis.pushdown` uses it to push the
dashboard's filters down exactly (see there).

**Materialized tables.**  On a table with kvtrace's current ones (:mod:`.mviews`), ``kvtrace_scan``
reads the classified rows (bounded and scoped the same way) and the bounds come from the lookups.
"""

from __future__ import annotations

import functools

import pyarrow as pa

from kvtrace import semconv as sc
from kvtrace.store.clickhouse import ddl, mviews, mviews_sql, statement
from kvtrace.store.clickhouse.backend import BackendError, open_backend
from kvtrace.store.clickhouse.dialect import param_types
from kvtrace.store.clickhouse.staged import stage
from kvtrace.store.clickhouse.statement import HI, INLINE, LO, SESSION, assemble
from kvtrace.store.sql import CLICKHOUSE, ident, literal

_MIN_MAX = (
    "minOrNull(toUnixTimestamp64Nano(Timestamp)) AS lo, "
    "maxOrNull(toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)) AS hi"
)
# the session attributes the SessionId column holds (ddl.SESSION_ID_EXPR), and the other conventions'
_COLUMN_SESSION_ATTRS = (sc.SESSION_ID, sc.GEN_AI_CONVERSATION_ID)
_OTHER_SESSION_ATTRS = tuple(a for a in sc.SESSION_ATTRIBUTES if a not in _COLUMN_SESSION_ATTRS)


def _attr(name: str) -> str:
    return f"SpanAttributes[{literal(name, CLICKHOUSE)}]"


class ClickHouseStore:
    """Every kvtrace view over one ``otel_traces`` table (module doc).  Use :meth:`query`, or
    :func:`kvtrace.store.reader.query` / the :mod:`kvtrace.analysis` functions, which accept it in
    place of a DuckDB connection."""

    is_clickhouse = True

    def __init__(
        self,
        backend,
        table: str = ddl.TABLE,
        bounds: tuple[int, int] | None = None,
        temps: tuple[tuple[str, str, bool], ...] = (),
        session: str | None = None,
        lookup: bool | None = None,
    ) -> None:
        self.backend, self.table, self.bounds, self.temps = backend, table, bounds, temps
        self.session = session
        """Set by :meth:`session_scope` on a table with kvtrace's materialized tables: the scans read
        that session's traces and the spans that can join it by time (:data:`_SCOPED`) only."""
        self._lookup = lookup

    @property
    def description(self) -> str:
        return f"{self.backend.description} table {self.table}"

    def query(self, sql: str, params: dict | None = None) -> pa.Table | None:
        """Run ``sql`` (DuckDB SQL over kvtrace's views) with bound ``params``; an Arrow table.
        ``CREATE TEMP TABLE|VIEW name AS SELECT ...`` defines ``name`` for this store's later
        queries (a CTE in front of them, ``AS MATERIALIZED`` for a table: nothing is created on
        the server) and returns None."""
        temporary = statement.temporary(sql) if sql.lstrip()[:6].upper() == "CREATE" else None
        if temporary is not None:
            self.temps = tuple(t for t in self.temps if t[0] != temporary[0]) + (temporary,)
            return None
        params = dict(params or {})
        if self.bounds is not None:
            params[LO], params[HI] = self.bounds
        if self.session is not None:
            params[SESSION] = self.session
        text = assemble(
            sql,
            param_types(params),
            self.table,
            self.bounds is not None,
            self.temps,
            self.session is not None,
            shaped=self.has_lookup,
        )
        used = {k: v for k, v in params.items() if "{" + k + ":" in text}
        plan = stage(text, INLINE)
        return self.backend.query(text, used) if plan is None else self.backend.query_staged(plan, text, used)

    def session_bounds(self, session_id: str) -> tuple[int, int] | None:
        """``[first start, last end]`` (epoch ns) of every trace holding a span that names
        ``session_id`` (None: none does).  A session is a property of whole traces (the views give
        every span of a trace its agent's session), and the span naming it need not be the first:
        OpenLLMetry's workflow span starts before the proxy request that carries the session.
        Reads the ``SessionId`` column when the table has it (:data:`.ddl.RECOMMENDED_DDL`) and the
        other conventions' attributes, whose bloom filter index skips most granules; with the
        materialized tables (:mod:`.mviews`), reads the lookups instead (a few granules of two small tables)."""
        if self.has_lookup:
            return self._bounds(mviews_sql.bounds_sql(self.table, SESSION), {SESSION: session_id})
        t = ident(self.table)
        sql = f"SELECT {_MIN_MAX} FROM {t} WHERE TraceId IN (SELECT TraceId FROM {t} WHERE {self._names_session()})"
        return self._bounds(sql, {"sid": session_id})

    def window_bounds(self, start_ns: int | None, end_ns: int | None) -> tuple[int, int] | None:
        """``[first start, last end]`` (epoch ns) of the traces of every session whose window
        overlaps ``[start_ns, end_ns]`` (either may be None: unbounded), the window read from the
        spans that delimit sessions: kvtrace's session and request spans and every trace's root (an
        agent traced by another convention names its session there, or its requests do).  The
        traces then give the rest of each session.  With kvtrace's materialized tables (:mod:`.mviews`),
        the windows and traces come from them (a row per session and trace), not from the raw table."""
        params = {k: v for k, v in (("lo", start_ns), ("hi", end_ns)) if v is not None}
        if self.has_lookup:
            return self._bounds(mviews_sql.window_bounds_sql(self.table, "lo" in params, "hi" in params), params)
        t, sid = ident(self.table), self._session_expr()
        having = " AND ".join(
            c
            for c in (
                "max(toUnixTimestamp64Nano(Timestamp) + Duration) >= {lo:Int64}" if start_ns is not None else "",
                "min(toUnixTimestamp64Nano(Timestamp)) <= {hi:Int64}" if end_ns is not None else "",
            )
            if c
        )
        windows = f"FROM {t} WHERE ({mviews_sql.WINDOW_SPANS})"
        chosen = f"SELECT {sid} AS s {windows} AND s != '' GROUP BY s" + (f" HAVING {having}" if having else "")
        traces = f"SELECT TraceId {windows} AND ({sid}) IN ({chosen})"
        return self._bounds(f"SELECT {_MIN_MAX} FROM {t} WHERE TraceId IN ({traces})", params)

    def requests_bounds(self, lo_ns: int, hi_ns: int) -> tuple[int, int] | None:
        """``[first start, last end]`` of the spans of every request whose spans overlap ``[lo_ns, hi_ns]``
        (and of every retention span naming no request that does), from kvtrace's requests table
        (:mod:`.mviews`); None if none does, or without the materialized tables."""
        if not self.has_lookup:
            return None
        return self._bounds(mviews_sql.requests_bounds_sql(self.table), {"lo": int(lo_ns), "hi": int(hi_ns)})

    def rates_relations(self) -> tuple[str, str] | None:
        """(prefills, d2p): the relations a prefill rate reads (:mod:`kvtrace.analysis.reuse`) over
        kvtrace's prefills and d2p tables, whatever this store's bounds; None without them."""
        if not self.has_lookup:
            return None
        m = mviews_sql
        return m.rows_relation(self.table, m.PREFILLS), m.rows_relation(self.table, m.D2P)

    def generation(self) -> str | None:
        """What this table and its materialized tables hold, as an id that changes whenever it may
        have changed (:func:`.mviews_sql.parts_sql`): what is computed from the materialized tables
        alone (a question's bounds, the prefill rates) is kept while it holds (:func:`kvtrace.store.lookup.kept`).  None
        without them, or where ``system.parts`` cannot be read (then nothing is kept)."""
        if not self.has_lookup:
            return None
        try:
            [row] = self.backend.query(mviews_sql.parts_sql(self.table)).to_pylist()
        except BackendError:
            return None
        return f"{self.backend.description} {self.table} {row['parts']} {row['rows']} {row['names']}"

    def time_span(self) -> dict | None:
        """First span start, last span end (epoch ns) and span count of the whole table from kvtrace's
        materialized tables (:func:`.mviews_sql.time_span_sql`); None without them (the caller reads
        the raw table)."""
        if not self.has_lookup:
            return None
        rows = self.backend.query(mviews_sql.time_span_sql(self.table)).to_pylist()
        return rows[0] if rows else None

    def _session_expr(self) -> str:
        """The session a span names, the first present of the conventions' attributes ('' for none)."""
        first = ddl.SESSION_ID_COLUMN if self._has_session_column() else ddl.SESSION_ID_EXPR
        rest = [f"mapContains(SpanAttributes, {literal(a, CLICKHOUSE)}), {_attr(a)}" for a in _OTHER_SESSION_ATTRS]
        return f"multiIf({first} != '', {first}, {', '.join(rest)}, '')"

    def _names_session(self) -> str:
        """A span names the session ``{sid:String}`` in any of the conventions' attributes."""
        names = [f"{_attr(a)} = {{sid:String}}" for a in _OTHER_SESSION_ATTRS]
        if self._has_session_column():
            names.insert(0, f"{ddl.SESSION_ID_COLUMN} = {{sid:String}}")
        else:
            names[:0] = [f"{_attr(a)} = {{sid:String}}" for a in _COLUMN_SESSION_ATTRS]
        return "(" + " OR ".join(names) + ")"

    def _bounds(self, sql: str, params: dict) -> tuple[int, int] | None:
        row = self.backend.query(sql, params).to_pylist()[0]
        return None if row["lo"] is None else (row["lo"], row["hi"])

    @functools.cached_property
    def _columns(self) -> frozenset[str]:
        return frozenset(self.backend.query(f"SELECT * FROM {ident(self.table)} LIMIT 0").column_names)

    def _has_session_column(self) -> bool:
        return ddl.SESSION_ID_COLUMN in self._columns

    @property
    def has_lookup(self) -> bool:
        """The table has kvtrace's materialized tables, complete and of the current version
        (:func:`.mviews.state`): checked once per store, its copies (:meth:`cursor`, :meth:`bounded`) take
        its answer, :meth:`refresh` checks again."""
        if self._lookup is None:
            try:
                self._lookup = mviews.state(self.backend, self.table).current
            except BackendError:  # system.tables not readable: as without the lookup
                self._lookup = False
        return self._lookup

    def refresh(self) -> None:
        """Check again whether the table has kvtrace's materialized tables (``kvtrace clickhouse init``
        run since); the copies made from now on inherit the answer."""
        self._lookup = None

    def session_scope(self, session_id: str) -> ClickHouseStore:
        """The same store reading only what a query about ``session_id`` needs: spans starting
        within its traces' bounds (:meth:`session_bounds`; none when no trace names it) and, with
        the materialized tables, of those traces (``TraceId IN`` the lookup's) and the spans that can
        join the session by time only."""
        bounds = self.session_bounds(session_id) or (1, 0)
        scoped = self.bounded(*bounds)
        if self.has_lookup:
            scoped.session = session_id
        return scoped

    execute = query

    def bounded(self, lo_ns: int, hi_ns: int) -> ClickHouseStore:
        """The same store reading only spans that start in ``[lo_ns, hi_ns]``."""
        return ClickHouseStore(
            self.backend, self.table, (int(lo_ns), int(hi_ns)), self.temps, self.session, self.has_lookup
        )

    def cursor(self) -> ClickHouseStore:
        """A store on the same backend with its own temporary tables and views (like a DuckDB
        cursor's)."""
        return ClickHouseStore(self.backend, self.table, self.bounds, self.temps, self.session, self.has_lookup)

    def close(self) -> None:
        """Forget this store's temporary objects (the backend stays open for other stores)."""
        self.temps = ()


def connect(url: str, table: str = ddl.TABLE) -> ClickHouseStore:
    """A :class:`ClickHouseStore` on ``url`` (``http(s)://...`` or ``chdb:PATH``, see
    :mod:`.backend`) and ``table`` (``name`` or ``database.name``), checked to exist."""
    store = ClickHouseStore(open_backend(url), table)
    try:
        store.backend.query(f"SELECT 1 FROM {ident(table)} LIMIT 0")
    except BackendError as exc:
        raise BackendError(f"{store.description}: {exc}") from None
    return store
