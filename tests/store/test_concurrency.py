"""Parquet store under concurrent writers, a polling reader, SIGTERM and SIGKILL; and what a plain
recursive glob (DuckDB, pyarrow, chDB: tests/support/plain_parquet.py) sees once the writers are gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvtrace import semconv as sc
from kvtrace.cli import main as kvtrace_main
from kvtrace.store import files, reader
from kvtrace.store.exporter import ParquetSpanExporter
from kvtrace.testing.wait import wait_for

from support import plain_parquet

WRITER = r"""
import sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from kvtrace import semconv as sc
from kvtrace.store.exporter import ParquetSpanExporter
directory, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(
    ParquetSpanExporter(directory, roll_bytes=20_000, roll_seconds=0.05, grace_seconds=5),
    max_export_batch_size=37, schedule_delay_millis=5))
tracer = provider.get_tracer("w")
for i in range(n):
    tracer.start_span(sc.SPAN_AGENT_TURN, attributes={sc.SESSION_ID: tag, sc.TURN_INDEX: i}).end()
# the SDK's shutdown gives the export thread 30 s, then drops what is queued: on a loaded machine
# flush first, without that limit (a flush that does not finish fails the writer instead)
assert provider.force_flush(timeout_millis=600_000)
provider.shutdown()
"""

SIGTERM_WRITER = r"""
import signal, sys
import kvtrace
from kvtrace import semconv as sc
directory = sys.argv[1]
provider = kvtrace.configure("sigterm-writer", traces_dir=directory, otlp=False)
tracer = provider.get_tracer("w")
for i in range(100):
    tracer.start_span(sc.SPAN_AGENT_TURN, attributes={sc.TURN_INDEX: i}).end()
    if i % 10 == 9:
        assert provider.force_flush()  # one batch file per 10 spans
print("flushed", flush=True)
signal.pause()
"""

# rolls every second export (its batch files merged into segments, superseded files kept for an
# hour), then waits to be killed
KILLED_WRITER = r"""
import os, signal, sys
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from kvtrace import semconv as sc
from kvtrace.store import files
from kvtrace.store.exporter import ParquetSpanExporter
directory = sys.argv[1]
exporter = ParquetSpanExporter(directory, roll_bytes=1, roll_seconds=10**6, grace_seconds=3600)
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
tracer = provider.get_tracer("w")
for i in range(40):
    tracer.start_span(sc.SPAN_AGENT_TURN, attributes={sc.SESSION_ID: "killed", sc.TURN_INDEX: i}).end()
superseded = [n for d, _, names in os.walk(directory) for n in files.superseded(names)]
print(len(superseded), flush=True)
signal.pause()
"""


def _poll_until_exited(procs, poll) -> None:
    """``poll()`` (a reader at work) again and again until every writer has exited (at most 120 s)."""

    def exited() -> bool:
        if all(p.poll() is not None for p in procs):
            return True
        poll()
        return False

    wait_for(exited, 120, "the writers to finish", interval=0)


def _exact(con, n: int) -> None:
    assert reader.query(con, "SELECT count(*) AS n, count(DISTINCT span_id) AS d FROM spans").to_pylist() == [
        {"n": n, "d": n}
    ]


def test_four_writers_one_directory_no_loss_no_duplicates(tmp_path):
    n, writers = 600, 4
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(n), f"w{k}"]) for k in range(writers)]
    polls = {"ok": 0}

    def poll():  # a reader listing + querying while files are written, rolled and swept
        if not files.list_files(tmp_path):
            return
        con = reader.connect(tmp_path)
        total, distinct = (
            reader.query(con, "SELECT count(*), count(DISTINCT span_id) FROM spans").to_pylist()[0].values()
        )
        assert total == distinct
        polls["ok"] += 1

    _poll_until_exited(procs, poll)
    assert [p.returncode for p in procs] == [0] * writers
    con = reader.connect(tmp_path)
    _exact(con, n * writers)
    per_writer = con.execute("SELECT session_id, count(DISTINCT turn) FROM spans GROUP BY 1 ORDER BY 1").fetchall()
    assert per_writer == [(f"w{k}", n) for k in range(writers)]
    names = [files.parse_name(os.path.basename(p)) for p in files.list_files(tmp_path)]
    assert any(p.segment for p in names), "rolling never happened"
    assert polls["ok"] > 0
    # at rest: every writer exited, so no batch file a segment supersedes is left
    assert plain_parquet.counts(tmp_path) == {r: (n * writers, n * writers) for r in ("duckdb", "pyarrow", "chdb")}


def test_sigterm_loses_nothing_already_exported_and_leaves_plain_parquet(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "flushed\n"
    batches = [p for p in files.list_files(tmp_path) if not files.parse_name(os.path.basename(p)).segment]
    assert len(batches) == 10
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    con = reader.connect(tmp_path)
    assert con.execute("SELECT count(*), count(DISTINCT turn), min(service_name) FROM spans").fetchone() == (
        100,
        100,
        "sigterm-writer",
    )
    left = [os.path.basename(p) for p in files.list_files(tmp_path)]
    assert len(left) == 1 and files.parse_name(left[0]).segment  # rolled at exit, batch files gone
    assert plain_parquet.exact(tmp_path, 100)


def _killed_writer(directory) -> None:
    """Run :data:`KILLED_WRITER` until it has rolled, SIGKILL it; check what it left."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(directory)], stdout=subprocess.PIPE, text=True)
    superseded = int(proc.stdout.readline())
    proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert superseded == 40  # one batch file per span, all merged into the segment
    assert plain_parquet.counts(directory)["duckdb"] == (80, 40)  # the problem: segment + its batch files
    _exact(reader.connect(directory), 40)  # kvtrace's reader was never fooled


def test_kill_leftovers_are_removed_by_kvtrace_compact(tmp_path, capsys):
    _killed_writer(tmp_path)
    assert kvtrace_main(["compact", "--traces", str(tmp_path)]) == 0
    assert (
        capsys.readouterr().out == f"kvtrace compact: {tmp_path}: deleted 40 superseded or abandoned files; "
        "20 Parquet files remain; 0 scan indexes built\n"  # 20 small files: under KVTRACE_SCAN_INDEX_MIN_BYTES
    )
    assert plain_parquet.exact(tmp_path, 40)
    _exact(reader.connect(tmp_path), 40)


def test_kill_leftovers_are_removed_by_the_next_writer(tmp_path):
    _killed_writer(tmp_path)
    proc = subprocess.run([sys.executable, "-c", WRITER, str(tmp_path), "10", "next"], timeout=120)
    assert proc.returncode == 0
    assert plain_parquet.exact(tmp_path, 50)
    con = reader.connect(tmp_path)
    assert con.execute("SELECT session_id, count(*) FROM spans GROUP BY 1 ORDER BY 1").fetchall() == [
        ("killed", 40),
        ("next", 10),
    ]


def test_an_idle_writer_sweeps_after_the_grace_period(tmp_path):
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for i in range(3):
        provider.get_tracer("t").start_span(sc.SPAN_AGENT_TURN, attributes={sc.TURN_INDEX: i}).end()
    spans = memory.get_finished_spans()
    exporter = ParquetSpanExporter(tmp_path, roll_bytes=10**12, roll_seconds=0.0, grace_seconds=1.0)
    for span in spans:  # the second export rolls the first two files; the third waits for company
        assert exporter.export([span]) is SpanExportResult.SUCCESS
    try:
        assert any(files.superseded(names) for _, _, names in os.walk(tmp_path)), "no roll happened"
        wait_for(  # no export comes: the grace timer sweeps them
            lambda: not any(files.superseded(names) for _, _, names in os.walk(tmp_path)),
            30,
            "superseded batch files swept after the grace period",
            interval=0.02,
        )
        assert plain_parquet.exact(tmp_path, 3)
    finally:
        exporter.shutdown()
    assert plain_parquet.exact(tmp_path, 3)
