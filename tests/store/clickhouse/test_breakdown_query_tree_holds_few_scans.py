"""On ClickHouse a query's cost is mostly its analysis: every reference to a CTE is analysed again
(``AS MATERIALIZED`` included), so what a view costs there grows with the number of times the
table's scan appears in its query tree once every CTE reference is expanded.  The breakdown views
read the table through chains of CTEs (kvtrace's views, each inlined by
:func:`kvtrace.store.clickhouse.statement.assemble`); these bounds keep a change to them from
multiplying that count unnoticed (docs/benchmarks.md, ``benchmarks/analysis``, has the history).

With kvtrace's materialized tables (:mod:`kvtrace.store.clickhouse.mviews`) the breakdown's scan reads
the classified rows: the raw table is then not in its tree at all (the classification, the largest
part of each expanded scan, is gone from the analysis), the small table as often as the scan was."""

from __future__ import annotations

import pytest

sqlglot = pytest.importorskip("sqlglot")
from sqlglot import exp  # noqa: E402

from kvtrace.store.clickhouse import mviews_sql  # noqa: E402
from kvtrace.store.clickhouse.statement import assemble  # noqa: E402

TABLE = "otel_traces"
# the scan's appearances in each view's expanded query tree (no more than when these bounds were set)
BOUNDS = {"session_breakdown": 32, "turn_breakdown": 46, "agent_llm_calls": 9, "trace_sessions": 3}


def _with(node: exp.Expression):
    return node.args.get("with_") or node.args.get("with")


def scans(node: exp.Expression, ctes: dict, table: str = TABLE) -> int:
    """How often ``table`` is read under ``node`` with every CTE reference expanded (in scope)."""
    w = _with(node)
    if w is not None:
        ctes = dict(ctes)
        for cte in w.expressions:  # each CTE sees the ones defined before it
            ctes[cte.alias_or_name] = (cte.this, dict(ctes))
    if isinstance(node, exp.Table) and not node.db:
        if node.name in ctes:
            body, scope = ctes[node.name]
            return scans(body, scope, table)
        return int(node.name == table)
    return sum(scans(child, ctes, table) for child in node.iter_expressions() if child is not w)


def tree_scans(view: str, shaped: bool = False, table: str = TABLE) -> int:
    text = assemble(f"SELECT * FROM {view}", (), TABLE, False, shaped=shaped)
    return scans(sqlglot.parse_one(text, read="clickhouse"), {}, table)


def test_a_plain_view_reads_the_table_once():
    assert tree_scans("spans") == 1


@pytest.mark.parametrize("view", sorted(BOUNDS))
def test_the_breakdown_views_read_the_table_no_more_often_than_their_bound(view):
    assert tree_scans(view) <= BOUNDS[view]


# the raw table's appearances with the materialized tables: the breakdown's and trace_sessions' none
SHAPED_RAW = {"session_breakdown": 0, "turn_breakdown": 0, "trace_sessions": 0, "agent_llm_calls": 4}


@pytest.mark.parametrize("view", sorted(SHAPED_RAW))
def test_with_the_materialized_tables_the_breakdown_reads_no_raw_span(view):
    assert tree_scans(view, shaped=True) == SHAPED_RAW[view]
    shaped_scan = tree_scans(view, shaped=True, table=TABLE + mviews_sql.SCAN_T)
    assert 0 < shaped_scan <= BOUNDS[view]
    assert tree_scans(view, shaped=True) + shaped_scan == tree_scans(view)  # the scan's place, no more
