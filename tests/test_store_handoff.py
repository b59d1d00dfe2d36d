"""The writer process behind ``kvtrace.configure``'s Parquet export (:mod:`kvtrace.store.writer_process`):
the rows the in-process exporter writes, the store's crash guarantees (SIGTERM of the proxy loses
nothing, SIGKILL at most the batch in flight), a dead or hung writer costs its batch (counted as
dropped) and is replaced, never hangs the exporter, and a forked child gets its own writer."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import subprocess
import sys
import time

import aiohttp
import plain_parquet
import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.span import TraceFlags

from kvtrace import semconv as sc
from kvtrace import telemetry
from kvtrace.store import files, reader
from kvtrace.store.convert import table_to_rows
from kvtrace.store.exporter import ParquetSpanExporter
from kvtrace.store.schema import SCHEMA
from kvtrace.store.spancols import span_columns
from kvtrace.store.writer_process import HEADER, SLICE_SPANS, TAG_SPANS, WriterProcessExporter
from kvtrace.testing.proxy import CHAT, FakeWorker
from kvtrace.testing.wait import free_port


def _spans(n: int, tag: str = "s") -> list:
    """``n`` SDK spans of two resources and scopes: parents, events, links, errors, odd values."""
    exporter = InMemorySpanExporter()
    tracers = []
    for service in ("svc-a", "svc-b"):
        provider = TracerProvider(resource=Resource({sc.SERVICE_NAME: service, sc.ENGINE_ID: f"{service}-0"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracers.append(provider.get_tracer(f"scope-{service}", "1.2"))
    for i in range(n):
        tracer = tracers[i % 2]
        root = tracer.start_span(
            sc.SPAN_PROXY_REQUEST,
            kind=SpanKind.SERVER,
            attributes={
                sc.SESSION_ID: f"{tag}-{i}",
                sc.TURN_INDEX: i,
                sc.REQUEST_TTFT_MS: i / 8,
                sc.PROXY_OFFER: i % 3 == 0,
                sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",) * (1 + i % 2),
                sc.KV_PULLED_TOKENS: 2**70 if i == 5 else i,
            },
        )
        if i % 4 == 0:
            root.add_event(sc.EVENT_FIRST_TOKEN, {sc.TURN_INDEX: i})
        if i == 7:
            root.set_attribute(sc.GEN_AI_CONVERSATION_ID, "bad-\ud800")  # escaped by the writer, kept
            root.set_status(Status(StatusCode.ERROR, "failed"))
        child = tracer.start_span(
            sc.SPAN_PROXY_DECODE,
            context=_ctx(root),
            kind=SpanKind.CLIENT,
            links=[Link(root.get_span_context(), {sc.TURN_INDEX: i})] if i % 5 == 0 else None,
        )
        child.end()
        root.end()
    return list(exporter.get_finished_spans())


def _ctx(span):
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def _rows(directory) -> list[dict]:
    rows = []
    for path in files.list_files(directory):
        rows += table_to_rows(pq.read_table(path, partitioning=None).select(SCHEMA.names).cast(SCHEMA))
    return sorted(rows, key=lambda r: r["SpanId"])


def _count(directory) -> int:
    return reader.connect(directory).execute("SELECT count(DISTINCT span_id) FROM spans").fetchone()[0]


def _gone(pid: int) -> bool:
    """``pid`` exited (a zombie nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait(pred, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_the_writer_process_writes_the_rows_the_in_process_exporter_writes(tmp_path):
    spans = _spans(150)  # 300 spans: several slices per batch
    broken = ReadableSpan(
        name="broken", context=SpanContext(1, 2, False, TraceFlags(1)), start_time="not a time", end_time=None
    )  # dropped alone by both
    batches = [spans[:200], [*spans[200:250], broken, *spans[250:]]]
    handoff, direct = WriterProcessExporter(tmp_path / "handoff"), ParquetSpanExporter(tmp_path / "direct")
    for batch in batches:
        assert handoff.export(batch).name == "SUCCESS"
        assert direct.export(batch).name == "SUCCESS"
    assert len(batches[0]) > 3 * SLICE_SPANS
    handoff.shutdown()
    direct.shutdown()
    got, want = _rows(tmp_path / "handoff"), _rows(tmp_path / "direct")
    assert len(got) == 300 and got == want
    assert {r["SpanAttributes"].get(sc.GEN_AI_CONVERSATION_ID) for r in got} == {None, "bad-\\ud800"}


def test_slices_of_a_batch_whose_end_never_came_are_written(tmp_path):
    """The exporting process died mid-batch: the writer still writes the slices it received whole."""
    spans = _spans(40)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtrace.store.writer_process_main", str(tmp_path), "{}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    for part in (spans[:64], spans[64:]):
        payload = pickle.dumps(span_columns(part))
        proc.stdin.write(HEADER.pack(TAG_SPANS, 1, len(payload)) + payload)
    proc.stdin.write(HEADER.pack(TAG_SPANS, 1, 1000) + b"half a frame")  # cut off by the crash
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0
    assert proc.stdout.read() == b""  # no batch ended: nothing answered
    assert _count(tmp_path) == 80
    assert plain_parquet.exact(tmp_path, 80)


KILLED = r"""
import signal, sys
import kvtrace
from kvtrace import semconv as sc
provider = kvtrace.configure("killed", traces_dir=sys.argv[1], otlp=False, writer_process=True)
tracer = provider.get_tracer("t")
for i in range(137):
    tracer.start_span(sc.SPAN_AGENT_TURN, attributes={sc.TURN_INDEX: i}).end()
    if i == 99:
        assert provider.force_flush()
(processor,) = provider._active_span_processor._span_processors
print(processor.span_exporter.writer_pid, flush=True)
signal.pause()
"""


def test_sigkill_loses_at_most_the_batch_in_flight(tmp_path):
    """100 spans exported, 37 still queued in the SDK processor: SIGKILL loses those 37 only, and
    the writer, seeing the pipe's end, leaves plain Parquet and exits."""
    env = {**os.environ, "KVTRACE_BATCH_DELAY_MS": "600000"}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    writer_pid = int(proc.stdout.readline())
    proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    _wait(lambda: _gone(writer_pid))
    assert _count(tmp_path) == 100
    assert plain_parquet.exact(tmp_path, 100)
    assert not [n for _, _, names in os.walk(tmp_path) for n in names if n.endswith(".tmp")]


async def test_sigterm_of_the_proxy_loses_nothing(tmp_path):
    """Every span of every answered request reaches the store when the proxy gets SIGTERM, though
    none was exported before (a 10-minute batch delay): the proxy flushes them through its writer,
    which rolls them into one segment and exits before the proxy does."""
    p, d = await FakeWorker("p0").start(), await FakeWorker("d0").start()
    port = free_port()
    env = {**os.environ, "KVTRACE_BATCH_DELAY_MS": "600000"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kvtrace.cli",
        "proxy",
        "--port",
        str(port),
        "--prefiller-port",
        str(p.port),
        "--decoder-port",
        str(d.port),
        "--traces",
        str(tmp_path),
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        assert b"listening" in line
        async with aiohttp.ClientSession() as http:
            for i in range(20):
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                    "stream": False,
                    "conversation_id": f"c{i % 4}",
                }
                async with http.post(f"http://127.0.0.1:{port}{CHAT}", json=body) as r:
                    assert r.status == 200
                    await r.read()
        assert files.list_files(tmp_path) == []  # nothing exported yet
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 120) == -signal.SIGTERM
    finally:
        if proc.returncode is None:
            proc.kill()
        await p.close()
        await d.close()
    con = reader.connect(tmp_path)
    assert con.execute("SELECT name, count(*) FROM spans GROUP BY 1 ORDER BY 1").fetchall() == sorted(
        [(sc.SPAN_PROXY_REQUEST, 20), (sc.SPAN_PROXY_PREFILL, 20), (sc.SPAN_PROXY_DECODE, 20)]
    )
    assert len(files.list_files(tmp_path)) == 1  # one batch at SIGTERM: one file
    assert plain_parquet.exact(tmp_path, 60)


def test_a_writer_killed_between_batches_is_replaced(tmp_path):
    spans = _spans(30)
    exporter = WriterProcessExporter(tmp_path)
    assert exporter.export(spans[:20]).name == "SUCCESS"
    first = exporter.writer_pid
    os.kill(first, signal.SIGKILL)
    _wait(lambda: exporter._writer.proc.poll() is not None)
    assert exporter.export(spans[20:]).name == "SUCCESS"
    assert exporter.writer_pid not in (None, first) and exporter.restarts == 1
    exporter.shutdown()
    assert _count(tmp_path) == 60


def test_a_hung_writer_costs_its_batch_counted_as_dropped_then_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTRACE_WRITER_TIMEOUT_S", "2")
    monkeypatch.setenv("KVTRACE_BATCH_DELAY_MS", "600000")
    provider = telemetry.configure("hung", traces_dir=tmp_path, otlp=False, handle_sigterm=False, writer_process=True)
    (processor,) = provider._active_span_processor._span_processors
    exporter = processor.span_exporter
    tracer = provider.get_tracer("t")
    before = telemetry.dropped_spans().get(sc.DROP_EXPORT_FAILED, 0)

    def emit(first: int) -> bool:
        for i in range(first, first + 10):
            tracer.start_span(sc.SPAN_AGENT_TURN, attributes={sc.TURN_INDEX: i}).end()
        return provider.force_flush(600_000)

    assert emit(0)
    hung = exporter.writer_pid
    os.kill(hung, signal.SIGSTOP)
    try:
        assert emit(10)  # returns: the export gave up on the stopped writer after 2 s
        assert _gone(hung)  # killed, not left behind
        assert telemetry.dropped_spans()[sc.DROP_EXPORT_FAILED] - before == 10
        assert emit(20)
        assert exporter.writer_pid not in (None, hung)
    finally:
        if not _gone(hung):
            os.kill(hung, signal.SIGKILL)
    provider.shutdown()
    assert reader.connect(tmp_path).execute("SELECT list(turn ORDER BY turn) FROM spans").fetchone()[0] == [
        *range(10),
        *range(20, 30),
    ]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_writer(tmp_path):
    spans = _spans(30)
    exporter = WriterProcessExporter(tmp_path)
    assert exporter.export(spans[:20]).name == "SUCCESS"
    pid = os.fork()
    if pid == 0:  # the child: its own writer; the parent's pipe untouched
        code = 1
        try:
            code = 0 if exporter.export(spans[20:40]).name == "SUCCESS" else 1
            exporter.shutdown()
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    assert exporter.export(spans[40:]).name == "SUCCESS"
    exporter.shutdown()
    assert _count(tmp_path) == 60
    writers = {files.parse_name(os.path.basename(p)).writer for p in files.list_files(tmp_path)}
    assert len(writers) == 2


def _parquet_exporter(provider):
    (processor,) = provider._active_span_processor._span_processors
    return processor.span_exporter


def test_the_writer_process_is_on_by_default_in_the_proxy_only(tmp_path, monkeypatch):
    """Unset: in-process export everywhere (the vLLM connector, sim, bench), a writer process in
    ``kvtrace proxy``; KVTRACE_WRITER_PROCESS turns it on or off everywhere; an argument beats it."""
    from kvtrace.proxy.runtime import writer_process

    def kind(**kwargs):
        provider = telemetry.configure("x", traces_dir=tmp_path, otlp=False, handle_sigterm=False, **kwargs)
        try:
            return type(_parquet_exporter(provider))
        finally:
            provider.shutdown()

    monkeypatch.delenv("KVTRACE_WRITER_PROCESS", raising=False)
    assert (kind(), writer_process()) == (ParquetSpanExporter, True)
    assert kind(writer_process=writer_process()) is WriterProcessExporter
    monkeypatch.setenv("KVTRACE_WRITER_PROCESS", "0")
    assert (kind(), writer_process()) == (ParquetSpanExporter, False)
    monkeypatch.setenv("KVTRACE_WRITER_PROCESS", "1")
    assert (kind(), writer_process()) == (WriterProcessExporter, True)
    assert kind(writer_process=False) is ParquetSpanExporter


def test_descriptors_above_1024_do_not_stop_the_export(tmp_path):
    """A proxy holds many sockets when its first export starts the writer: the pipe's descriptors
    can be above 1023, which select() refuses (ValueError escaped into the SDK's processor)."""
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        exporter = WriterProcessExporter(tmp_path / "store")
        assert exporter.export(_spans(10)).name == "SUCCESS"
        exporter.shutdown()
    finally:
        for fd in held:
            os.close(fd)
    assert _count(tmp_path / "store") == 20


def test_a_slice_that_cannot_be_encoded_fails_its_batch_alone(tmp_path, monkeypatch):
    """Encoding errors never raise into the host, and the slices of the failed batch already in the
    pipe never join the next batch: that batch's file holds exactly its own spans."""
    exporter = WriterProcessExporter(tmp_path / "store")
    first, second = _spans(100, "first"), _spans(10, "second")
    encode = exporter._encode
    calls = []

    def flaky(spans):
        calls.append(len(spans))
        if len(calls) == 2:  # the second slice of the first batch
            raise pickle.PicklingError("cannot pickle this value")
        return encode(spans)

    monkeypatch.setattr(exporter, "_encode", flaky)
    assert exporter.export(first).name == "FAILURE"
    assert exporter.export(second).name == "SUCCESS"
    exporter.shutdown()
    rows = _rows(tmp_path / "store")
    assert sorted(r["SpanId"] for r in rows) == sorted(f"{s.context.span_id:016x}" for s in second)


def test_the_end_of_the_sigterm_grace_never_cuts_a_batch_being_written(tmp_path, monkeypatch):
    """SIGTERM's grace ending while a batch is written: that batch is written whole, then the
    writer stops reading (the next batch's frames are left unread)."""
    import io

    from kvtrace.store import writer_process_main as writerproc

    first, second = _spans(20, "first"), _spans(5, "second")
    frames = b""
    for seq, part in ((1, first), (2, second)):
        payload = pickle.dumps(span_columns(part))
        frames += HEADER.pack(TAG_SPANS, seq, len(payload)) + payload + HEADER.pack(b"E", seq, 0)
    write = writerproc._write

    def write_with_the_alarm_inside(exporter, parts):
        if parts:  # the grace ends in the middle of writing a batch
            writerproc._on_alarm(signal.SIGALRM, None)
        return write(exporter, parts)

    monkeypatch.setattr(writerproc, "_write", write_with_the_alarm_inside)
    monkeypatch.setattr(writerproc, "_stop_due", False)
    answers = io.BytesIO()
    assert writerproc.serve(str(tmp_path), {}, io.BytesIO(frames), answers) == 0
    assert answers.getvalue() == b"ok 1 40\n"
    assert sorted(r["SpanId"] for r in _rows(tmp_path)) == sorted(f"{s.context.span_id:016x}" for s in first)
