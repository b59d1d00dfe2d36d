"""One ClickHouse statement of a kvtrace query over an ``otel_traces`` table (:func:`assemble`), for
:class:`~kvtrace.store.clickhouse.store.ClickHouseStore`.

A query (DuckDB SQL, the language of every kvtrace view and named query) becomes:

1. transpiled to ClickHouse (:mod:`.dialect`);
2. given, as CTEs in front of it, the views it reads and the views those read (in
   :data:`kvtrace.store.views.VIEWS` order), each transpiled the same way, and ``kvtrace_raw``
   (:func:`raw_sql`): the table's columns as kvtrace's Parquet files have them (``Duration`` as
   Int64, the ``date`` / ``hour`` partition columns; ``SpanAttributesInt`` / ``SpanAttributesFloat``
   rebuilt from the string map: the values that read as integers, as other numbers; ClickHouse
   computes them only when a query selects them).

Bounded (``kvtrace_lo_ns`` / ``kvtrace_hi_ns``), scoped to a session (``kvtrace_session``) and
shaped (the materialized scan table, :mod:`.mviews_sql`) statements are built here too; the store
stages and runs them.
"""

from __future__ import annotations

import functools

import sqlglot
from sqlglot import exp

from kvtrace import semconv as sc
from kvtrace.store.clickhouse import mviews_sql
from kvtrace.store.clickhouse.dialect import TranspileError, to_clickhouse, transpile
from kvtrace.store.sql import CLICKHOUSE, ident, literal
from kvtrace.store.views import VIEWS
from kvtrace.store.views.agents import SCAN
from kvtrace.store.views.raw import RAW
from kvtrace.store.views.spans import SPANS

LO, HI = "kvtrace_lo_ns", "kvtrace_hi_ns"
SESSION = "kvtrace_session"
INLINE = frozenset({RAW, SPANS.name})
"""Never made a stage table: a copy of every span with every derived column costs more than reading the
table again at each reference, where ClickHouse reads only the columns and granules that reference
needs (docs/benchmarks.md, "The KV reuse page as the history grows")."""
_WITH = "with_" if "with_" in exp.Select.arg_types else "with"  # SQLGlot renamed the key

# the Parquet layout's columns, from the exporter's table (module doc, step 2)
_NESTED = (
    "Events.Timestamp",
    "Events.Name",
    "Events.Attributes",
    "Links.TraceId",
    "Links.SpanId",
    "Links.TraceState",
    "Links.Attributes",
)
_PLAIN = (
    "Timestamp",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "TraceState",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "ResourceAttributes",
    "ScopeName",
    "ScopeVersion",
    "SpanAttributes",
)
_TYPED = (
    "CAST(mapFilter((k, v) -> v IS NOT NULL, mapApply((k, v) -> (k, toInt64OrNull(v)), SpanAttributes)) "
    "AS Map(String, Int64)) AS SpanAttributesInt",
    "CAST(mapFilter((k, v) -> v IS NOT NULL, mapApply((k, v) -> (k, if(toInt64OrNull(v) IS NULL, "
    "toFloat64OrNull(v), NULL)), SpanAttributes)) AS Map(String, Float64)) AS SpanAttributesFloat",
)


def raw_sql(table: str, bounded: bool, scoped: bool = False, where: str = "") -> str:
    """The ``kvtrace_raw`` relation over ``table`` (ClickHouse SQL); ``scoped``: only what a query
    about the session bound as ``kvtrace_session`` needs (:data:`_SCOPED`); ``where``: a condition
    on the table's columns (the backfill's)."""
    cols = [
        *_PLAIN,
        "toInt64(Duration) AS Duration",
        "StatusCode",
        "StatusMessage",
        *(ident(c) for c in _NESTED),
        *_TYPED,
        "toDate(Timestamp) AS date",
        "toInt32(toHour(Timestamp)) AS hour",
    ]
    conds = [f"({where})"] if where else []
    if bounded:
        conds.append(
            f"Timestamp >= fromUnixTimestamp64Nano({{{LO}:Int64}}) "
            f"AND Timestamp <= fromUnixTimestamp64Nano({{{HI}:Int64}})"
        )
    if scoped:
        conds.append(_SCOPED.format(traces=mviews_sql.scope_sql(table, SESSION)))
    return f"SELECT {', '.join(cols)} FROM {ident(table)}" + (f" WHERE {' AND '.join(conds)}" if conds else "")


# A one-session read with the lookup: the session's traces, and every span that can join a session by
# time or decide another trace's session in the breakdown's joins (kvtrace's request and retention spans,
# other conventions' spans: ``agents.JOINS_CTE`` ranks every request against every LLM call it overlaps,
# so a LangGraph request trace that names no session, or a competing call of another session, must stay).
_SCOPED = "(TraceId IN ({{traces}}) OR SpanName IN ({}) OR NOT startsWith(SpanName, {}))".format(
    ", ".join(literal(n, CLICKHOUSE) for n in (sc.SPAN_PROXY_REQUEST, sc.SPAN_KV_RETENTION)),
    literal(sc.KVTRACE_SPAN_PREFIX, CLICKHOUSE),
)


@functools.cache
def _view_sql() -> dict[str, str]:
    """View name -> its SELECT in ClickHouse."""
    return {v.name: to_clickhouse(v.select) for v in VIEWS}


@functools.cache
def _scan_with_ids() -> str:
    """The ``kvtrace_scan`` view's SELECT, each row with its span's ``TraceId`` and ``SpanId`` (the
    materialized scan table's, :mod:`.mviews_sql`)."""
    tree = transpile(next(v.select for v in VIEWS if v.name == SCAN))
    assert isinstance(tree, exp.Select)
    ids = [exp.alias_(exp.column(c, table="n"), a) for c, a in (("trace_id", "TraceId"), ("span_id", "SpanId"))]
    return tree.select(*ids, copy=False).sql("clickhouse")


@functools.cache
def _view_deps(shaped: bool = False) -> dict[str, frozenset[str]]:
    names = {v.name for v in VIEWS} | {RAW}
    out = {}
    for v in VIEWS:
        tree = sqlglot.parse_one(v.select, read="duckdb")
        out[v.name] = frozenset(t.name for t in tree.find_all(exp.Table) if not t.db and t.name in names)
    if shaped:  # the scan reads its materialized table
        out[SCAN] = frozenset()
    return out


def _needed(referenced: set[str], shaped: bool = False) -> list[str]:
    """The views (and ``kvtrace_raw``) ``referenced`` reads, dependencies first."""
    deps, seen, stack = _view_deps(shaped), set(), list(referenced)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(deps.get(name, ()))
    order = [RAW] + [v.name for v in VIEWS]
    return [n for n in order if n in seen]


@functools.lru_cache(maxsize=1024)
def assemble(
    sql: str,
    types: tuple[tuple[str, str], ...],
    table: str,
    bounded: bool,
    temps: tuple[tuple[str, str, bool], ...] = (),
    scoped: bool = False,
    *,
    shaped: bool = False,
    raw_where: str = "",
    keep_ids: bool = False,
) -> str:
    """``sql`` (DuckDB) as one ClickHouse statement over ``table``: transpiled, with the views it
    reads as CTEs in front (module doc), and a cursor's temporary tables and views (``temps``:
    (name, DuckDB SELECT, materialized), in creation order; they hide views of the same name);
    ``scoped`` and ``raw_where``: :func:`raw_sql`'s; ``shaped``: ``kvtrace_scan`` reads the
    materialized scan table (:mod:`.mviews`); ``keep_ids``: its rows carry ``TraceId`` / ``SpanId``
    (what the materialized view inserts)."""
    tree = transpile(sql, types)
    text = tree.sql("clickhouse")
    if not isinstance(tree, exp.Query):
        return text
    temp_trees = [(name, transpile(body, types), mat) for name, body, mat in temps]
    temp_names = {name for name, _, _ in temps}
    names = ({v.name for v in VIEWS} | {RAW}) - temp_names
    defined = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    referenced = {t.name for t in tree.find_all(exp.Table) if not t.db and t.name in names | temp_names} - defined
    if not referenced:
        return text
    needed = referenced & temp_names
    if needed:  # a temporary object is read: all of them come along (they may read each other)
        referenced |= {
            t.name for _, body, _ in temp_trees for t in body.find_all(exp.Table) if not t.db and t.name in names
        }
    views = dict(_view_sql())
    if shaped:
        views[SCAN] = mviews_sql.scan_read_sql(table, bounded, LO, HI, SESSION if scoped else None)
    elif keep_ids:
        views[SCAN] = _scan_with_ids()
    ctes = [
        f"{n} AS ({raw_sql(table, bounded, scoped, raw_where) if n == RAW else views[n]})"
        for n in _needed(referenced - temp_names, shaped)
    ]
    if needed:
        ctes += [f"{n} AS {'MATERIALIZED ' if mat else ''}({body.sql('clickhouse')})" for n, body, mat in temp_trees]
    own = tree.args.get(_WITH)
    if own is not None:
        if own.args.get("recursive"):
            raise TranspileError("WITH RECURSIVE over kvtrace views is not supported on ClickHouse")
        ctes += [cte.sql("clickhouse") for cte in own.expressions]
        tree.set(_WITH, None)
    return f"WITH {', '.join(ctes)}\n{tree.sql('clickhouse')}"


def temporary(sql: str) -> tuple[str, str, bool] | None:
    """(name, SELECT, is a table) of ``CREATE TEMP TABLE|VIEW name AS SELECT ...``, else None."""
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError:
        return None
    if (
        not isinstance(tree, exp.Create)
        or tree.kind not in ("TABLE", "VIEW")
        or not isinstance(tree.expression, exp.Query)
    ):
        return None
    props = tree.args.get("properties")
    if not (props and any(isinstance(p, exp.TemporaryProperty) for p in props.expressions)):
        return None
    return tree.this.name, tree.expression.sql("duckdb"), tree.kind == "TABLE"
