"""KVRecorder: the spans the connector and the simulator emit, exactly."""

from __future__ import annotations

import logging
import threading

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from kvtrace import semconv as sc
from kvtrace.emit.recorder import KVRecorder

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ENGINE = {sc.ENGINE_ID: "engine-p", sc.ENGINE_ROLE: sc.ROLE_PREFILL}


def _recorder(provider, **kw):
    return KVRecorder(
        provider,
        engine_id="engine-p",
        role=sc.ROLE_PREFILL,
        block_size=16,
        bytes_per_block=16 * 262144,
        threshold=64,
        ttl_s=480.0,
        **kw,
    )


def _params(turn=1):
    return {sc.KV_PARAMS_KEY: {sc.CTX_TRACEPARENT: TRACEPARENT, sc.CTX_SESSION_ID: "conv-1", sc.CTX_TURN: turn}}


def _by_name(exporter):
    return {s.name: s for s in exporter.get_finished_spans()}


IDENTITY = {
    sc.GEN_AI_REQUEST_ID: "req-2",
    sc.SESSION_ID: "conv-1",
    sc.GEN_AI_CONVERSATION_ID: "conv-1",
    sc.TURN_INDEX: 1,
}


def test_pull_emits_engine_decision_and_transfer_spans(tracer_provider, span_exporter):
    rec = _recorder(tracer_provider)
    rec.request_started("req-2", phase=sc.ROLE_PREFILL, prompt_tokens=500, kv_params=_params())
    rec.decision(
        "req-2",
        direction=sc.DIRECTION_D2P,
        outcome=None,
        prompt_tokens=500,
        local_hit_tokens=256,
        remote_tokens=499,
        pulled_tokens=243,
        expiry_deadline=1234.5,
        expiry_remaining_s=470.0,
        peer_engine_id="engine-d",
        remote_request_id="d-req-1",
    )
    rec.transfer_started(
        "req-2",
        direction=sc.DIRECTION_D2P,
        tokens=243,
        blocks=16,
        peer_engine_id="engine-d",
        remote_request_id="d-req-1",
    )
    rec.transfer_finished("req-2", status=sc.TRANSFER_OK, xfer_ms=1.5, post_ms=0.25)
    summary = rec.request_finished("req-2", cached_tokens=499)

    spans = _by_name(span_exporter)
    engine, decision, transfer = spans[sc.SPAN_ENGINE_PREFILL], spans[sc.SPAN_KV_DECISION], spans[sc.SPAN_KV_TRANSFER]
    assert format(engine.context.trace_id, "032x") == TRACEPARENT[3:35]
    assert format(engine.parent.span_id, "016x") == TRACEPARENT[36:52]
    assert decision.parent.span_id == engine.context.span_id
    assert transfer.parent.span_id == decision.context.span_id
    assert dict(engine.attributes) == {**IDENTITY, **ENGINE, sc.KV_PROMPT_TOKENS: 500, sc.REQUEST_CACHED_TOKENS: 499}
    assert dict(decision.attributes) == {
        **IDENTITY,
        **ENGINE,
        sc.KV_DIRECTION: sc.DIRECTION_D2P,
        sc.KV_PROMPT_TOKENS: 500,
        sc.KV_LOCAL_HIT_TOKENS: 256,
        sc.KV_REMOTE_TOKENS: 499,
        sc.KV_PULLED_TOKENS: 243,
        sc.KV_RECOMPUTED_TOKENS: 1,
        sc.KV_THRESHOLD: 64,
        sc.KV_LOAD_FAILURE_POLICY: "fail",
        sc.KV_EXPIRY_DEADLINE: 1234.5,
        sc.KV_EXPIRY_REMAINING_S: 470.0,
        sc.KV_PEER_ENGINE_ID: "engine-d",
        sc.KV_REMOTE_REQUEST_ID: "d-req-1",
        sc.KV_OUTCOME: sc.OUTCOME_PULLED,
    }
    assert dict(transfer.attributes) == {
        **IDENTITY,
        **ENGINE,
        sc.KV_DIRECTION: sc.DIRECTION_D2P,
        sc.KV_TRANSFER_TOKENS: 243,
        sc.KV_TRANSFER_BLOCKS: 16,
        sc.KV_TRANSFER_BYTES: 16 * 16 * 262144,
        sc.KV_PEER_ENGINE_ID: "engine-d",
        sc.KV_REMOTE_REQUEST_ID: "d-req-1",
        sc.KV_TRANSFER_STATUS: sc.TRANSFER_OK,
        sc.KV_TRANSFER_XFER_MS: 1.5,
        sc.KV_TRANSFER_POST_MS: 0.25,
    }
    transfer_ms = summary.pop(sc.KVT_TRANSFER_MS)
    assert transfer_ms == round((transfer.end_time - transfer.start_time) / 1e6, 3)
    assert summary == {
        sc.KVT_TRACE_ID: TRACEPARENT[3:35],
        sc.KVT_REQUEST_ID: "req-2",
        sc.KVT_SESSION_ID: "conv-1",
        sc.KVT_TURN: 1,
        sc.KVT_ENGINE_ID: "engine-p",
        sc.KVT_ROLE: sc.ROLE_PREFILL,
        sc.KVT_PROMPT_TOKENS: 500,
        sc.KVT_LOCAL_HIT_TOKENS: 256,
        sc.KVT_REMOTE_TOKENS: 499,
        sc.KVT_PULLED_TOKENS: 243,
        sc.KVT_RECOMPUTED_TOKENS: 1,
        sc.KVT_PEER_ENGINE_ID: "engine-d",
        sc.KVT_DECISION: sc.OUTCOME_PULLED,
        sc.KVT_BYTES: 16 * 16 * 262144,
    }


def test_expired_pull_settles_decision_and_recomputes(tracer_provider, span_exporter):
    rec = _recorder(tracer_provider, load_failure_policy="recompute")
    rec.request_started("r", phase=sc.ROLE_PREFILL, prompt_tokens=300, kv_params=None)
    rec.decision(
        "r",
        direction=sc.DIRECTION_D2P,
        outcome=None,
        prompt_tokens=300,
        local_hit_tokens=0,
        remote_tokens=280,
        pulled_tokens=280,
    )
    rec.transfer_started("r", direction=sc.DIRECTION_D2P, tokens=280, blocks=18)
    rec.transfer_finished("r", status=sc.TRANSFER_EXPIRED)
    summary = rec.request_finished("r")
    spans = _by_name(span_exporter)
    decision, transfer = spans[sc.SPAN_KV_DECISION], spans[sc.SPAN_KV_TRANSFER]
    assert decision.attributes[sc.KV_OUTCOME] == sc.OUTCOME_EXPIRED
    assert (decision.attributes[sc.KV_PULLED_TOKENS], decision.attributes[sc.KV_RECOMPUTED_TOKENS]) == (0, 300)
    assert transfer.status.status_code is StatusCode.ERROR
    assert transfer.attributes[sc.ERROR_TYPE] == sc.TRANSFER_EXPIRED
    assert decision.parent is None or not decision.parent.is_remote  # no trace context given: a new trace
    assert (summary[sc.KVT_DECISION], summary[sc.KVT_PULLED_TOKENS], summary[sc.KVT_BYTES]) == (
        sc.OUTCOME_EXPIRED,
        0,
        0,
    )


def test_immediate_outcomes_and_abort(tracer_provider, span_exporter):
    rec = _recorder(tracer_provider)
    rec.request_started("a", phase=sc.ROLE_PREFILL, prompt_tokens=100, kv_params=_params(2))
    rec.decision(
        "a",
        direction=sc.DIRECTION_D2P,
        outcome=sc.OUTCOME_BELOW_THRESHOLD,
        prompt_tokens=100,
        local_hit_tokens=64,
        remote_tokens=100,
    )
    rec.request_finished("a")
    rec.request_started("b", phase=sc.ROLE_PREFILL, prompt_tokens=100)
    rec.decision(
        "b",
        direction=sc.DIRECTION_D2P,
        outcome=None,
        prompt_tokens=100,
        local_hit_tokens=0,
        remote_tokens=100,
        pulled_tokens=100,
    )
    rec.transfer_started("b", direction=sc.DIRECTION_D2P, tokens=100, blocks=7)
    rec.request_finished("b", error_type="aborted")  # aborted mid-load
    outcomes = {
        s.attributes[sc.GEN_AI_REQUEST_ID]: s.attributes[sc.KV_OUTCOME]
        for s in span_exporter.get_finished_spans()
        if s.name == sc.SPAN_KV_DECISION
    }
    assert outcomes == {"a": sc.OUTCOME_BELOW_THRESHOLD, "b": sc.OUTCOME_FAILED}
    below = next(
        s
        for s in span_exporter.get_finished_spans()
        if s.name == sc.SPAN_KV_DECISION and s.attributes[sc.GEN_AI_REQUEST_ID] == "a"
    )
    assert below.attributes[sc.KV_RECOMPUTED_TOKENS] == 36
    transfers = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_TRANSFER]
    assert [t.attributes[sc.KV_TRANSFER_STATUS] for t in transfers] == [sc.TRANSFER_FAILED]


def test_retention_on_decode(tracer_provider, span_exporter):
    rec = KVRecorder(
        tracer_provider,
        engine_id="engine-d",
        role=sc.ROLE_DECODE,
        block_size=16,
        bytes_per_block=1024,
        threshold=64,
        ttl_s=480.0,
    )
    rec.request_started("d1", phase=sc.ROLE_DECODE, prompt_tokens=200, kv_params=_params(0))
    fields = rec.retention_started("d1", blocks=14, tokens=220, expiry_deadline=999.0)
    summary = rec.request_finished("d1", output_tokens=20)
    assert fields == {sc.KVT_RETAINED_BLOCKS: 14, sc.KVT_RETAINED_BYTES: 14 * 1024, sc.KVT_RETAINED_TTL_S: 480.0}
    assert summary[sc.KVT_RETAINED_BYTES] == 14 * 1024
    assert rec.retained() == {"d1": (14, 14 * 1024)}
    assert rec.retention_ended("d1", sc.RETENTION_READ) is True
    assert rec.retention_ended("d1", sc.RETENTION_EXPIRED) is False
    spans = _by_name(span_exporter)
    retention, engine = spans[sc.SPAN_KV_RETENTION], spans[sc.SPAN_ENGINE_DECODE]
    assert retention.parent.span_id == engine.context.span_id
    assert dict(retention.attributes) == {
        sc.GEN_AI_REQUEST_ID: "d1",
        sc.SESSION_ID: "conv-1",
        sc.GEN_AI_CONVERSATION_ID: "conv-1",
        sc.TURN_INDEX: 0,
        sc.ENGINE_ID: "engine-d",
        sc.ENGINE_ROLE: sc.ROLE_DECODE,
        sc.KV_RETENTION_BLOCKS: 14,
        sc.KV_RETENTION_TOKENS: 220,
        sc.KV_RETENTION_BYTES: 14 * 1024,
        sc.KV_RETENTION_TTL_S: 480.0,
        sc.KV_EXPIRY_DEADLINE: 999.0,
        sc.KV_RETENTION_OUTCOME: sc.RETENTION_READ,
    }
    assert engine.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 20


def test_shutdown_releases_retained_blocks(tracer_provider, span_exporter):
    rec = _recorder(tracer_provider)
    rec.request_started("x", phase=sc.ROLE_DECODE, prompt_tokens=10)
    rec.retention_started("x", blocks=1, tokens=10)
    rec.request_finished("x")
    rec.shutdown()
    ret = _by_name(span_exporter)[sc.SPAN_KV_RETENTION]
    assert ret.attributes[sc.KV_RETENTION_OUTCOME] == sc.RETENTION_RELEASED
    assert rec.retained() == {}


class _Raising(SpanExporter):
    def export(self, spans):
        raise RuntimeError("exporter down")

    def shutdown(self):
        pass


def test_telemetry_failures_never_raise(caplog):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_Raising()))
    rec = _recorder(provider)
    with caplog.at_level(logging.ERROR):
        rec.request_started("r", phase=sc.ROLE_PREFILL, prompt_tokens=10)
        rec.decision(
            "r", direction=sc.DIRECTION_D2P, outcome=sc.OUTCOME_NO_REMOTE, prompt_tokens=10, local_hit_tokens=0
        )
        summary = rec.request_finished("r")
    assert summary[sc.KVT_DECISION] == sc.OUTCOME_NO_REMOTE
    # garbage input is logged, not raised
    assert rec.decision(None, direction=None, outcome=None, prompt_tokens="x", local_hit_tokens=None) is None
    assert rec.request_finished("never-started") == {}


# ------------------------------------------------------------------------------ deferred mode
TRACEPARENT_2 = "00-11111111111111111111111111111111-2222222222222222-01"


class _Clock:
    """A clock the recorder reads instead of time.time_ns: 1 µs per reading."""

    def __init__(self):
        self.now = 1_700_000_000_000_000_000

    def __call__(self):
        self.now += 1000
        return self.now


def _scenario(rec) -> list:
    """Every recorder call kind, in one sequence; returns what the calls returned."""
    out = []
    # P leg, pulled, with the proxy's context and NIXL stats
    rec.request_started("p1", phase=sc.ROLE_PREFILL, prompt_tokens=500, kv_params=_params(1), public_id="pub-1")
    rec.decision(
        "p1",
        direction=sc.DIRECTION_D2P,
        outcome=None,
        prompt_tokens=500,
        local_hit_tokens=256,
        remote_tokens=499,
        pulled_tokens=243,
        expiry_deadline=1234.5,
        expiry_remaining_s=470.0,
        peer_engine_id="engine-d",
        remote_request_id="d-req-1",
    )
    rec.transfer_started("p1", direction=sc.DIRECTION_D2P, tokens=243, blocks=16, peer_engine_id="engine-d")
    rec.nixl_stats("p1", {sc.NIXL_NUM_TRANSFERS: 2, sc.NIXL_BYTES: 30})
    rec.transfer_finished("p1", status=sc.TRANSFER_OK, xfer_ms=1.5, post_ms=0.25)
    out.append(rec.request_finished("p1", output_tokens=1, cached_tokens=499))
    # expired pull, no context: a new trace
    rec.request_started("p2", phase=sc.ROLE_PREFILL, prompt_tokens=300)
    rec.decision(
        "p2",
        direction=sc.DIRECTION_D2P,
        outcome=None,
        prompt_tokens=300,
        local_hit_tokens=0,
        remote_tokens=280,
        pulled_tokens=280,
    )
    rec.transfer_started("p2", direction=sc.DIRECTION_D2P, tokens=280, blocks=18)
    rec.transfer_finished("p2", status=sc.TRANSFER_EXPIRED, error_type=sc.TRANSFER_EXPIRED)
    out.append(rec.request_finished("p2"))
    # below threshold; an invalid traceparent header: a new trace
    rec.request_started("p3", phase=sc.ROLE_PREFILL, prompt_tokens=100, headers={"TraceParent": "00-garbage"})
    rec.decision(
        "p3",
        direction=sc.DIRECTION_D2P,
        outcome=sc.OUTCOME_BELOW_THRESHOLD,
        prompt_tokens=100,
        local_hit_tokens=64,
        remote_tokens=100,
    )
    out.append(rec.request_finished("p3"))
    # aborted mid-load, context from the trace headers
    rec.request_started("p4", phase=sc.ROLE_PREFILL, prompt_tokens=100, headers={"traceparent": TRACEPARENT_2})
    rec.decision(
        "p4",
        direction=sc.DIRECTION_D2P,
        outcome=None,
        prompt_tokens=100,
        local_hit_tokens=0,
        remote_tokens=100,
        pulled_tokens=100,
    )
    rec.transfer_started("p4", direction=sc.DIRECTION_D2P, tokens=100, blocks=7)
    out.append(rec.request_finished("p4", error_type="aborted"))
    # D leg: pulled, retained, read; retained again twice (the first is released); retention
    # of an unknown request; one request still open and one retention still held at shutdown
    rec.request_started("d1", phase=sc.ROLE_DECODE, prompt_tokens=200, kv_params=_params(0))
    rec.decision(
        "d1",
        direction=sc.DIRECTION_P2D,
        outcome=None,
        prompt_tokens=200,
        local_hit_tokens=0,
        remote_tokens=200,
        pulled_tokens=200,
        peer_engine_id="engine-p",
    )
    rec.transfer_started("d1", direction=sc.DIRECTION_P2D, tokens=200, blocks=13, nbytes=777)
    rec.transfer_finished("d1", status=sc.TRANSFER_FAILED, error_type="nixl_error")
    out.append(rec.retention_started("d1", blocks=14, tokens=220, expiry_deadline=999.0))
    out.append(rec.retention_started("d1", blocks=15, tokens=230))
    out.append(rec.request_finished("d1", output_tokens=20))
    out.append(rec.retention_ended("d1", sc.RETENTION_READ))
    out.append(rec.retention_started("gone", blocks=1, tokens=16))
    rec.request_started("open", phase=sc.ROLE_DECODE, prompt_tokens=10, kv_params=_params(5))
    rec.decision(
        "open",
        direction=sc.DIRECTION_P2D,
        outcome=None,
        prompt_tokens=10,
        local_hit_tokens=0,
        remote_tokens=10,
        pulled_tokens=10,
    )
    rec.transfer_started("open", direction=sc.DIRECTION_P2D, tokens=10, blocks=1)
    rec.shutdown()
    return out


def _run_scenario(deferred: bool):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rec = _recorder(provider, deferred=deferred)
    rec._clock = _Clock()
    returned = _scenario(rec)
    assert rec.flush(timeout=30) is True
    return rec, returned, list(exporter.get_finished_spans())


def _canonical(spans):
    """Spans without their random ids: trace = index of first appearance (a remote trace keeps
    its id); parent = index of the parent span in ``spans`` (a remote parent keeps its id)."""
    index = {s.context.span_id: i for i, s in enumerate(spans)}
    traces: dict[int, object] = {}
    remote = {int(tp[3:35], 16) for tp in (TRACEPARENT, TRACEPARENT_2)}
    out = []
    for s in spans:
        tid = s.context.trace_id
        trace = format(tid, "032x") if tid in remote else traces.setdefault(tid, f"trace#{len(traces)}")
        parent = None
        if s.parent is not None:
            parent = f"remote:{s.parent.span_id:016x}" if s.parent.is_remote else index[s.parent.span_id]
        out.append(
            {
                "name": s.name,
                "kind": s.kind,
                "trace": trace,
                "parent": parent,
                "attributes": dict(s.attributes),
                "start": s.start_time,
                "end": s.end_time,
                "status": (s.status.status_code, s.status.description),
                "events": [(e.name, dict(e.attributes), e.timestamp) for e in s.events],
                "scope": s.instrumentation_scope.name,
                "flags": s.context.trace_flags,
            }
        )
    return out


def test_deferred_spans_equal_sync_spans():
    sync_rec, sync_returned, sync_spans = _run_scenario(deferred=False)
    rec, returned, spans = _run_scenario(deferred=True)
    assert (sync_rec.deferred, rec.deferred) == (False, True)
    assert len(spans) == len(sync_spans) == 20
    assert _canonical(spans) == _canonical(sync_spans)
    # summaries are computed on the caller's thread: identical, but for fresh trace ids
    fresh = {1, 2}  # p2 (no context) and p3 (invalid traceparent) start new traces
    for i, (got, want) in enumerate(zip(returned, sync_returned, strict=True)):
        if i in fresh:
            got, want = dict(got), dict(want)
            assert got.pop(sc.KVT_TRACE_ID) != want.pop(sc.KVT_TRACE_ID)
        assert got == want
    # the pre-assigned ids are the spans' ids: summaries name the engine spans' traces ...
    engines = [s for s in spans if s.name in (sc.SPAN_ENGINE_PREFILL, sc.SPAN_ENGINE_DECODE)]
    by_request = {s.attributes[sc.GEN_AI_REQUEST_ID]: format(s.context.trace_id, "032x") for s in engines}
    summaries = [r for r in returned if isinstance(r, dict) and sc.KVT_TRACE_ID in r]
    assert {s[sc.KVT_REQUEST_ID]: s[sc.KVT_TRACE_ID] for s in summaries} == {
        k: v for k, v in by_request.items() if k != "open"
    }
    assert by_request["pub-1"] == TRACEPARENT[3:35] and by_request["p4"] == TRACEPARENT_2[3:35]
    # ... and every local parent is a span of the same trace; ids are unique and valid
    ids = {s.context.span_id: s for s in spans}
    assert len(ids) == len(spans) and all(s.context.span_id and s.context.trace_id for s in spans)
    for s in spans:
        if s.parent is not None and not s.parent.is_remote:
            assert ids[s.parent.span_id].context.trace_id == s.context.trace_id


def test_deferred_calls_never_wait_for_the_sdk(caplog):
    """The applier thread is stuck inside the SDK: every call still returns, with its summary."""
    release, entered = threading.Event(), threading.Event()

    class Stuck(SpanProcessor):
        def on_start(self, span, parent_context=None):
            entered.set()
            release.wait(30)

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(Stuck())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rec = _recorder(provider, deferred=True)
    rec.request_started("r", phase=sc.ROLE_PREFILL, prompt_tokens=10, kv_params=_params(3))
    assert rec.flush(timeout=0.05) is False  # the applier is stuck: flush times out
    assert entered.is_set()
    rec.decision("r", direction=sc.DIRECTION_D2P, outcome=sc.OUTCOME_NO_REMOTE, prompt_tokens=10, local_hit_tokens=0)
    summary = rec.request_finished("r")
    assert summary[sc.KVT_TRACE_ID] == TRACEPARENT[3:35] and summary[sc.KVT_DECISION] == sc.OUTCOME_NO_REMOTE
    assert exporter.get_finished_spans() == ()
    release.set()
    assert rec.flush(timeout=30) is True
    assert [s.name for s in exporter.get_finished_spans()] == [sc.SPAN_KV_DECISION, sc.SPAN_ENGINE_PREFILL]


def test_deferred_needs_an_sdk_tracer():
    """A no-op provider (or an OTel-disabled SDK) has no spans to defer: calls stay synchronous."""
    from opentelemetry.trace import NoOpTracerProvider

    rec = _recorder(NoOpTracerProvider(), deferred=True)
    assert rec.deferred is False
    rec.request_started("r", phase=sc.ROLE_PREFILL, prompt_tokens=10, kv_params=_params(1))
    summary = rec.request_finished("r")
    assert (summary[sc.KVT_REQUEST_ID], summary[sc.KVT_PROMPT_TOKENS]) == ("r", 10)
    assert rec.flush(timeout=1) is True


def test_deferred_failures_are_logged_and_the_applier_continues(caplog):
    class FailsOnce(SpanProcessor):
        failed = False

        def on_start(self, span, parent_context=None):
            if not FailsOnce.failed:
                FailsOnce.failed = True
                raise RuntimeError("processor exploded")

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(FailsOnce())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(_Raising()))
    rec = _recorder(provider, deferred=True)
    with caplog.at_level(logging.ERROR):
        for rid in ("a", "b"):
            rec.request_started(rid, phase=sc.ROLE_PREFILL, prompt_tokens=10)
            rec.decision(
                rid, direction=sc.DIRECTION_D2P, outcome=sc.OUTCOME_NO_REMOTE, prompt_tokens=10, local_hit_tokens=0
            )
            assert rec.request_finished(rid)[sc.KVT_DECISION] == sc.OUTCOME_NO_REMOTE
        assert rec.flush(timeout=30) is True
    assert "processor exploded" in caplog.text
    # a's engine span did not start (its processor raised): a's decision hangs under nothing
    names = [(s.name, s.attributes[sc.GEN_AI_REQUEST_ID]) for s in exporter.get_finished_spans()]
    assert names == [(sc.SPAN_KV_DECISION, "b"), (sc.SPAN_ENGINE_PREFILL, "b")]


def test_shutdown_all_applies_queued_spans_before_providers_flush(monkeypatch):
    import weakref

    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from kvtrace import telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    monkeypatch.setattr(telemetry, "_providers", weakref.WeakSet([provider]))
    rec = _recorder(provider, deferred=True)
    rec.request_started("r", phase=sc.ROLE_PREFILL, prompt_tokens=10)
    rec.request_finished("r")
    telemetry.shutdown_all()  # what SIGTERM runs
    assert [s.name for s in exporter.get_finished_spans()] == [sc.SPAN_ENGINE_PREFILL]


def test_connector_defers_spans_inside_vllm_and_makes_the_same_ones(monkeypatch, tmp_path):
    """KVTraceNixlConnector in vLLM's real Scheduler, deferred vs synchronous spans: the same
    spans and the same kv_transfer_params for a turn 1 and a pulling turn 2 on P."""
    import time

    from support.require import require_vllm

    require_vllm()
    require_vllm("nixl")
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats

    from kvtrace.vllm.connector import KVTraceNixlConnector

    from support import vllm_rig as rig

    model_dir = rig.make_tiny_model(tmp_path / "model")
    d_params = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_block_ids": [list(range(100, 117))],
        "remote_engine_id": "engine-d",
        "remote_request_id": "chatcmpl-prev-0000abcd",
        "remote_host": "127.0.0.1",
        "remote_port": 5601,
        "tp_size": 1,
        "remote_num_tokens": 260,
        "remote_blocks_expiry_time": time.perf_counter() + 300,
        sc.KV_PARAMS_KEY: _params(2)[sc.KV_PARAMS_KEY],
    }

    def conversation(deferred: bool):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        monkeypatch.setattr(KVTraceNixlConnector, "tracer_provider", provider)
        monkeypatch.setattr(KVTraceNixlConnector, "deferred_spans", deferred)
        extra = {"bidirectional_kv_xfer": True, sc.KV_PARAMS_KEY: {"role": "prefill"}}
        sched = rig.scheduler(
            rig.vllm_config(
                model_dir,
                extra=extra,
                block_size=16,
                engine_id="engine-p",
                connector="KVTraceNixlConnector",
                module_path="kvtrace.vllm.connector",
            )
        )
        assert sched.connector._probe.recorder.deferred is deferred
        finished = []
        for i, (prompt, params) in enumerate(
            [(range(1, 101), {"do_remote_decode": True}), (range(1, 301), dict(d_params))]
        ):
            req = rig.request(
                list(prompt), params=params, max_tokens=1, block_size=16, request_id=f"chatcmpl-t{i}-abcd1234"
            )
            sched.add_request(req)
            stats = NixlKVConnectorStats()
            stats.data["transfer_duration"].append(0.004)
            outputs = [{}, {"finished_recving": {req.request_id}, "stats": stats}, {}] if i else [{}]
            for kwargs in outputs:
                out = sched.schedule()
                running = [req] if req.request_id in out.num_scheduled_tokens else []
                engine_outputs = sched.update_from_output(out, rig.runner_output(running, **kwargs))
            [params] = [o.kv_transfer_params for eo in engine_outputs.values() for o in eo.outputs if o.finish_reason]
            finished.append(params)
        assert sched.connector._probe.recorder.flush(timeout=30) is True
        for params in finished:  # time- and trace-dependent fields
            for key in (sc.KVT_TRANSFER_MS, sc.KVT_TRACE_ID):
                params[sc.KV_PARAMS_KEY].pop(key, None)
        spans = _canonical(list(exporter.get_finished_spans()))
        for span in spans:
            del span["start"], span["end"]
            span["attributes"].pop(sc.KV_EXPIRY_REMAINING_S, None)
        return finished, spans

    sync_params, sync_spans = conversation(False)
    params, spans = conversation(True)
    assert [s["name"] for s in spans] == [
        sc.SPAN_KV_DECISION,
        sc.SPAN_ENGINE_PREFILL,
        sc.SPAN_KV_TRANSFER,
        sc.SPAN_KV_DECISION,
        sc.SPAN_ENGINE_PREFILL,
    ]
    assert spans[3]["attributes"][sc.KV_OUTCOME] == sc.OUTCOME_PULLED
    assert spans == sync_spans
    assert params == sync_params
