"""``kvtrace query | report | dashboard --clickhouse URL [--table NAME]``: the same output as over
the Parquet directory, options from the environment, and one-line errors for every way the
ClickHouse source can fail."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("sqlglot")
pytest.importorskip("chdb")
clickhouse_check = pytest.importorskip("clickhouse_check")

from kvtrace.cli import main  # noqa: E402
from kvtrace.errors import CLIError  # noqa: E402
from kvtrace.store.clickhouse.backend import BackendError, ChdbBackend, open_backend  # noqa: E402
from kvtrace.testing.synth import sample_store  # noqa: E402

SQL = (
    "SELECT session_id, turns, round(wall_ms, 3) AS wall_ms, round(tool_wait_ms, 3) AS tool_ms "
    "FROM session_breakdown ORDER BY session_id"
)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    traces = tmp_path_factory.mktemp("cli") / "traces"
    sample_store(traces, sessions=3, turns=4)
    store = clickhouse_check.load_dir(traces)
    return traces, f"chdb:{store.backend.path}", store.table


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_query_prints_what_duckdb_prints(loaded, capsys, fmt):
    traces, url, table = loaded
    rc, on_duck, _ = run(capsys, "query", SQL, "--traces", str(traces), "--format", fmt)
    assert rc == 0 and on_duck.count("session-") == 3
    assert run(capsys, "query", SQL, "--clickhouse", url, "--table", table, "--format", fmt) == (0, on_duck, "")


def test_options_from_the_environment(loaded, capsys, monkeypatch):
    traces, url, table = loaded
    monkeypatch.setenv("KVTRACE_CLICKHOUSE", url)
    monkeypatch.setenv("KVTRACE_CLICKHOUSE_TABLE", table)
    rc, out, _ = run(capsys, "query", "SELECT count(*) AS n FROM sessions", "--format", "csv")
    assert (rc, out) == (0, "n\n3\n")


def test_report_is_the_same(loaded, capsys):
    traces, url, table = loaded
    rc, on_duck, _ = run(capsys, "report", "--traces", str(traces), "--no-plots")
    rc2, on_ch, _ = run(capsys, "report", "--clickhouse", url, "--table", table, "--no-plots")
    assert rc == rc2 == 0
    assert f"- traces: `{url} table {table}`" in on_ch
    strip = lambda text: [line for line in text.splitlines() if not line.startswith("- traces:")]  # noqa: E731
    assert strip(on_ch) == strip(on_duck) and len(strip(on_duck)) > 40


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--table", "kvtrace_check.nosuch"], "Unknown table"),
        (["--table", "nodb.nosuch"], "Database nodb does not exist"),
        (["--clickhouse", "ftp://127.0.0.1/x"], "expected http://HOST:PORT, https://HOST:PORT or chdb:PATH"),
        (["--clickhouse", "http://127.0.0.1:1"], "cannot connect to ClickHouse at http://127.0.0.1:1"),
        (["--clickhouse", "http://u:secret@127.0.0.1:1"], "cannot connect to ClickHouse at http://u:***@127.0.0.1:1"),
        (["--clickhouse", "chdb:"], "chdb: needs a database directory"),
    ],
)
def test_source_errors_are_one_line(loaded, capsys, argv, message):
    _, url, table = loaded
    args = {"--clickhouse": url, "--table": table}
    args.update(dict(zip(argv[::2], argv[1::2])))
    rc, out, err = run(capsys, "query", "SELECT 1", *[x for kv in args.items() for x in kv])
    assert rc == 2 and out == ""
    assert err.startswith("kvtrace query: error: ") and message in err and err.count("\n") == 1, err
    assert "secret" not in err


def test_sql_errors_are_one_line_without_the_statement(loaded, capsys):
    _, url, table = loaded
    rc, _, err = run(capsys, "query", "SELECT nosuch FROM spans", "--clickhouse", url, "--table", table)
    assert rc == 2 and "Unknown expression identifier `nosuch`" in err and err.count("\n") == 1
    assert "kvtrace_raw" not in err  # the statement with the views in front is not echoed
    rc, _, err = run(capsys, "query", "SELECT FROM WHERE (", "--clickhouse", url, "--table", table)
    assert rc == 2 and err.count("\n") == 1


def test_chdb_opens_one_directory_per_process(loaded, tmp_path):
    _, url, _ = loaded
    assert isinstance(open_backend(url), ChdbBackend)
    with pytest.raises(BackendError, match="chDB is already open on .* in this process"):
        open_backend(f"chdb:{tmp_path}")


def test_dashboard_passes_the_source_on(loaded, tmp_path):
    from kvtrace.cli import dashboard as cli
    from kvtrace.dashboards.launch import command

    _, url, table = loaded
    cmd = command("ignored", clickhouse=(url, table))
    assert cmd[cmd.index("--clickhouse") + 1] == url and cmd[cmd.index("--table") + 1] == table
    args = argparse.Namespace(
        traces=None, clickhouse=f"chdb:{tmp_path / 'missing'}", table=None, compare=None, port=8501, host="127.0.0.1"
    )
    with pytest.raises(CLIError, match="no such chDB database directory"):
        cli.run(args)


def test_whatif_is_the_same(tmp_path, capsys):
    """The what-if replay reads the same inputs from ClickHouse (hashed ids wrap to BIGINT there,
    booleans come back as UInt8): every row and the recommendation equal DuckDB's, on a store whose
    two Ds ran different TTLs."""
    from test_whatif_replay import build

    build(tmp_path / "traces", b_ttl=10.0)
    store = clickhouse_check.load_dir(tmp_path / "traces")
    argv = ["whatif", "--ttl", "15,60,480", "--threshold", "32,64,256", "--format", "json"]
    rc, on_duck, advice = run(capsys, *argv, "--traces", str(tmp_path / "traces"))
    assert rc == 0 and on_duck.count('"recorded": true') == 1 and "Recommendation:" in advice
    on_ch = run(capsys, *argv, "--clickhouse", f"chdb:{store.backend.path}", "--table", store.table)
    assert on_ch == (0, on_duck, advice)
