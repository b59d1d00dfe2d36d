"""The proxy's spans are the same whether made by :mod:`kvtrace.telemetry.fastspans` (the default) or by the
OpenTelemetry SDK's own tracer (``KVTRACE_PROXY_FASTSPANS=0``): the same proxy requests, against
the same fake workers, exported through the SDK's ``BatchSpanProcessor`` (``kvtrace.configure``)
into an in-memory exporter and kvtrace's Parquet store, give the same spans (name, kind, parent,
status, whole attribute dicts, events, resource and scope) and the same Parquet rows.  Only what
differs from run to run by nature is masked: ids (compared as links between the spans), times and
the three measured times (compared by type)."""

from __future__ import annotations

import aiohttp
import pyarrow.parquet as pq
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvtrace import semconv as sc
from kvtrace import telemetry
from kvtrace.proxy.config import PREFILL_FAILURE_DECODE_ONLY, ProxyConfig, Worker
from kvtrace.proxy.server import start
from kvtrace.store import files
from kvtrace.store.convert import table_to_rows
from kvtrace.store.schema import SCHEMA
from kvtrace.telemetry import fastspans
from kvtrace.testing.proxy import BODY, CHAT, FakeWorker, closed_port

MEASURED = {sc.REQUEST_TTFT_MS, sc.REQUEST_LATENCY_MS, sc.PROXY_ENTRY_AGE_S}  # measured times: differ between runs
REMOTE_TRACE, REMOTE_SPAN = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
TRACEPARENT = f"00-{REMOTE_TRACE:032x}-{REMOTE_SPAN:016x}-01"


def _requests():
    """(worker pair, body, headers) of every request, in order: multi-turn streaming (a miss then
    an offer), non-streaming with a client's traceparent and baggage, the completions route
    (path), P failing (502; decode-only fallback), D dying mid-stream (upstream error event) and, in a
    fleet of two P, the first unreachable (failover)."""
    chat = dict(BODY)
    ids = iter(range(100))

    def rid():
        return {sc.HEADER_REQUEST_ID: f"req-{next(ids)}"}

    return [
        ("ok", CHAT, {**chat, "conversation_id": "c1"}, rid()),
        ("ok", CHAT, {**chat, "conversation_id": "c1"}, rid()),
        (
            "ok",
            CHAT,
            {**chat, "stream": False, "conversation_id": "c2"},
            {**rid(), "traceparent": TRACEPARENT, "baggage": f"{sc.BAGGAGE_SESSION_ID}=s-9"},
        ),
        ("ok", "/v1/completions", {"model": "fake", "prompt": "hi", "max_tokens": 3, "stream": True}, rid()),
        ("p_down", CHAT, {**chat, "conversation_id": "c3"}, rid()),
        ("p_down_fallback", CHAT, {**chat, "conversation_id": "c4"}, rid()),
        ("d_dies", CHAT, {**chat, "conversation_id": "c5"}, rid()),
        ("p_failover", CHAT, {**chat, "conversation_id": "c6"}, rid()),
    ]


async def _workers() -> dict:
    p, p_bad = await FakeWorker("p0").start(), await FakeWorker("p1", status=503).start()
    d, d_dying = await FakeWorker("d0").start(), await FakeWorker("d1", die_after=1).start()
    return {
        "ok": (p, d, {}),
        "p_down": (p_bad, d, {}),
        "p_down_fallback": (p_bad, d, {"prefill_failure": PREFILL_FAILURE_DECODE_ONLY}),
        "d_dies": (p, d_dying, {}),
        "p_failover": (p, d, {"routing": sc.ROUTING_ROUND_ROBIN, "dead_prefill_first": closed_port()}),
        "_all": (p, p_bad, d, d_dying),
    }


async def _run(workers: dict, traces, monkeypatch, fast: bool) -> tuple[list[ReadableSpan], list[dict], list]:
    """The requests through proxies whose spans go, via BatchSpanProcessor, to memory and Parquet."""
    monkeypatch.setenv("KVTRACE_PROXY_FASTSPANS", "1" if fast else "0")
    memory = InMemorySpanExporter()
    provider = telemetry.configure(
        "kvtrace-proxy", traces_dir=traces, otlp=False, exporters=[memory], handle_sigterm=False, writer_process=False
    )
    proxies = {}
    statuses = []
    try:
        for name, pair in workers.items():
            if name.startswith("_"):
                continue
            p, d, cfg = pair
            prefill = [Worker("127.0.0.1", p.port)]
            if cfg.get("dead_prefill_first"):  # a port nothing listens on, first in the rotation
                prefill.insert(0, Worker("127.0.0.1", cfg["dead_prefill_first"]))
            cfg = {k: v for k, v in cfg.items() if k != "dead_prefill_first"}
            config = ProxyConfig(prefill=prefill, decode=[Worker("127.0.0.1", d.port)], **cfg)
            proxies[name] = await start(config, provider, port=0)
            assert isinstance(proxies[name].proxy.tracer, fastspans.FastTracer) == fast
        async with aiohttp.ClientSession() as http:
            for pair, path, body, headers in _requests():
                async with http.post(proxies[pair].url + path, json=body, headers=headers) as r:
                    await r.read()
                    statuses.append(r.status)
    finally:
        for running in proxies.values():
            await running.close()
        assert provider.force_flush(60_000)
        provider.shutdown()
    rows = []
    for path in files.list_files(traces):
        rows += table_to_rows(pq.read_table(path, partitioning=None).select(SCHEMA.names).cast(SCHEMA))
    return sorted(memory.get_finished_spans(), key=lambda s: s.start_time), rows, statuses


def _mask(attrs) -> dict:
    return {k: (type(v).__name__ if k in MEASURED else v) for k, v in dict(attrs).items()}


def _spans(spans: list[ReadableSpan]) -> list[dict]:
    """Each span's fields, ids replaced by the index (start order) of the span they name."""
    index = {s.context.span_id: i for i, s in enumerate(spans)}
    traces = {}
    out = []
    for s in spans:
        parent = s.parent
        resource = {k: v for k, v in s.resource.attributes.items() if k != sc.SERVICE_INSTANCE_ID}
        out.append(
            {
                "name": s.name,
                "kind": s.kind,
                "attributes": _mask(s.attributes),
                "events": [(e.name, _mask(e.attributes)) for e in s.events],
                "status": (s.status.status_code, s.status.description),
                "links": list(s.links),
                "parent": None if parent is None else index.get(parent.span_id, (parent.span_id, parent.is_remote)),
                "trace": s.context.trace_id
                if s.context.trace_id == REMOTE_TRACE
                else traces.setdefault(s.context.trace_id, len(traces)),
                "flags": s.context.trace_flags,
                "resource": resource,
                "scope": s.instrumentation_scope,
                "timed": s.start_time <= s.end_time
                and all(s.start_time <= e.timestamp <= s.end_time for e in s.events),
            }
        )
    return out


VOLATILE_COLUMNS = {
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "Timestamp",
    "Duration",
    "Events.Timestamp",
    "Links.TraceId",
    "Links.SpanId",
}


def _row_view(rows: list[dict], spans: list[ReadableSpan]) -> list[dict]:
    """Parquet rows in the spans' order, minus ids and times (compared above) and the instance id."""
    order = {f"{s.context.span_id:016x}": i for i, s in enumerate(spans)}
    assert sorted(order) == sorted(r["SpanId"] for r in rows)
    rows = sorted(rows, key=lambda r: order[r["SpanId"]])
    out = []
    for row in rows:
        kept = {}
        for k, v in row.items():
            if k in VOLATILE_COLUMNS:
                continue
            if k == "ResourceAttributes":
                v = {a: b for a, b in v.items() if a != sc.SERVICE_INSTANCE_ID}
            elif isinstance(v, dict):
                v = _mask(v)
            kept[k] = v
        out.append(kept)
    return out


@pytest.fixture
async def workers():
    made = await _workers()
    yield made
    for worker in made["_all"]:
        await worker.close()


async def test_fast_spans_are_the_sdk_tracers_spans_for_the_same_proxy_requests(workers, tmp_path, monkeypatch):
    fast_spans, fast_rows, fast_status = await _run(workers, tmp_path / "fast", monkeypatch, fast=True)
    sdk_spans, sdk_rows, sdk_status = await _run(workers, tmp_path / "sdk", monkeypatch, fast=False)
    assert fast_status == sdk_status == [200, 200, 200, 200, 502, 200, 200, 200]
    assert len(sdk_spans) >= 3 * len(sdk_status) - 1  # SERVER span + P and D legs (none to D after a 502)
    assert _spans(fast_spans) == _spans(sdk_spans)
    names = {s.name for s in sdk_spans}
    assert {sc.SPAN_PROXY_REQUEST, sc.SPAN_PROXY_PREFILL, sc.SPAN_PROXY_DECODE} <= names
    assert any(s.events for s in sdk_spans) and any(s.parent and s.parent.is_remote for s in sdk_spans)
    assert {s.status.status_code.name for s in sdk_spans} >= {"ERROR"}
    assert sum(1 for s in sdk_spans if s.attributes.get(sc.PROXY_FAILOVER)) == 1
    assert _row_view(fast_rows, fast_spans) == _row_view(sdk_rows, sdk_spans)


def test_the_setting_turns_fast_spans_off(tracer_provider, monkeypatch):
    from kvtrace.proxy.spans import tracer

    assert isinstance(tracer(tracer_provider), fastspans.FastTracer)
    assert not isinstance(tracer(tracer_provider, fast=False), fastspans.FastTracer)
    monkeypatch.setenv("KVTRACE_PROXY_FASTSPANS", "0")
    assert not isinstance(tracer(tracer_provider), fastspans.FastTracer)
    assert isinstance(tracer(tracer_provider, fast=True), fastspans.FastTracer)
