"""Realistic kvtrace spans for the store benchmark, made by the real OTel SDK.

One trace per agent turn (11 spans): the agent's llm_call (CLIENT, root) -> proxy request
(SERVER, first/last-token events) -> proxy P leg and D leg (CLIENT) -> engine prefill on P ->
kv.decision (d2p) -> kv.transfer (d2p); engine decode on D -> kv.decision (p2d) ->
kv.transfer (p2d), kv.retention.  Four resources (agent, proxy, P, D) as ``kvtrace.configure``
builds them.  Timings and token counts vary like real traffic; float attributes carry full
double precision (as measured durations do), ids are random like the SDK's.
"""

from __future__ import annotations

import random
import uuid

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, set_span_in_context

import kvtrace
from kvtrace import semconv as sc

MS = 1_000_000
SPANS_PER_TRACE = 11


def _resource(service: str, **extra) -> Resource:
    base = Resource.create({})
    return base.merge(
        Resource(
            {sc.SERVICE_NAME: service, sc.SERVICE_INSTANCE_ID: uuid.uuid4().hex, sc.HOST_NAME: "gpu-node-07", **extra}
        )
    )


def _providers():
    exporter = InMemorySpanExporter()
    engine = {sc.SUBSTRATE: sc.SUBSTRATE_SIM, sc.SIM_TIME_SCALE: 1.0, sc.SIM_PRESET: "llama-8b"}
    out = {}
    for key, res in {
        "agent": _resource("kvtrace-bench"),
        "proxy": _resource("kvtrace-proxy"),
        "p": _resource("kvtrace-sim-prefill", **engine, **{sc.ENGINE_ID: "engine-p0", sc.ENGINE_ROLE: sc.ROLE_PREFILL}),
        "d": _resource("kvtrace-sim-decode", **engine, **{sc.ENGINE_ID: "engine-d0", sc.ENGINE_ROLE: sc.ROLE_DECODE}),
    }.items():
        provider = TracerProvider(resource=res)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        out[key] = provider.get_tracer("kvtrace", kvtrace.__version__)
    return out, exporter


def _turn(tr, rng: random.Random, t0: int, session: str, turn: int) -> int:
    """Emit one turn's trace starting at ``t0`` (ns); return its end."""
    rid = f"chatcmpl-{uuid.UUID(int=rng.getrandbits(128)).hex}"
    prompt = 2000 + turn * 900 + rng.randrange(400)
    out = rng.randrange(40, 400)
    remote = prompt - rng.randrange(200, 900) if turn else 0
    pulled = remote if remote >= 64 else 0
    outcome = sc.OUTCOME_PULLED if pulled else sc.OUTCOME_NO_REMOTE
    ids = {sc.SESSION_ID: session, sc.GEN_AI_CONVERSATION_ID: session, sc.TURN_INDEX: turn, sc.GEN_AI_REQUEST_ID: rid}
    ttft = rng.uniform(20, 300)
    total = ttft + out * rng.uniform(8, 14)
    end = t0 + int(total * MS) + 2 * MS
    llm = tr["agent"].start_span(
        sc.SPAN_AGENT_LLM_CALL,
        kind=SpanKind.CLIENT,
        start_time=t0,
        attributes={
            **ids,
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.GEN_AI_REQUEST_MODEL: "meta-llama/Llama-3.1-8B-Instruct",
            sc.GEN_AI_USAGE_INPUT_TOKENS: prompt,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: out,
            sc.LLM_TTFT_MS: ttft + 1.5,
            sc.LLM_TPOT_MS: (total - ttft) / out,
            sc.KV_OUTCOME: outcome,
            sc.KV_PULLED_TOKENS: pulled,
        },
    )
    ctx = set_span_in_context(llm)
    t1 = t0 + MS
    req = tr["proxy"].start_span(
        sc.SPAN_PROXY_REQUEST,
        context=ctx,
        kind=SpanKind.SERVER,
        start_time=t1,
        attributes={
            **ids,
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.GEN_AI_REQUEST_MODEL: "meta-llama/Llama-3.1-8B-Instruct",
            sc.GEN_AI_USAGE_INPUT_TOKENS: prompt,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: out,
            sc.HTTP_REQUEST_METHOD: "POST",
            sc.URL_PATH: "/v1/chat/completions",
            sc.HTTP_RESPONSE_STATUS_CODE: 200,
            sc.REQUEST_STREAM: True,
            sc.REQUEST_TTFT_MS: ttft,
            sc.REQUEST_LATENCY_MS: total,
            sc.PROXY_OFFER: turn > 0,
            sc.PROXY_OFFER_REASON: sc.OFFER_OFFERED if turn else sc.OFFER_NO_ENTRY,
            sc.PROXY_FALLBACK: sc.FALLBACK_NONE,
            sc.PROXY_PREFILL_ENDPOINT: "http://127.0.0.1:8100",
            sc.PROXY_DECODE_ENDPOINT: "http://127.0.0.1:8200",
            sc.KV_OUTCOME: outcome,
            sc.KV_PULLED_TOKENS: pulled,
            sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
        },
    )
    rctx = set_span_in_context(req)
    p_end = t1 + int(ttft * 0.8 * MS)
    leg_p = tr["proxy"].start_span(
        sc.SPAN_PROXY_PREFILL,
        context=rctx,
        kind=SpanKind.CLIENT,
        start_time=t1 + 100_000,
        attributes={
            **ids,
            sc.SERVER_ADDRESS: "127.0.0.1",
            sc.SERVER_PORT: 8100,
            sc.HTTP_RESPONSE_STATUS_CODE: 200,
            sc.PROXY_OFFER: turn > 0,
        },
    )
    eng_p = tr["p"].start_span(
        sc.SPAN_ENGINE_PREFILL,
        context=set_span_in_context(leg_p),
        start_time=t1 + 400_000,
        attributes={
            **ids,
            sc.ENGINE_ID: "engine-p0",
            sc.ENGINE_ROLE: sc.ROLE_PREFILL,
            sc.KV_PROMPT_TOKENS: prompt,
            sc.REQUEST_CACHED_TOKENS: pulled,
        },
    )
    pctx = set_span_in_context(eng_p)
    dec = tr["p"].start_span(
        sc.SPAN_KV_DECISION,
        context=pctx,
        start_time=t1 + 500_000,
        attributes={
            **ids,
            sc.ENGINE_ID: "engine-p0",
            sc.ENGINE_ROLE: sc.ROLE_PREFILL,
            sc.KV_DIRECTION: sc.DIRECTION_D2P,
            sc.KV_OUTCOME: outcome,
            sc.KV_PROMPT_TOKENS: prompt,
            sc.KV_LOCAL_HIT_TOKENS: 0,
            sc.KV_REMOTE_TOKENS: remote,
            sc.KV_PULLED_TOKENS: pulled,
            sc.KV_RECOMPUTED_TOKENS: prompt - pulled,
            sc.KV_THRESHOLD: 64,
            sc.KV_EXPIRY_REMAINING_S: rng.uniform(300, 480),
            sc.KV_PEER_ENGINE_ID: "engine-d0",
        },
    )
    xfer_ms = pulled * rng.uniform(0.002, 0.004)
    xfer = tr["p"].start_span(
        sc.SPAN_KV_TRANSFER,
        context=set_span_in_context(dec),
        start_time=t1 + 600_000,
        attributes={
            **ids,
            sc.ENGINE_ID: "engine-p0",
            sc.ENGINE_ROLE: sc.ROLE_PREFILL,
            sc.KV_DIRECTION: sc.DIRECTION_D2P,
            sc.KV_TRANSFER_TOKENS: pulled,
            sc.KV_TRANSFER_BLOCKS: pulled // 16,
            sc.KV_TRANSFER_BYTES: pulled * 131072,
            sc.KV_TRANSFER_XFER_MS: xfer_ms,
            sc.KV_TRANSFER_STATUS: sc.TRANSFER_OK,
            sc.KV_PEER_ENGINE_ID: "engine-d0",
            sc.KV_REMOTE_REQUEST_ID: rid + "-d",
        },
    )
    xfer.end(t1 + 600_000 + int(xfer_ms * MS))
    dec.end(t1 + 700_000 + int(xfer_ms * MS))
    eng_p.end(p_end - 200_000)
    leg_p.end(p_end)
    leg_d = tr["proxy"].start_span(
        sc.SPAN_PROXY_DECODE,
        context=rctx,
        kind=SpanKind.CLIENT,
        start_time=p_end + 50_000,
        attributes={
            **ids,
            sc.SERVER_ADDRESS: "127.0.0.1",
            sc.SERVER_PORT: 8200,
            sc.HTTP_RESPONSE_STATUS_CODE: 200,
            sc.REQUEST_TTFT_MS: ttft * 0.2,
        },
    )
    eng_d = tr["d"].start_span(
        sc.SPAN_ENGINE_DECODE,
        context=set_span_in_context(leg_d),
        start_time=p_end + 300_000,
        attributes={
            **ids,
            sc.ENGINE_ID: "engine-d0",
            sc.ENGINE_ROLE: sc.ROLE_DECODE,
            sc.KV_PROMPT_TOKENS: prompt,
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: out,
            sc.REQUEST_CACHED_TOKENS: prompt,
        },
    )
    dctx = set_span_in_context(eng_d)
    dec_d = tr["d"].start_span(
        sc.SPAN_KV_DECISION,
        context=dctx,
        start_time=p_end + 400_000,
        attributes={
            **ids,
            sc.ENGINE_ID: "engine-d0",
            sc.ENGINE_ROLE: sc.ROLE_DECODE,
            sc.KV_DIRECTION: sc.DIRECTION_P2D,
            sc.KV_OUTCOME: sc.OUTCOME_PULLED,
            sc.KV_PROMPT_TOKENS: prompt,
            sc.KV_LOCAL_HIT_TOKENS: 0,
            sc.KV_REMOTE_TOKENS: prompt,
            sc.KV_PULLED_TOKENS: prompt,
            sc.KV_RECOMPUTED_TOKENS: 0,
            sc.KV_THRESHOLD: 64,
            sc.KV_PEER_ENGINE_ID: "engine-p0",
        },
    )
    fwd_ms = prompt * rng.uniform(0.002, 0.004)
    fwd = tr["d"].start_span(
        sc.SPAN_KV_TRANSFER,
        context=set_span_in_context(dec_d),
        start_time=p_end + 500_000,
        attributes={
            **ids,
            sc.ENGINE_ID: "engine-d0",
            sc.ENGINE_ROLE: sc.ROLE_DECODE,
            sc.KV_DIRECTION: sc.DIRECTION_P2D,
            sc.KV_TRANSFER_TOKENS: prompt,
            sc.KV_TRANSFER_BLOCKS: -(-prompt // 16),
            sc.KV_TRANSFER_BYTES: prompt * 131072,
            sc.KV_TRANSFER_XFER_MS: fwd_ms,
            sc.KV_TRANSFER_STATUS: sc.TRANSFER_OK,
            sc.KV_PEER_ENGINE_ID: "engine-p0",
            sc.KV_REMOTE_REQUEST_ID: rid + "-p",
        },
    )
    fwd.end(p_end + 500_000 + int(fwd_ms * MS))
    dec_d.end(p_end + 600_000 + int(fwd_ms * MS))
    req.add_event(sc.EVENT_FIRST_TOKEN, timestamp=t1 + int(ttft * MS))
    req.add_event(sc.EVENT_LAST_TOKEN, timestamp=end - MS)
    held = rng.uniform(2, 30)
    ret = tr["d"].start_span(
        sc.SPAN_KV_RETENTION,
        context=dctx,
        start_time=end - 500_000,
        attributes={
            **ids,
            sc.ENGINE_ID: "engine-d0",
            sc.ENGINE_ROLE: sc.ROLE_DECODE,
            sc.KV_RETENTION_BLOCKS: -(-(prompt + out) // 16),
            sc.KV_RETENTION_TOKENS: prompt + out,
            sc.KV_RETENTION_BYTES: (prompt + out) * 131072,
            sc.KV_RETENTION_TTL_S: 480.0,
            sc.KV_RETENTION_OUTCOME: sc.RETENTION_READ,
        },
    )
    ret.end(end + int(held * 1e9))
    eng_d.end(end - 400_000)
    leg_d.end(end - 300_000)
    req.end(end - 200_000)
    llm.end(end)
    return end


def generate(n_spans: int, seed: int = 7, start_ns: int = 1_780_000_000 * 10**9) -> list[ReadableSpan]:
    """At least ``n_spans`` finished spans (11 per trace), 8 turns per session, 4 sessions interleaved."""
    tracers, exporter = _providers()
    rng = random.Random(seed)
    t = start_ns
    turn_of: dict[str, int] = {}
    sessions = [f"sess-{uuid.UUID(int=rng.getrandbits(128)).hex[:16]}" for _ in range(4)]
    for _ in range(-(-n_spans // SPANS_PER_TRACE)):
        k = rng.randrange(len(sessions))
        session = sessions[k]
        turn = turn_of.get(session, 0)
        _turn(tracers, rng, t, session, turn)
        t += rng.randrange(50, 400) * MS
        turn_of[session] = turn + 1
        if turn + 1 >= 8:
            sessions[k] = f"sess-{uuid.UUID(int=rng.getrandbits(128)).hex[:16]}"
    return list(exporter.get_finished_spans())[:n_spans]
