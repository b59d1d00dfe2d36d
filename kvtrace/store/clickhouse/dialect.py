"""kvtrace's DuckDB SQL in ClickHouse: one definition, transpiled by SQLGlot with kvtrace's rules.

Every view of :mod:`kvtrace.store.views` and every named query of :mod:`kvtrace.analysis` is
written once, in DuckDB SQL.  :func:`to_clickhouse` parses it with SQLGlot (DuckDB dialect),
rewrites what SQLGlot's generic DuckDB -> ClickHouse rules do not carry over with the same
meaning, and prints ClickHouse SQL.  The rewrites (each checked by the view equivalence test,
``tests/store/clickhouse/test_views_match_duckdb.py``):

- **attributes**: ``SpanAttributes['k']`` / ``ResourceAttributes['k']`` are NULL in DuckDB when the
  key is absent, ``''`` in ClickHouse: read as ``if(mapContains(m, 'k'), m['k'], NULL)``.  The
  Collector's table has no typed maps: ``SpanAttributesInt['k']`` becomes
  ``toInt64OrNull(SpanAttributes['k'])`` and ``SpanAttributesFloat['k']``
  ``toFloat64OrNull(SpanAttributes['k'])`` (numbers arrive as strings there);
- **time**: ``epoch_ns`` -> ``toUnixTimestamp64Nano``, ``to_microseconds`` -> ``toIntervalMicrosecond``,
  ``make_timestamp`` (epoch µs) -> ``fromUnixTimestamp64Micro``, ``TIMESTAMPTZ`` -> ``DateTime64(6, 'UTC')``
  (SQLGlot's ``DateTime`` would drop the sub-second part);
- **ranges**: ``range(a, b)`` (DuckDB's end-exclusive list, which SQLGlot reads as a series) ->
  ``range(assumeNotNull(a), assumeNotNull(b))``, ``unnest`` of it in a select list -> ``arrayJoin``;
- **integer division** ``a // b`` -> ``intDivOrNull(a, b)`` (SQLGlot divides in floating point
  first, which loses digits of epoch-ns values; ClickHouse computes every ``CASE`` branch, so a
  division by zero in a branch not taken must not fail);
- **aggregates**: ``bool_or`` -> ``max``, ``list(DISTINCT x ORDER BY x)`` -> ``arraySort(groupUniqArray(x))``,
  ``median`` / ``quantile_cont`` -> ``quantileExactInclusive`` (DuckDB's interpolation; ClickHouse's
  ``median`` is approximate), ``regr_slope`` / ``regr_intercept`` -> ``simpleLinearRegression``,
  ``hash`` -> ``cityHash64``;
- **parameters**: DuckDB's ``$name`` -> ClickHouse's typed ``{name:Type}``, the type taken from the
  Python value bound (:func:`param_types`).

The settings every query runs with (:data:`SETTINGS`) supply the rest of DuckDB's semantics: outer
joins fill NULL (``join_use_nulls``), aggregates over no rows are NULL
(``aggregate_functions_null_for_empty``), ``AS MATERIALIZED`` CTEs are computed once
(``enable_materialized_cte``), UTC.  Needs ClickHouse 25.x or newer (tested: 26.9 in chDB).
"""

from __future__ import annotations

import functools
from typing import cast

import sqlglot
from sqlglot import exp

from kvtrace.store.clickhouse import ClickHouseError

STRING_MAPS = {"spanattributes": "SpanAttributes", "resourceattributes": "ResourceAttributes"}
TYPED_MAPS = {"spanattributesint": "toInt64OrNull", "spanattributesfloat": "toFloat64OrNull"}

SETTINGS: dict[str, object] = {
    "join_use_nulls": 1,
    "aggregate_functions_null_for_empty": 1,
    "enable_materialized_cte": 1,
    "session_timezone": "UTC",
    "union_default_mode": "DISTINCT",
    "cast_keep_nullable": 1,
    "prefer_column_name_to_alias": 1,
    # the breakdown reads three views over `spans` (kvtrace's, other conventions', the proxy's spans),
    # each inlined as a CTE with its attribute lookups: past the default 500k query-tree elements
    "max_expanded_ast_elements": 5_000_000,
}
"""Settings of every kvtrace query on ClickHouse (DuckDB's semantics, see the module doc)."""

_PARAM_TYPES = ((bool, "Bool"), (int, "Int64"), (float, "Float64"), (str, "String"))


class TranspileError(ClickHouseError, ValueError):
    """DuckDB SQL that SQLGlot cannot read (one line)."""


def param_types(params: dict | None) -> tuple[tuple[str, str], ...]:
    """(name, ClickHouse type) of each bound parameter, sorted (a cache key for :func:`to_clickhouse`)."""
    out = []
    for name, value in sorted((params or {}).items()):
        kind = next((t for cls, t in _PARAM_TYPES if isinstance(value, cls)), None)
        if value is None:
            kind = "Nullable(String)"
        elif kind is None:
            raise TypeError(f"parameter {name!r}: cannot bind a {type(value).__name__} in ClickHouse")
        out.append((name, kind))
    return tuple(out)


def _fn(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))


def _map_name(node: exp.Expression) -> str | None:
    return node.name.lower() if isinstance(node, exp.Column) else None


def _attribute(node: exp.Bracket) -> exp.Expression | None:
    """The ClickHouse reading of ``map['key']`` on one of the store's attribute maps."""
    name = _map_name(node.this)
    if name in STRING_MAPS and len(node.expressions) == 1:
        key = node.expressions[0]
        return exp.If(this=_fn("mapContains", node.this.copy(), key.copy()), true=node.copy(), false=exp.Null())
    if name in TYPED_MAPS and len(node.expressions) == 1:
        strings = node.this.copy()
        strings.set("this", exp.to_identifier("SpanAttributes"))
        return _fn(TYPED_MAPS[name], exp.Bracket(this=strings, expressions=[node.expressions[0].copy()]))
    return None


def _quantile(level: exp.Expression, arg: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=f"quantileExactInclusive({level.sql('clickhouse')})", expressions=[arg])


def _rewrite(node: exp.Expression) -> exp.Expression:  # noqa: C901 - one dispatch over node kinds
    if isinstance(node, exp.Bracket):
        return _attribute(node) or node
    if isinstance(node, exp.IntDiv):
        return _fn("intDivOrNull", node.this, node.expression)
    if isinstance(node, exp.LogicalOr):
        return exp.Max(this=node.this)
    if isinstance(node, exp.Median):
        return _quantile(exp.Literal.number(0.5), node.this)
    if isinstance(node, exp.PercentileCont) or (
        isinstance(node, exp.Anonymous) and node.name.lower() == "quantile_cont"
    ):
        args = [node.this, node.expression] if isinstance(node, exp.PercentileCont) else node.expressions
        return _quantile(args[1], args[0])
    if isinstance(node, exp.ArrayAgg):
        return _array_agg(node)
    if isinstance(node, exp.Filter):
        return _filtered_array(node) or node
    if isinstance(node, exp.DataType) and node.is_type(exp.DataType.Type.TIMESTAMPTZ):
        return exp.DataType.build("DateTime64(6, 'UTC')", dialect="clickhouse")
    if isinstance(node, exp.UnixToTime) or (isinstance(node, exp.Anonymous) and node.name.lower() == "make_timestamp"):
        arg = node.this if isinstance(node, exp.UnixToTime) else node.expressions[0]
        return _fn("fromUnixTimestamp64Micro", _fn("toInt64", arg), exp.Literal.string("UTC"))
    if isinstance(node, exp.GenerateSeries) and node.args.get("is_end_exclusive"):
        # DuckDB's range(a, b) (end excluded) is ClickHouse's range(a, b), on non-NULL integers
        ends = (_fn("assumeNotNull", node.args[k]) for k in ("start", "end"))
        return _fn("range", *ends)
    if isinstance(node, exp.CTE) and node.args.get("materialized") is False:
        node.set("materialized", None)  # DuckDB's NOT MATERIALIZED: ClickHouse inlines a CTE anyway
        return node
    if isinstance(node, exp.Anonymous):
        return _anonymous(node)
    return node


_REGR = {"regr_slope": 1, "regr_intercept": 2}
_RENAMED = {
    "epoch_ns": "toUnixTimestamp64Nano",
    "to_microseconds": "toIntervalMicrosecond",
    "hash": "cityHash64",
    "arg_min": "argMin",
    "arg_max": "argMax",
}


def _anonymous(node: exp.Anonymous) -> exp.Expression:
    name = node.name.lower()
    if name in _RENAMED:
        return _fn(_RENAMED[name], *node.expressions)
    if name in _REGR:  # regr_slope(y, x): simpleLinearRegression(x, y) = (slope, intercept)
        y, x = node.expressions
        return _fn("tupleElement", _fn("simpleLinearRegression", x, y), exp.Literal.number(_REGR[name]))
    return node


def _array_agg(node: exp.ArrayAgg) -> exp.Expression:
    """``list(DISTINCT x ORDER BY x)`` (the only ordered, distinct list kvtrace builds) and
    ``list(x)``."""
    arg = node.this
    ordered = isinstance(arg, exp.Order)
    if ordered:
        arg = arg.this
    distinct = isinstance(arg, exp.Distinct)
    if distinct:
        arg = arg.expressions[0]
    agg = _fn("groupUniqArray" if distinct else "groupArray", arg)
    return _fn("arraySort", agg) if ordered or distinct else agg


def _filtered_array(node: exp.Filter) -> exp.Expression | None:
    """``list(...) FILTER (WHERE c)`` (rewritten below it to ``arraySort(groupUniqArray(x))``) as
    ``arraySort(groupUniqArrayIf(x, c))``: ``FILTER`` belongs to the aggregate."""
    inner = node.this
    if not (isinstance(inner, exp.Anonymous) and inner.name == "arraySort"):
        return None
    agg = inner.expressions[0]
    if not (isinstance(agg, exp.Anonymous) and agg.name in ("groupUniqArray", "groupArray")):
        return None
    cond = node.expression.this if isinstance(node.expression, exp.Where) else node.expression
    return _fn("arraySort", _fn(agg.name + "If", *agg.expressions, cond))


def _regr(node: exp.Expression) -> exp.Expression:
    """SQLGlot's own RegrSlope / RegrIntercept nodes (versions that have them)."""
    for cls_name, index in (("RegrSlope", 1), ("RegrIntercept", 2)):
        cls = getattr(exp, cls_name, None)
        if cls is not None and isinstance(node, cls):
            y, x = node.this, node.expression
            return _fn("tupleElement", _fn("simpleLinearRegression", x, y), exp.Literal.number(index))
    return node


def _name_qualified_columns(tree: exp.Expression) -> None:
    """``SELECT t.x`` is named ``x`` in DuckDB, ``t.x`` in ClickHouse: alias it."""
    for select in tree.find_all(exp.Select):
        for node in select.expressions:
            if isinstance(node, exp.Column) and node.table and isinstance(node.this, exp.Identifier):
                node.replace(exp.alias_(node.copy(), node.name))


def _order_by_output_names(tree: exp.Expression) -> None:
    """``ORDER BY t`` sorts by the output column ``t`` in DuckDB even when an input column has that
    name (``SELECT min(t) AS t ... ORDER BY t``); ClickHouse, told to prefer column names to
    aliases (:data:`SETTINGS`, for DuckDB's WHERE and GROUP BY), would read the input column: sort
    by the output position instead."""
    for select in tree.find_all(exp.Select):
        order = select.args.get("order")
        if order is None:
            continue
        outputs: dict[str, int] = {}
        for i, node in enumerate(select.expressions, 1):
            if isinstance(node, exp.Alias) and not (isinstance(node.this, exp.Column) and node.this.name == node.alias):
                outputs.setdefault(node.alias, i)
        for ordered in order.expressions:
            key = ordered.this
            if isinstance(key, exp.Column) and not key.table and key.name in outputs:
                key.replace(exp.Literal.number(outputs[key.name]))


def _placeholders(tree: exp.Expression, types: dict[str, str]) -> None:
    for node in list(tree.find_all(exp.Placeholder, exp.Parameter)):
        name = node.name
        if name not in types:
            raise TranspileError(f"no value bound for parameter ${name}")
        node.replace(exp.Placeholder(this=name, kind=exp.DataType.build(types[name], dialect="clickhouse")))


def _bottom_up(tree: exp.Expression, fn) -> exp.Expression:
    """Apply ``fn`` to every node, children before their parent (SQLGlot's ``transform`` does not
    descend into a node it replaced)."""
    for node in reversed(list(tree.walk())):
        new = fn(node)
        if new is not node:
            if node is tree:
                tree = new
            else:
                node.replace(new)
    return tree


def to_clickhouse(sql: str, types: tuple[tuple[str, str], ...] = ()) -> str:
    """``sql`` (DuckDB, possibly several ``;``-separated statements: the last is kept) in ClickHouse,
    with ``$name`` parameters typed by ``types`` (:func:`param_types`)."""
    return transpile(sql, types).sql("clickhouse")


def transpile(sql: str, types: tuple[tuple[str, str], ...] = ()) -> exp.Expression:
    """As :func:`to_clickhouse`, the ClickHouse syntax tree (a copy: callers may change it)."""
    return _transpile(sql, types).copy()


@functools.lru_cache(maxsize=2048)
def _transpile(sql: str, types: tuple[tuple[str, str], ...]) -> exp.Expression:
    try:
        trees = [t for t in sqlglot.parse(sql, read="duckdb") if t is not None]
    except sqlglot.errors.ParseError as exc:
        raise TranspileError(str(exc).splitlines()[0]) from None
    if not trees:
        raise TranspileError("no SQL statement")
    # a statement: every concrete node is an Expression (sqlglot types parse's result as the Expr base)
    tree = _bottom_up(_bottom_up(cast(exp.Expression, trees[-1]), _regr), _rewrite)
    _name_qualified_columns(tree)
    _order_by_output_names(tree)
    _placeholders(tree, dict(types))
    return tree
