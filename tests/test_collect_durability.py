"""What a crash of ``kvtrace collect`` loses, in each acknowledgement mode (issue 15, item 6).

A collector subprocess is SIGKILLed right after N requests were acknowledged (200); the rows on
disk are then compared with the acknowledged spans.  The writer is told to gather requests for
60 s (``--batch-delay-ms 60000``), so at the kill nothing has been written unless the mode
forces it: the default mode loses every acknowledged span still queued (as documented), the
durable mode none."""

from __future__ import annotations

import os
import threading

import pytest
from test_collect_limits import post, post_until_accepted, start_cli, stop_cli
from test_collect_protocol import BlockingSink, _request
from test_collect_workload import read_rows, tmp_files

from kvtrace.collect.server import Collector
from kvtrace.store import writer
from kvtrace.store.schema import SCHEMA

REQUESTS, SPANS = 12, 25


def _acknowledge_then_kill(traces, *flags) -> tuple[set[str], list[dict]]:
    proc, port, _ = start_cli(traces, "--otlp-grpc", "off", "--batch-delay-ms", "60000", *flags)
    acknowledged: set[str] = set()
    try:
        for i in range(REQUESTS):
            status, _ = post(port, _request(SPANS, name=f"r{i}").SerializeToString())
            assert status == 200
            acknowledged |= {f"r{i}-{j}" for j in range(SPANS)}
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    return acknowledged, read_rows(traces)


def test_default_mode_loses_what_is_queued_at_a_crash(tmp_path):
    """Acknowledged once queued: the 300 spans still waiting for the writer die with the
    process (before this change the same happened with no way to avoid it)."""
    acknowledged, rows = _acknowledge_then_kill(tmp_path / "t")
    assert len(acknowledged) == REQUESTS * SPANS
    assert rows == []  # every acknowledged span lost: exactly the documented window


def test_durable_ack_loses_nothing_acknowledged(tmp_path):
    """--durable-ack: a 200 means the spans are in an fsynced file, so SIGKILL right after the
    last 200 still finds every acknowledged span on disk, once, and no partial file."""
    acknowledged, rows = _acknowledge_then_kill(tmp_path / "t", "--durable-ack")
    names = [r["SpanName"] for r in rows]
    assert sorted(names) == sorted(acknowledged) and len(names) == len(set(names))
    assert tmp_files(tmp_path / "t") == []


def test_durable_ack_is_documented_in_help():
    import subprocess
    import sys

    main = "import sys; from kvtrace.cli import main; sys.exit(main(sys.argv[1:]))"
    out = subprocess.run(
        [sys.executable, "-c", main, "collect", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    flat = " ".join(out.split())
    assert "--durable-ack" in flat and "What a crash can lose" in flat
    assert "loses the acknowledged spans not yet in a file" in flat
    assert "no crash, of the process or of the machine, loses an acknowledged span" in flat


def test_durable_write_failure_answers_retry_and_stores_nothing(tmp_path):
    """A durable request whose write fails is answered 503 (its rows are dropped, not retried
    behind the sender's back); the sender's resend is stored exactly once."""
    sink = BlockingSink(tmp_path / "t", fail_first=1)
    sink.release.set()
    with Collector(tmp_path / "t", http_address="127.0.0.1:0", durable_ack=True, sink=sink) as c:
        body = _request(4, name="d").SerializeToString()
        status, _ = post(c.http_port, body)
        assert status == 503
        assert c.queue.stats.failed_durable_spans == 4 and c.queue.stats.written_spans == 0
        # the back-off after a failed write refuses resends for a moment; then one probes the disk
        assert post_until_accepted(c.http_port, body) == 200
        assert c.queue.stats.written_spans == 4  # already written when the 200 came
    assert sorted(r["SpanName"] for r in read_rows(tmp_path / "t")) == [f"d-{i}" for i in range(4)]


def test_concurrent_durable_senders_are_all_stored(tmp_path):
    """8 senders waiting on their acknowledgements at once (they share the writer's files)."""
    proc, port, _ = start_cli(tmp_path / "t", "--otlp-grpc", "off", "--durable-ack")
    try:

        def send(k):
            for i in range(5):
                assert post(port, _request(10, name=f"s{k}-{i}").SerializeToString())[0] == 200

        threads = [threading.Thread(target=send, args=(k,)) for k in range(8)]
        [t.start() for t in threads]
        [t.join(120) for t in threads]
    finally:
        out = stop_cli(proc)
    assert "400 spans written, 0 lost" in out
    assert len(read_rows(tmp_path / "t")) == 400


def test_fsync_reaches_file_and_directories(tmp_path, monkeypatch):
    """write_atomic(fsync=True) syncs the file before the rename, then its directory and the
    parents of the directories it created; without fsync, nothing is synced."""
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    table = SCHEMA.empty_table()
    part = tmp_path / "date=2026-01-01" / "hour=00"
    writer.write_atomic(table, str(part), "w-b00000001.parquet", fsync=True)
    # the new directories' entries, then the data under its tmp name, then the rename
    assert synced[:2] == [str(tmp_path / "date=2026-01-01"), str(tmp_path)]
    assert synced[2].startswith(str(part / ".")) and synced[2].endswith(".tmp")
    assert synced[3:] == [str(part)]
    synced.clear()
    writer.write_atomic(table, str(part), "w-b00000002.parquet")
    assert synced == []


@pytest.mark.parametrize("mode", [[], ["--durable-ack"]])
def test_sigterm_loses_nothing_in_either_mode(tmp_path, mode):
    proc, port, _ = start_cli(tmp_path / "t", "--otlp-grpc", "off", "--batch-delay-ms", "60000", *mode)
    for i in range(3):
        assert post(port, _request(SPANS, name=f"r{i}").SerializeToString())[0] == 200
    assert f"{3 * SPANS} spans written, 0 lost" in stop_cli(proc)
    assert len(read_rows(tmp_path / "t")) == 3 * SPANS
