"""``kvtrace query --read-only`` runs only queries and reads no file outside the trace
directory: reading or writing elsewhere fails with a one-line error while the views answer."""

from __future__ import annotations

import os
import shutil

import duckdb
import pytest

from kvtrace.cli import main
from kvtrace.store import connect
from kvtrace.store.reader import refresh
from kvtrace.testing.synth import sample_store

REFUSED = "kvtrace query: error: read-only: only queries (SELECT, EXPLAIN) may run, not {}\n"
COUNT = "SELECT count(*) AS n, count(DISTINCT session_id) AS s FROM spans"


@pytest.fixture
def run(tmp_path):
    root = tmp_path / "run"
    sample_store(root, sessions=2, turns=3)
    return root


def _query(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["query", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_without_read_only_a_query_reads_any_file(run, tmp_path, capsys):
    secret = tmp_path / "secret.csv"
    secret.write_text("word\nhunter2\n")
    rc, out, _ = _query(capsys, f"SELECT word FROM read_csv('{secret}')", "--traces", str(run), "--format", "csv")
    assert (rc, out) == (0, "word\nhunter2\n")


@pytest.mark.parametrize("path", ["/etc/hostname", "secret.csv"])
def test_read_only_refuses_to_read_a_file_outside_in_one_line(run, tmp_path, capsys, path):
    (tmp_path / "secret.csv").write_text("word\nhunter2\n")
    target = path if os.path.isabs(path) else str(tmp_path / path)
    if not os.path.exists(target):
        pytest.skip(f"{target} does not exist here")
    rc, out, err = _query(capsys, f"SELECT * FROM read_csv('{target}')", "--traces", str(run), "--read-only")
    assert (rc, out) == (2, "")
    assert err == (
        f'kvtrace query: error: Permission Error: Cannot access file "{target}" - file system operations '
        "are disabled by configuration\n"
    )


def test_read_only_refuses_copy_and_writes_nothing(run, tmp_path, capsys):
    for target in (tmp_path / "x.csv", run / "x.parquet"):  # outside, and inside the trace directory
        rc, out, err = _query(capsys, f"COPY (SELECT * FROM spans) TO '{target}'", "--traces", str(run), "--read-only")
        assert (rc, out, err) == (2, "", REFUSED.format("COPY"))
        assert not target.exists()


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("SET enable_external_access = true", "SET"),
        (f"ATTACH '{os.devnull}' AS x", "ATTACH"),
        ("CREATE TABLE t AS SELECT 1", "CREATE"),
        (f"{COUNT}; COPY (SELECT 1) TO 'x.csv'", "COPY"),
    ],
)
def test_read_only_runs_only_queries(run, capsys, sql, kind):
    rc, out, err = _query(capsys, sql, "--traces", str(run), "--read-only")
    assert (rc, out, err) == (2, "", REFUSED.format(kind))


def test_the_views_answer_under_read_only(run, capsys):
    plain = _query(capsys, COUNT, "--traces", str(run), "--format", "json")
    locked = _query(capsys, COUNT, "--traces", str(run), "--format", "json", "--read-only")
    assert locked == plain
    assert plain[0] == 0 and '"s": 2' in plain[1]


def test_read_only_needs_a_trace_directory(capsys):
    rc, out, err = _query(capsys, COUNT, "--clickhouse", "chdb:/nonexistent-kvtrace-chdb", "--read-only")
    assert (rc, out) == (2, "")
    assert err == (
        "kvtrace query: error: --read-only confines DuckDB to a trace directory (--traces); on ClickHouse use a "
        "user with readonly = 1 instead\n"
    )


def test_a_locked_connection_reads_only_below_its_directory_and_stays_locked(tmp_path):
    run = tmp_path / "run"
    sample_store(run, sessions=1, turns=2)
    sibling = tmp_path / "run2"  # shares the name prefix: must not pass as "below run"
    sample_store(sibling, sessions=1, turns=2)
    con = connect(run, read_only=True)
    (n,) = con.execute("SELECT count(*) FROM spans").fetchone()
    assert con.execute("SELECT count(*) FROM read_parquet($p)", {"p": f"{run}/**/*.parquet"}).fetchone() == (n,)
    refused = [
        ("SELECT count(*) FROM read_parquet($p)", {"p": f"{sibling}/**/*.parquet"}),
        ("SELECT * FROM read_text($p)", {"p": f"{run}/../run2"}),
        (f"COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'", None),
        ("SELECT * FROM read_parquet('https://127.0.0.1:9/x.parquet')", None),
    ]
    for sql, params in refused:
        with pytest.raises(duckdb.PermissionException, match="disabled by configuration"):
            con.execute(sql, params)
    with pytest.raises(duckdb.InvalidInputException, match="configuration has been locked"):
        con.execute("SET enable_external_access = true")
    assert not (tmp_path / "out.csv").exists()
    # new files below the directory are still seen after a refresh (the dashboard's Refresh button)
    (first,) = [os.path.join(d, f) for d, _, names in os.walk(run) for f in names if f.endswith(".parquet")]
    shutil.copy(first, os.path.join(os.path.dirname(first), "later-b00000001.parquet"))
    refresh(con)
    assert con.execute("SELECT count(*) FROM spans").fetchone() == (2 * n,)
