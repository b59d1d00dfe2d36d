"""A valid Parquet file whose schema is not kvtrace's, in a trace directory, is skipped with a
warning naming it and why; ``kvtrace query``, ``report`` and ``whatif`` answer from the rest."""

from __future__ import annotations

import json
import logging
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvtrace.cli import main
from kvtrace.store import connect
from kvtrace.store.schema import SCHEMA
from kvtrace.testing.synth import sample_store

FOREIGN = {
    "other.parquet": "schema is not kvtrace's: no column Timestamp, TraceId, SpanId and 21 more",
    "typed.parquet": "schema is not kvtrace's: column SpanAttributes is string, not map<string, string>",
    "lists.parquet": "schema is not kvtrace's: column Events.Name is list<integer>, not list<string>",
}


def _kvtrace_like(**replaced) -> pa.Table:
    """Two rows with every kvtrace column, some replaced by columns of another type."""
    columns = {f.name: pa.nulls(2, f.type) if f.name not in replaced else replaced[f.name] for f in SCHEMA}
    return pa.table(columns)


@pytest.fixture
def mixed(tmp_path):
    """One run of synthetic spans plus the three foreign files in its partition directory."""
    root = tmp_path / "run"
    sample_store(root, sessions=2, turns=3)
    part = next(p for p, _, names in os.walk(root) if any(n.endswith(".parquet") for n in names))
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), os.path.join(part, "other.parquet"))
    pq.write_table(_kvtrace_like(SpanAttributes=pa.array(["{}", "{}"])), os.path.join(part, "typed.parquet"))
    pq.write_table(_kvtrace_like(**{"Events.Name": pa.array([[1], [2]])}), os.path.join(part, "lists.parquet"))
    clean = tmp_path / "clean"
    sample_store(clean, sessions=2, turns=3)
    return root, clean


def _warnings(caplog) -> dict[str, str]:
    return {
        os.path.basename(r.args[0]): r.args[1]
        for r in caplog.records
        if r.name == "kvtrace.store.reader" and r.levelno == logging.WARNING
    }


def test_the_store_skips_each_foreign_file_naming_it_and_why(mixed, caplog):
    root, clean = mixed
    with caplog.at_level(logging.WARNING, logger="kvtrace.store.reader"):
        con = connect(root)
    assert _warnings(caplog) == FOREIGN
    sql = "SELECT count(*), count(DISTINCT session_id) FROM spans"
    assert con.execute(sql).fetchall() == connect(clean).execute(sql).fetchall()


def test_query_answers_from_the_other_files(mixed, caplog, capsys):
    root, clean = mixed
    sql = "SELECT session_id, count(*) AS n FROM spans GROUP BY 1 ORDER BY 1"
    assert main(["query", sql, "--traces", str(clean), "--format", "json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    with caplog.at_level(logging.WARNING, logger="kvtrace.store.reader"):
        assert main(["query", sql, "--traces", str(root), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == expected
    assert len(expected) == 2
    assert _warnings(caplog) == FOREIGN


def test_report_answers_from_the_other_files(mixed, caplog, tmp_path):
    root, clean = mixed
    texts = {}
    for name, directory in (("mixed", root), ("clean", clean)):
        out = tmp_path / f"{name}.md"
        with caplog.at_level(logging.WARNING, logger="kvtrace.store.reader"):
            assert main(["report", "--traces", str(directory), "--no-plots", "-o", str(out)]) == 0
        texts[name] = out.read_text().replace(str(directory), "DIR")
    assert _warnings(caplog) == FOREIGN
    assert texts["mixed"] == texts["clean"]
    assert "- spans: 86\n" in texts["mixed"]  # the synthetic run's spans, none of the foreign rows


def test_whatif_answers_from_the_other_files(mixed, caplog, capsys):
    root, clean = mixed
    argv = ["--ttl", "60,480", "--threshold", "64", "--format", "json"]
    assert main(["whatif", "--traces", str(clean), *argv]) == 0
    expected = json.loads(capsys.readouterr().out)
    with caplog.at_level(logging.WARNING, logger="kvtrace.store.reader"):
        assert main(["whatif", "--traces", str(root), *argv]) == 0
    assert json.loads(capsys.readouterr().out) == expected
    assert _warnings(caplog) == FOREIGN
