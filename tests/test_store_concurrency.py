"""Parquet store under concurrent writers, a polling reader, and SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from kvtrace.store import files, reader

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
assert provider.force_flush()
print("flushed", flush=True)
signal.pause()
"""


def _deadline_wait(procs, poll):
    deadline = time.monotonic() + 120
    while any(p.poll() is None for p in procs):
        assert time.monotonic() < deadline, "writers did not finish"
        poll()


def test_four_writers_one_directory_no_loss_no_duplicates(tmp_path):
    n, writers = 600, 4
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(n), f"w{k}"]) for k in range(writers)]
    polls = {"ok": 0}

    def poll():  # a reader listing + querying while files are written, rolled and swept
        if not files.list_files(tmp_path):
            return
        con = reader.connect(tmp_path)
        total, distinct = con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone()
        assert total == distinct
        polls["ok"] += 1

    _deadline_wait(procs, poll)
    assert [p.returncode for p in procs] == [0] * writers
    con = reader.connect(tmp_path)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (n * writers, n * writers)
    per_writer = con.execute("SELECT session_id, count(DISTINCT turn) FROM spans GROUP BY 1 ORDER BY 1").fetchall()
    assert per_writer == [(f"w{k}", n) for k in range(writers)]
    names = [files.parse_name(os.path.basename(p)) for p in files.list_files(tmp_path)]
    assert any(p.segment for p in names), "rolling never happened"
    assert polls["ok"] > 0


def test_sigterm_loses_nothing_already_exported(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "flushed\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    con = reader.connect(tmp_path)
    assert con.execute("SELECT count(*), count(DISTINCT turn), min(service_name) FROM spans").fetchone() == (
        100, 100, "sigterm-writer")
