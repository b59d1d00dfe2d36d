"""KVRecorder: the spans the connector and the simulator emit, exactly."""

from __future__ import annotations

import logging

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import StatusCode

from kvtrace import semconv as sc
from kvtrace.vllm.recorder import KVRecorder

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
    rec.transfer_started("req-2", direction=sc.DIRECTION_D2P, tokens=243, blocks=16, peer_engine_id="engine-d", remote_request_id="d-req-1")
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
    rec.decision("r", direction=sc.DIRECTION_D2P, outcome=None, prompt_tokens=300, local_hit_tokens=0, remote_tokens=280, pulled_tokens=280)
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
    assert (summary[sc.KVT_DECISION], summary[sc.KVT_PULLED_TOKENS], summary[sc.KVT_BYTES]) == (sc.OUTCOME_EXPIRED, 0, 0)


def test_immediate_outcomes_and_abort(tracer_provider, span_exporter):
    rec = _recorder(tracer_provider)
    rec.request_started("a", phase=sc.ROLE_PREFILL, prompt_tokens=100, kv_params=_params(2))
    rec.decision("a", direction=sc.DIRECTION_D2P, outcome=sc.OUTCOME_BELOW_THRESHOLD, prompt_tokens=100, local_hit_tokens=64, remote_tokens=100)
    rec.request_finished("a")
    rec.request_started("b", phase=sc.ROLE_PREFILL, prompt_tokens=100)
    rec.decision("b", direction=sc.DIRECTION_D2P, outcome=None, prompt_tokens=100, local_hit_tokens=0, remote_tokens=100, pulled_tokens=100)
    rec.transfer_started("b", direction=sc.DIRECTION_D2P, tokens=100, blocks=7)
    rec.request_finished("b", error_type="aborted")  # aborted mid-load
    outcomes = {s.attributes[sc.GEN_AI_REQUEST_ID]: s.attributes[sc.KV_OUTCOME] for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_DECISION}
    assert outcomes == {"a": sc.OUTCOME_BELOW_THRESHOLD, "b": sc.OUTCOME_FAILED}
    below = next(s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_DECISION and s.attributes[sc.GEN_AI_REQUEST_ID] == "a")
    assert below.attributes[sc.KV_RECOMPUTED_TOKENS] == 36
    transfers = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_TRANSFER]
    assert [t.attributes[sc.KV_TRANSFER_STATUS] for t in transfers] == [sc.TRANSFER_FAILED]


def test_retention_on_decode(tracer_provider, span_exporter):
    rec = KVRecorder(tracer_provider, engine_id="engine-d", role=sc.ROLE_DECODE, block_size=16, bytes_per_block=1024, threshold=64, ttl_s=480.0)
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
        rec.decision("r", direction=sc.DIRECTION_D2P, outcome=sc.OUTCOME_NO_REMOTE, prompt_tokens=10, local_hit_tokens=0)
        summary = rec.request_finished("r")
    assert summary[sc.KVT_DECISION] == sc.OUTCOME_NO_REMOTE
    # garbage input is logged, not raised
    assert rec.decision(None, direction=None, outcome=None, prompt_tokens="x", local_hit_tokens=None) is None
    assert rec.request_finished("never-started") == {}
