"""On ClickHouse a query's cost is mostly its analysis: every reference to a CTE is analysed again
(``AS MATERIALIZED`` included), so what a view costs there grows with the number of times the
table's scan appears in its query tree once every CTE reference is expanded.  The breakdown views
read the table through chains of CTEs (kvtrace's views, each inlined by
:func:`kvtrace.store.clickhouse.store.assemble`); these bounds keep a change to them from
multiplying that count unnoticed (docs/benchmarks.md, ``benchmarks/analysis``, has the history)."""

from __future__ import annotations

import pytest

sqlglot = pytest.importorskip("sqlglot")
from sqlglot import exp  # noqa: E402

from kvtrace.store.clickhouse.store import assemble  # noqa: E402

TABLE = "otel_traces"
# the scan's appearances in each view's expanded query tree (no more than when these bounds were set)
BOUNDS = {"session_breakdown": 32, "turn_breakdown": 46, "agent_llm_calls": 9, "trace_sessions": 3}


def _with(node: exp.Expression):
    return node.args.get("with_") or node.args.get("with")


def scans(node: exp.Expression, ctes: dict) -> int:
    """How often ``TABLE`` is read under ``node`` with every CTE reference expanded (in scope)."""
    w = _with(node)
    if w is not None:
        ctes = dict(ctes)
        for cte in w.expressions:  # each CTE sees the ones defined before it
            ctes[cte.alias_or_name] = (cte.this, dict(ctes))
    if isinstance(node, exp.Table) and not node.db:
        if node.name in ctes:
            body, scope = ctes[node.name]
            return scans(body, scope)
        return int(node.name == TABLE)
    return sum(scans(child, ctes) for child in node.iter_expressions() if child is not w)


def tree_scans(view: str) -> int:
    text = assemble(f"SELECT * FROM {view}", (), TABLE, False)
    return scans(sqlglot.parse_one(text, read="clickhouse"), {})


def test_a_plain_view_reads_the_table_once():
    assert tree_scans("spans") == 1


@pytest.mark.parametrize("view", sorted(BOUNDS))
def test_the_breakdown_views_read_the_table_no_more_often_than_their_bound(view):
    assert tree_scans(view) <= BOUNDS[view]
