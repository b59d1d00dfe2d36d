"""Staged queries on ClickHouse (:mod:`kvtrace.store.clickhouse.staged`): the breakdown's statement,
which holds the scan 32 times once every CTE is expanded, runs as temporary tables made once each and
a statement over them, in which no CTE reading stored data is held more than once (#40, item 3);
the rows are the single statement's, on the raw table and with the materialized tables; the tables
are gone after the query; where one cannot be made, the single statement answers."""

from __future__ import annotations

import math

import pytest

sqlglot = pytest.importorskip("sqlglot")
pytest.importorskip("chdb")
clickhouse_check = pytest.importorskip("support.clickhouse_check")

from sqlglot import exp  # noqa: E402

from kvtrace.store.clickhouse import mviews  # noqa: E402
from kvtrace.store.clickhouse.staged import TEMP_PREFIX, Staged, most_expanded, stage, strict_in  # noqa: E402
from kvtrace.store.clickhouse.statement import INLINE, assemble  # noqa: E402

from support import multiday  # noqa: E402

BREAKDOWN_VIEWS = ("session_breakdown", "turn_breakdown", "agent_llm_calls", "trace_sessions")
PLAIN_VIEWS = ("spans", "kv_decisions")


def _text(view: str, shaped: bool, table: str = "otel_traces") -> str:
    return assemble(f"SELECT * FROM {view}", (), table, False, shaped=shaped)


@pytest.mark.parametrize("shaped", [False, True], ids=["raw", "shaped"])
@pytest.mark.parametrize("view", BREAKDOWN_VIEWS)
def test_no_statement_holds_a_data_cte_twice(view, shaped):
    text = _text(view, shaped)
    before, _ = most_expanded(text)
    plan = stage(text)
    assert before > 1 and plan is not None
    assert all(name.startswith(TEMP_PREFIX) for name, _ in plan.temps)
    assert len({name for name, _ in plan.temps}) == len(plan.temps)
    for name, select in plan.temps:
        assert most_expanded(select)[0] <= 1, name
        assert _unread_ctes(select) == set(), name  # a stage carries only what it reads
    assert most_expanded(plan.main)[0] <= 1
    assert _unread_ctes(plan.main) == set()


def _unread_ctes(sql: str) -> set[str]:
    tree = sqlglot.parse_one(sql, read="clickhouse")
    read = {t.name for t in tree.find_all(exp.Table)}
    return {c.alias_or_name for c in tree.find_all(exp.CTE)} - read


@pytest.mark.parametrize("view", PLAIN_VIEWS)
def test_a_view_without_repeated_ctes_stays_one_statement(view):
    text = _text(view, False)
    assert most_expanded(text)[0] == 1 and stage(text) is None


def test_the_breakdowns_temporary_tables_are_its_shared_joins():
    plan = stage(_text("session_breakdown", True))
    assert plan is not None
    assert [n.removeprefix(TEMP_PREFIX) for n, _ in plan.temps][:4] == ["b0", "bt", "bx", "pr"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    traces = multiday.build(tmp_path_factory.mktemp("staged"), days=1)  # every convention: the joins have rows
    raw = clickhouse_check.load_dir(traces)
    shaped = clickhouse_check.load_dir(traces, raw.backend)
    mviews.init(shaped.backend, shaped.table)
    return {"raw": raw, "shaped": shaped}


def _temporary_tables(backend) -> list[str]:
    rows = backend.query("SELECT name FROM system.tables WHERE is_temporary").to_pylist()
    return sorted(r["name"] for r in rows)


def _rows(table) -> list[tuple]:
    """The rows in a canonical order (by their cells other than floats, which a sum's order may move)."""
    rows = [tuple(r.values()) for r in table.to_pylist()]
    return sorted(rows, key=lambda r: tuple(repr(v) for v in r if not isinstance(v, float)))


def _same(a, b) -> bool:
    ra, rb = _rows(a), _rows(b)
    return len(ra) == len(rb) and all(
        len(x) == len(y)
        and all(
            math.isclose(u, v, rel_tol=1e-12) if isinstance(u, float) and isinstance(v, float) else u == v
            for u, v in zip(x, y, strict=True)
        )
        for x, y in zip(ra, rb, strict=True)
    )


@pytest.mark.parametrize("kind", ["raw", "shaped"])
@pytest.mark.parametrize("view", BREAKDOWN_VIEWS)
def test_staged_rows_are_the_single_statements(stores, kind, view):
    store = stores[kind]
    text = _text(view, kind == "shaped", store.table)
    plan = stage(text)
    assert plan is not None
    whole = store.backend.query(text)
    fallbacks = store.backend.fallbacks
    staged = store.backend.query_staged(plan, text)
    assert store.backend.fallbacks == fallbacks  # made, not the single statement again
    assert whole.num_rows > 0 and whole.schema.names == staged.schema.names
    assert _same(staged, whole)
    assert _temporary_tables(store.backend) == []


def test_a_table_that_cannot_be_made_leaves_the_single_statement(stores):
    store = stores["shaped"]
    text = _text("session_breakdown", True, store.table)
    plan = stage(text)
    assert plan is not None
    taken = plan.temps[1][0]  # the second table's name is taken: the first is made, then dropped
    store.backend.command(f"CREATE TEMPORARY TABLE {taken} (x Int8) ENGINE = Memory")
    try:
        fallbacks = store.backend.fallbacks
        assert _same(store.backend.query_staged(plan, text), store.backend.query(text))
        assert store.backend.fallbacks == fallbacks + 1
        assert _temporary_tables(store.backend) == [taken]  # not ours to drop
    finally:
        store.backend.command(f"DROP TEMPORARY TABLE {taken}")


def test_a_statement_that_fails_over_its_tables_leaves_the_single_statement(stores):
    """As when a balancer sends the statement to a replica without the session's tables."""
    store = stores["raw"]
    text = _text("session_breakdown", False, store.table)
    plan = stage(text)
    assert plan is not None
    broken = Staged(plan.temps, plan.main.replace(plan.temps[-1][0], "kvtrace_stage_missing"))
    fallbacks = store.backend.fallbacks
    assert _same(store.backend.query_staged(broken, text), store.backend.query(text))
    assert store.backend.fallbacks == fallbacks + 1 and _temporary_tables(store.backend) == []


# the KV reuse page's questions: their views read ``spans`` several times, which staging alone would copy whole
REUSE_QUESTIONS = {
    "summary": "SELECT count(*) AS n, sum(d.pulled_tokens) AS pulled, sum(x.tokens) AS moved FROM kv_decisions d "
    "LEFT JOIN kv_transfers x ON x.request_id = d.request_id AND x.engine_id = d.engine_id",
    "offer_mix": "SELECT offer_reason, count(*) AS n FROM requests GROUP BY offer_reason",
}


@pytest.mark.parametrize("question", REUSE_QUESTIONS)
def test_the_span_relations_are_never_made_stage_tables(stores, question):
    """A stage of ``spans`` would copy every span with every derived column; expanded at each reference,
    each read takes only the columns and granules it needs (docs/benchmarks.md)."""
    store = stores["raw"]
    text = assemble(REUSE_QUESTIONS[question], (), store.table, False)
    everything = stage(text)
    assert everything is not None and TEMP_PREFIX + "spans" in [n for n, _ in everything.temps]
    plan = stage(text, INLINE)
    made = [] if plan is None else [n.removeprefix(TEMP_PREFIX) for n, _ in plan.temps]
    assert not set(made) & INLINE
    assert _same(store.query(REUSE_QUESTIONS[question]), store.backend.query(text))


def test_the_store_runs_the_breakdown_staged(stores):
    store = stores["shaped"]
    seen = []
    backend = store.backend
    real = backend.query_staged

    def spy(plan, sql, params=None):
        seen.append([n for n, _ in plan.temps])
        return real(plan, sql, params)

    backend.query_staged = spy
    fallbacks = backend.fallbacks
    try:
        rows = store.query("SELECT session_id FROM session_breakdown").to_pylist()
        n = store.query("SELECT count(DISTINCT session_id) AS n FROM session_breakdown").to_pylist()[0]["n"]
    finally:
        del backend.query_staged
    assert len(rows) == n > 0 and len(seen) == 2 and all(TEMP_PREFIX + "b0" in s for s in seen)
    assert backend.fallbacks == fallbacks


# ------------------------------------------------------------------ strict stages made empty

X, Y = TEMP_PREFIX + "x", TEMP_PREFIX + "y"
UNPROVED = {  # strict in these too, which the analysis does not prove (sound, not complete)
    f"SELECT y.a FROM {X} AS x RIGHT JOIN {Y} AS y ON x.a = y.a": Y,
    f"SELECT a, count() AS n FROM {X} GROUP BY a WITH TOTALS": X,  # (the totals row is not a result row)
}
STRICTNESS = [  # (select, the tables it is strict in)
    (f"SELECT a FROM {X}", {X}),
    (f"SELECT a FROM {X} WHERE a > 0 ORDER BY a LIMIT 3", {X}),
    (f"SELECT x.a FROM {X} AS x LEFT JOIN {Y} AS y ON x.a = y.a", {X}),
    (f"SELECT x.a FROM {X} AS x JOIN {Y} AS y ON x.a = y.a", {X, Y}),
    (f"SELECT x.a FROM {X} AS x, {Y} AS y", {X, Y}),
    (f"SELECT y.a FROM {X} AS x RIGHT JOIN {Y} AS y ON x.a = y.a", set()),
    (f"SELECT x.a FROM {X} AS x FULL JOIN {Y} AS y ON x.a = y.a", set()),
    (f"SELECT count() AS n FROM {X}", set()),
    (f"SELECT uniqExact(a) AS n FROM {X}", set()),
    (f"SELECT sumIf(a, a > 0) AS n FROM {X}", set()),
    (f"SELECT a, count() AS n FROM {X} GROUP BY a", {X}),
    (f"SELECT a, count() AS n FROM {X} GROUP BY a WITH TOTALS", set()),
    (f"SELECT a, max(a) OVER () AS m FROM {X}", {X}),
    (f"SELECT a, ROW_NUMBER() OVER (ORDER BY a) AS n FROM {X}", {X}),
    (f"SELECT sum(count()) OVER () AS m FROM {X}", set()),
    (f"SELECT a FROM {X} UNION ALL SELECT a FROM {Y}", set()),
    (f"SELECT a FROM {X} UNION ALL SELECT x.a FROM {X} AS x JOIN {Y} AS y ON x.a = y.a", {X}),
    (f"WITH c AS (SELECT a FROM {X}) SELECT * FROM (SELECT a FROM c) AS s", {X}),
    (f"SELECT a FROM {X} WHERE a NOT IN (SELECT a FROM {Y})", {X}),
    (f"SELECT a FROM {X} ORDER BY a WITH FILL FROM 0 TO 3", set()),
    (f"SELECT 1 AS a FROM {X} ORDER BY count()", set()),
    ("SELECT 1 AS a", set()),
    ("SELECT number AS a FROM numbers(3)", set()),
]


@pytest.mark.parametrize(("select", "expected"), STRICTNESS, ids=[s for s, _ in STRICTNESS])
def test_a_stage_is_strict_in_the_tables_that_empty_it(stores, select, expected):
    """The analysis (what :func:`strict_in` returns) and chDB agree: each table it names, empty with
    the other holding a row, leaves no row; each it does not name leaves one (but :data:`UNPROVED`)."""
    tables, _ = strict_in(select)
    assert tables == expected
    backend = stores["raw"].backend
    for empty in (X, Y):
        backend.command(f"CREATE TEMPORARY TABLE {X} (a Int64) ENGINE = Memory")
        backend.command(f"CREATE TEMPORARY TABLE {Y} (a Int64) ENGINE = Memory")
        try:
            full = X if empty == Y else Y
            backend.command(f"INSERT INTO {full} VALUES (1)")
            rows = backend.query(select).num_rows
        finally:
            backend.command(f"DROP TEMPORARY TABLE {X}")
            backend.command(f"DROP TEMPORARY TABLE {Y}")
        assert (rows == 0) == (empty in tables or UNPROVED.get(select) == empty), (empty, rows)


def test_the_functions_a_strict_stage_calls_are_returned_for_the_backend_to_check(stores):
    tables, assumed = strict_in(f"SELECT kvtraceNoSuchFn(a) AS b, COALESCE(a, 0) AS c FROM {X}")
    assert tables == {X} and assumed == {"kvtraceNoSuchFn", "COALESCE"}
    backend = stores["raw"].backend
    names = (
        "groupArray",
        "GROUPARRAY",
        "uniqExactIf",
        "sumArrayIf",
        "COALESCE",
        "intDivOrNull",
        "If",
        "kvtraceNoSuchFn",
    )
    assert [backend._is_aggregate(n) for n in names] == [True, True, True, True, False, False, False, False]
    assert strict_in(f"SELECT kvtraceNoSuchFn(a) AS b FROM {X} LEFT JOIN {Y} ON 1 RIGHT JOIN {Y} ON 1") == (
        frozenset(),
        frozenset(),
    )


def test_the_breakdowns_other_convention_stages_are_strict_in_their_inputs():
    plan = stage(_text("session_breakdown", True))
    assert plan is not None
    strict = {
        n.removeprefix(TEMP_PREFIX): {t.removeprefix(TEMP_PREFIX) for t in s}
        for (n, _), s in zip(plan.temps, plan.strict, strict=True)
    }
    assert strict == {"b0": set(), "bt": {"b0"}, "bx": {"bt"}, "pr": {"bx"}, "base": {"b0"}, "w": {"base"}}


@pytest.fixture(scope="module")
def native(stores, tmp_path_factory):
    """A store of kvtrace's own agents only: the other conventions' joins are empty."""
    from kvtrace.testing.stores import sample_store

    root = tmp_path_factory.mktemp("native")
    sample_store(root, sessions=2, turns=2)
    return clickhouse_check.load_dir(root, stores["raw"].backend)


@pytest.mark.parametrize("view", BREAKDOWN_VIEWS)
def test_empty_stages_are_made_from_their_columns_with_the_same_rows(native, view):
    """The first run makes every table (and keeps the columns of those that could be empty); the next
    makes the ones strict in an empty table from those columns: the rows are the single statement's."""
    from kvtrace.store.clickhouse.backend import ChdbBackend

    ChdbBackend._columns.clear()
    backend, text = native.backend, _text(view, False, native.table)
    plan = stage(text)
    assert plan is not None
    whole = backend.query(text)
    before, fallbacks = backend.elided, backend.fallbacks
    first = backend.query_staged(plan, text)
    assert backend.elided == before
    second = backend.query_staged(plan, text)
    expected = {"session_breakdown": 2, "turn_breakdown": 2, "agent_llm_calls": 2, "trace_sessions": 1}[view]
    assert backend.elided - before == expected and backend.fallbacks == fallbacks
    assert (whole.num_rows > 0) == (view != "trace_sessions")  # (other conventions' traces: none here)
    assert _same(first, whole) and _same(second, whole) and second.schema == first.schema
    assert _temporary_tables(backend) == []


def test_a_stage_assuming_an_aggregate_is_not_made_empty(native):
    import dataclasses

    backend, text = native.backend, _text("session_breakdown", False, native.table)
    plan = stage(text)
    assert plan is not None
    backend.query_staged(plan, text)  # its columns are known
    aggregate = dataclasses.replace(plan, assumed=tuple(frozenset({"groupArray"}) for _ in plan.temps))
    before = backend.elided
    assert _same(backend.query_staged(aggregate, text), backend.query(text))
    assert backend.elided == before


def test_stale_columns_leave_the_single_statements_rows(native):
    from kvtrace.store.clickhouse.backend import ChdbBackend

    backend, text = native.backend, _text("session_breakdown", False, native.table)
    plan = stage(text)
    assert plan is not None
    backend.query_staged(plan, text)
    for (_, select), strict in zip(plan.temps, plan.strict, strict=True):
        if strict:
            ChdbBackend._columns[select] = "`nothing` Int8"  # as if the table had changed since
    before, fallbacks = backend.elided, backend.fallbacks
    try:
        assert _same(backend.query_staged(plan, text), backend.query(text))
    finally:
        ChdbBackend._columns.clear()
    assert backend.elided > before and backend.fallbacks == fallbacks + 1
    assert _temporary_tables(backend) == []


def test_statements_over_small_stage_tables_run_without_plan_optimizations(native, monkeypatch):
    """Every statement that reads stage tables only, all of them small, carries the setting; the one
    reading stored data does not, and nothing does once a table passes ``small_rows``."""
    backend, text = native.backend, _text("session_breakdown", False, native.table)
    plan = stage(text)
    assert plan is not None and plan.local == (False, True, True, True, True, True, True)
    seen: list[str] = []
    real = type(backend)._run

    def spy(self, sql, params):
        if not sql.startswith(("DROP", "DESCRIBE")):
            seen.append(sql)
        return real(self, sql, params)

    monkeypatch.setattr(type(backend), "_run", spy)
    backend.query_staged(plan, text)
    plain = ["query_plan_enable_optimizations = 0" in sql for sql in seen[-7:]]
    assert plain == [False, True, True, True, True, True, True], seen
    monkeypatch.setattr(backend, "small_rows", -1)
    seen.clear()
    backend.query_staged(plan, text)
    assert not any("query_plan_enable_optimizations" in sql for sql in seen)


@pytest.mark.parametrize("view", BREAKDOWN_VIEWS)
def test_the_rows_are_the_same_with_plan_optimizations_and_without(stores, view, monkeypatch):
    store = stores["shaped"]
    text = _text(view, True, store.table)
    plan = stage(text)
    assert plan is not None
    fallbacks = store.backend.fallbacks
    plain = store.backend.query_staged(plan, text)
    monkeypatch.setattr(store.backend, "small_rows", -1)
    optimised = store.backend.query_staged(plan, text)
    assert plain.num_rows > 0 and _same(plain, optimised) and plain.schema == optimised.schema
    assert store.backend.fallbacks == fallbacks
