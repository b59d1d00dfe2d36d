"""kvtrace's DuckDB SQL on ClickHouse: each rewrite of :mod:`kvtrace.store.clickhouse.dialect` gives
the value DuckDB gives (the same statement run by both engines), and numbers are spelled the way
the Collector's exporter spells them (:func:`kvtrace.store.clickhouse.load.go_float`)."""

from __future__ import annotations

import math

import duckdb
import pytest

pytest.importorskip("sqlglot")
pytest.importorskip("chdb")
clickhouse_check = pytest.importorskip("support.clickhouse_check")

from kvtrace import semconv as sc  # noqa: E402
from kvtrace.store.clickhouse import load  # noqa: E402
from kvtrace.store.clickhouse.dialect import TranspileError, param_types, to_clickhouse  # noqa: E402
from kvtrace.store.sql import literal  # noqa: E402

# a small relation both engines can build from the same DuckDB SQL (x, y numbers; k a string)
ROWS = (
    "SELECT * FROM (VALUES (1, 2.0, 'a'), (2, 4.5, 'b'), (3, 5.0, 'a'), (4, 9.5, 'c'), (10, 20.0, 'b')) AS t(x, y, k)"
)


@pytest.fixture(scope="module")
def backend():
    return clickhouse_check.chdb_backend()


def both(backend, sql: str, params: dict | None = None) -> tuple[list, list]:
    duck = duckdb.connect()
    duck.execute("SET TimeZone = 'UTC'")
    expected = [list(r) for r in duck.execute(sql, params or {}).fetchall()]
    got = backend.query(to_clickhouse(sql, param_types(params)), params).to_pylist()
    return [list(r.values()) for r in got], expected


def close(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    if isinstance(a, list):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize(
    "expr",
    [
        "median(y)",
        "quantile_cont(y, 0.9)",
        "quantile_cont(x, 0.25)",
        "regr_slope(y, x)",
        "regr_intercept(y, x)",
        "bool_or(x > 3)",
        "bool_or(x > 30)",
        "list(DISTINCT k ORDER BY k)",
        "sum(x) FILTER (WHERE k = 'a')",
        "min(y) FILTER (WHERE k = 'zzz')",
        "count(*) FILTER (WHERE k = 'zzz')",
        "count(DISTINCT k)",
        "arg_min(k, y)",
        "max(x) // 3",
    ],
)
def test_aggregates_agree(backend, expr):
    got, expected = both(backend, f"SELECT {expr} AS v FROM ({ROWS})")
    assert close(got, expected), (got, expected)


def test_integer_division_keeps_every_digit_of_epoch_ns(backend):
    got, expected = both(backend, "SELECT 1767225600123456789 // 1000 AS us, 1767225600123456789 // 7 AS q")
    assert got == expected == [[1767225600123456, 252460800017636684]]


def test_times(backend):
    """ns values exact; µs timestamps within 1 µs: DuckDB rounds a TIMESTAMP_NS to µs, ClickHouse
    truncates (the tolerance of the view equivalence test)."""
    sql = (
        "SELECT epoch_ns(ts) AS ns, epoch_ns(CAST(ts AS TIMESTAMPTZ)) AS us_precision, "
        "epoch_ns(make_timestamp(epoch_ns(ts) // 1000)::TIMESTAMPTZ) AS rebuilt, "
        "epoch_ns(CAST(ts AS TIMESTAMPTZ) + to_microseconds(2500)) AS plus "
        "FROM (SELECT make_timestamp_ns(1767225600123456789) AS ts)"
    )
    duck = duckdb.connect()
    duck.execute("SET TimeZone = 'UTC'")
    expected = duck.execute(sql).fetchall()[0]
    assert expected == (1767225600123456789, 1767225600123457000, 1767225600123456000, 1767225600125957000)
    ch = backend.query(
        to_clickhouse(
            sql.replace("make_timestamp_ns(1767225600123456789)", "fromUnixTimestamp64Nano(1767225600123456789)")
        )
    ).to_pylist()[0]
    assert (ch["ns"], ch["rebuilt"]) == (expected[0], expected[2])
    assert (ch["us_precision"], ch["plus"]) == (1767225600123456000, 1767225600125956000)  # truncated, 1 µs off


def test_attribute_maps_read_like_duckdb(backend):
    """Absent keys are NULL (not ''), numbers come from the strings the exporter writes."""
    attrs = {sc.SESSION_ID: "s1", sc.KV_PULLED_TOKENS: "640", sc.REQUEST_TTFT_MS: "12.5", sc.TURN_INDEX: "3"}
    pairs = ", ".join(f"{literal(k)}, {literal(v)}" for k, v in attrs.items())
    sql = (
        f"SELECT SpanAttributes[{literal(sc.SESSION_ID)}] AS s, "
        f"SpanAttributes[{literal(sc.GEN_AI_REQUEST_ID)}] AS absent, "
        f"SpanAttributesInt[{literal(sc.KV_PULLED_TOKENS)}] AS i, "
        f"SpanAttributesInt[{literal(sc.REQUEST_TTFT_MS)}] AS not_int, "
        f"SpanAttributesFloat[{literal(sc.REQUEST_TTFT_MS)}] AS f, "
        f"SpanAttributesFloat[{literal(sc.TURN_INDEX)}] AS int_as_float, "
        f"SpanAttributesInt[{literal(sc.GEN_AI_REQUEST_ID)}] AS absent_int "
        f"FROM attrs"
    )
    ch_sql = to_clickhouse(sql).replace("FROM attrs", f"FROM (SELECT map({pairs}) AS SpanAttributes)")
    got = backend.query(ch_sql).to_pylist()[0]
    assert got == {
        "s": "s1",
        "absent": None,
        "i": 640,
        "not_int": None,
        "f": 12.5,
        "int_as_float": 3.0,
        "absent_int": None,
    }


@pytest.mark.parametrize(
    "value,kind", [(5, "Int64"), (2.5, "Float64"), ("it's", "String"), (True, "Bool"), (None, "Nullable(String)")]
)
def test_parameters_are_bound_typed(backend, value, kind):
    assert param_types({"p": value}) == (("p", kind),)
    sql = "SELECT $p AS v"
    assert to_clickhouse(sql, param_types({"p": value})) == f"SELECT {{p: {kind}}} AS v"
    assert backend.query(to_clickhouse(sql, param_types({"p": value})), {"p": value}).to_pylist() == [{"v": value}]


def test_qualified_columns_keep_duckdbs_names():
    assert to_clickhouse("SELECT t.a, t.b AS c, t.* FROM t") == "SELECT t.a AS a, t.b AS c, t.* FROM t"


def test_errors_are_one_line():
    with pytest.raises(TranspileError, match="no value bound for parameter \\$x"):
        to_clickhouse("SELECT $x")
    with pytest.raises(TranspileError) as err:
        to_clickhouse("SELECT FROM WHERE (")
    assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="cannot bind a list"):
        param_types({"p": [1]})


@pytest.mark.parametrize(
    "value,spelled",
    [
        (3.0, "3"),
        (0.25, "0.25"),
        (123.0, "123"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (2.5e-10, "2.5e-10"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e300, "1.5e+300"),
        (-42.125, "-42.125"),
        (-0.0, "-0"),
        (5e-324, "5e-324"),
        (math.nan, "json: unsupported value: NaN"),
        (math.inf, "json: unsupported value: +Inf"),
        (-math.inf, "json: unsupported value: -Inf"),
    ],
)
def test_go_float_spelling(value, spelled):
    assert load.go_float(value) == spelled


@pytest.mark.parametrize(
    "text,spelled",
    [
        ("1.0", "1"),
        ("1e-07", "1e-7"),
        ("0.5", "0.5"),
        ("42", "42"),
        ("v1.0", "v1.0"),
        ("0.1.0", "0.1.0"),
        ("1.50", "1.50"),
        ("", ""),
    ],
)
def test_resource_values_respelled_only_when_python_spelled_a_float(text, spelled):
    assert load._respelled(text) == spelled


def test_order_by_means_the_output_column(backend):
    """DuckDB sorts by the output ``x`` (min per group) although an input column is named ``x``."""
    got, expected = both(backend, f"SELECT k, min(y) AS y FROM ({ROWS}) GROUP BY k ORDER BY y DESC")
    assert got == expected == [["c", 9.5], ["b", 4.5], ["a", 2.0]]


def test_a_case_branch_not_taken_never_divides_by_zero(backend):
    sql = f"SELECT x, CASE WHEN $b <= 0 THEN x ELSE x // $b END AS v FROM ({ROWS}) ORDER BY x"
    for b in (0, 3):
        got, expected = both(backend, sql, {"b": b})
        assert got == expected and [r[1] for r in got] == ([1, 2, 3, 4, 10] if b == 0 else [0, 0, 1, 1, 3])


def test_filtered_distinct_lists(backend):
    sql = f"SELECT list(DISTINCT k) FILTER (WHERE x > 1) AS v, list(DISTINCT k ORDER BY k) AS w FROM ({ROWS})"
    got, expected = both(backend, sql)
    assert sorted(got[0][0]) == sorted(expected[0][0]) == ["a", "b", "c"] and got[0][1] == expected[0][1]


def test_unnest_of_a_range_lists_each_value_once_per_row_end_excluded(backend):
    """The breakdown's time join lists each interval once per 1 s bucket it covers: DuckDB's
    end-exclusive ``range`` in an ``unnest`` gives the same rows as ClickHouse's ``arrayJoin(range)``,
    an empty range none (epoch ns: non-negative; ``//`` of negatives differs)."""
    sql = (
        "SELECT x, unnest(range(x // 3, (x + 4) // 3)) AS b FROM (VALUES (1), (5), (0)) AS t(x) "
        "UNION ALL SELECT x, unnest(range(x, x)) FROM (VALUES (7)) AS t(x) ORDER BY x, b"
    )
    got, expected = both(backend, sql)
    assert got == expected == [[0, 0], [1, 0], [5, 1], [5, 2]]
