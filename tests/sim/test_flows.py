"""Multi-turn P/D flows through real HTTP workers, asserted on params, spans and block counts.

Requests are driven the way vLLM's multi-turn disaggregation proxy drives workers: the P leg
gets ``max_tokens=1``, ``stream=false`` and ``kv_transfer_params`` with ``do_remote_decode``
(plus D's cached params from the previous turn); the D leg streams with P's returned params.
"""

from __future__ import annotations

import asyncio
import math

import aiohttp

from kvtrace import semconv as sc
from kvtrace.sim import tokenizer
from kvtrace.sim.cluster import SimCluster
from kvtrace.testing.wait import wait_for_async

from support.pd_legs import d_leg, p_leg, sse_events

BS = 16
BPB = 262_144 * BS  # qwen3-32b bytes per block
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
VLLM_KEYS = {
    "do_remote_prefill": bool,
    "do_remote_decode": bool,
    "remote_block_ids": list,
    "remote_engine_id": str,
    "remote_request_id": str,
    "remote_host": str,
    "remote_port": int,
    "tp_size": int,
    "dcp_size": int,
    "pp_size": int,
    "remote_num_tokens": int,
    "remote_registration_generation": int,
    "transfer_mode": str,
}


class FakeClock:
    def __init__(self, now: float = 5000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spans(exporter, name: str, **attrs):
    return [
        s
        for s in exporter.get_finished_spans()
        if s.name == name and all(s.attributes.get(k) == v for k, v in attrs.items())
    ]


def one(exporter, name: str, **attrs):
    found = spans(exporter, name, **attrs)
    assert len(found) == 1, (name, attrs, len(found))
    return found[0]


def assert_vllm_params(params: dict, *, on_d: bool) -> None:
    for key, typ in VLLM_KEYS.items():
        assert isinstance(params[key], typ), key
    assert params["do_remote_decode"] is on_d and params["do_remote_prefill"] is (not on_d)
    assert params["transfer_mode"] == "pull"
    assert all(isinstance(b, int) for b in params["remote_block_ids"][0])
    if on_d:
        assert isinstance(params["remote_blocks_expiry_time"], float)
    else:
        assert params["remote_blocks_expiry_time"] is None


# ---------------------------------------------------------------------------------------------
async def test_two_turn_chat_turn2_p_pulls_d_blocks(tracer_provider, span_exporter):
    clock = FakeClock()
    async with SimCluster(cost=False, tracer_provider=tracer_provider, clock=clock) as c, aiohttp.ClientSession() as s:
        msgs = [{"role": "user", "content": "plan the trip " * 40}]
        n1 = len(tokenizer.encode(tokenizer.render_chat(msgs)))
        ctx1 = {sc.CTX_TRACEPARENT: TRACEPARENT, sc.CTX_SESSION_ID: "sess-1", sc.CTX_TURN: 0}
        status, p1 = await p_leg(s, c, {"model": "m", "messages": msgs}, "turn-0", None, ctx1)
        assert status == 200
        assert_vllm_params(p1["kv_transfer_params"], on_d=False)
        assert p1["kv_transfer_params"]["remote_num_tokens"] == n1
        assert len(p1["kv_transfer_params"]["remote_block_ids"][0]) == math.ceil(n1 / BS)
        events, d1 = await d_leg(s, c, {"model": "m", "messages": msgs}, "turn-0", p1["kv_transfer_params"], 100, ctx1)
        assert_vllm_params(d1, on_d=True)
        out1 = 100
        assert d1["remote_num_tokens"] == n1 + out1 - 1
        assert d1["remote_blocks_expiry_time"] == clock.now + 480.0
        assert len(d1["remote_block_ids"][0]) == math.ceil((n1 + out1 - 1) / BS)
        assert d1["remote_engine_id"] == "sim-decode-0" and d1["remote_port"] == c.decode[0].port
        assert events[-1]["usage"] == {"prompt_tokens": n1, "total_tokens": n1 + out1, "completion_tokens": out1}
        text1 = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])

        msgs2 = msgs + [{"role": "assistant", "content": text1}, {"role": "user", "content": "and back"}]
        n2 = len(tokenizer.encode(tokenizer.render_chat(msgs2)))
        ctx2 = {sc.CTX_TRACEPARENT: TRACEPARENT, sc.CTX_SESSION_ID: "sess-1", sc.CTX_TURN: 1}
        status, p2 = await p_leg(s, c, {"model": "m", "messages": msgs2}, "turn-1", d1, ctx2)
        assert status == 200
        hit = n1 // BS * BS
        pulled = n1 + out1 - 1 - hit
        assert pulled >= 64
        summary = p2["kv_transfer_params"][sc.KV_PARAMS_KEY]
        assert summary[sc.KVT_DECISION] == sc.OUTCOME_PULLED and summary[sc.KVT_PULLED_TOKENS] == pulled

    ident = {
        sc.GEN_AI_REQUEST_ID: "turn-1",
        sc.SESSION_ID: "sess-1",
        sc.GEN_AI_CONVERSATION_ID: "sess-1",
        sc.TURN_INDEX: 1,
        sc.ENGINE_ID: "sim-prefill-0",
        sc.ENGINE_ROLE: sc.ROLE_PREFILL,
    }
    engine = one(span_exporter, sc.SPAN_ENGINE_PREFILL, **{sc.GEN_AI_REQUEST_ID: "turn-1"})
    assert dict(engine.attributes) == {
        **ident,
        sc.KV_PROMPT_TOKENS: n2,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 1,
        sc.REQUEST_CACHED_TOKENS: hit + pulled,
    }
    assert engine.parent.span_id == int(TRACEPARENT.split("-")[2], 16)
    assert engine.context.trace_id == int(TRACEPARENT.split("-")[1], 16)
    decision = one(span_exporter, sc.SPAN_KV_DECISION, **{sc.GEN_AI_REQUEST_ID: "turn-1"})
    assert dict(decision.attributes) == {
        **ident,
        sc.KV_DIRECTION: sc.DIRECTION_D2P,
        sc.KV_PROMPT_TOKENS: n2,
        sc.KV_LOCAL_HIT_TOKENS: hit,
        sc.KV_REMOTE_TOKENS: n1 + out1 - 1,
        sc.KV_PULLED_TOKENS: pulled,
        sc.KV_RECOMPUTED_TOKENS: n2 - hit - pulled,
        sc.KV_THRESHOLD: 64,
        sc.KV_LOAD_FAILURE_POLICY: "fail",
        sc.KV_EXPIRY_DEADLINE: d1["remote_blocks_expiry_time"],
        sc.KV_EXPIRY_REMAINING_S: 480.0,
        sc.KV_PEER_ENGINE_ID: "sim-decode-0",
        sc.KV_REMOTE_REQUEST_ID: d1["remote_request_id"],
        sc.KV_OUTCOME: sc.OUTCOME_PULLED,
        sc.KV_VERIFIED: sc.VERIFIED_MATCH,
        sc.KV_VERIFY_MODE: sc.VERIFY_RECORD,
        sc.KV_VERIFIED_TOKENS: n1 + out1 - 1,
    }
    assert decision.parent.span_id == engine.context.span_id
    transfer = one(span_exporter, sc.SPAN_KV_TRANSFER, **{sc.GEN_AI_REQUEST_ID: "turn-1"})
    assert dict(transfer.attributes) == {
        **ident,
        sc.KV_DIRECTION: sc.DIRECTION_D2P,
        sc.KV_TRANSFER_TOKENS: pulled,
        sc.KV_TRANSFER_BLOCKS: math.ceil(pulled / BS),
        sc.KV_TRANSFER_BYTES: math.ceil(pulled / BS) * BPB,
        sc.KV_PEER_ENGINE_ID: "sim-decode-0",
        sc.KV_REMOTE_REQUEST_ID: d1["remote_request_id"],
        sc.KV_TRANSFER_STATUS: sc.TRANSFER_OK,
        sc.KV_TRANSFER_XFER_MS: 0.0,
    }
    assert transfer.parent.span_id == decision.context.span_id
    d_engine = one(span_exporter, sc.SPAN_ENGINE_DECODE, **{sc.GEN_AI_REQUEST_ID: "turn-0"})
    retention = one(span_exporter, sc.SPAN_KV_RETENTION, **{sc.GEN_AI_REQUEST_ID: "turn-0"})
    blocks = math.ceil((n1 + out1 - 1) / BS)
    assert dict(retention.attributes) == {
        sc.GEN_AI_REQUEST_ID: "turn-0",
        sc.SESSION_ID: "sess-1",
        sc.GEN_AI_CONVERSATION_ID: "sess-1",
        sc.TURN_INDEX: 0,
        sc.ENGINE_ID: "sim-decode-0",
        sc.ENGINE_ROLE: sc.ROLE_DECODE,
        sc.KV_RETENTION_BLOCKS: blocks,
        sc.KV_RETENTION_TOKENS: n1 + out1 - 1,
        sc.KV_RETENTION_BYTES: blocks * BPB,
        sc.KV_RETENTION_TTL_S: 480.0,
        sc.KV_EXPIRY_DEADLINE: d1["remote_blocks_expiry_time"],
        sc.KV_RETENTION_OUTCOME: sc.RETENTION_READ,
    }
    assert retention.parent.span_id == d_engine.context.span_id
    d_decision = one(
        span_exporter, sc.SPAN_KV_DECISION, **{sc.GEN_AI_REQUEST_ID: "turn-0", sc.ENGINE_ID: "sim-decode-0"}
    )
    assert d_decision.attributes[sc.KV_DIRECTION] == sc.DIRECTION_P2D
    assert d_decision.attributes[sc.KV_OUTCOME] == sc.OUTCOME_PULLED
    assert d_decision.attributes[sc.KV_PULLED_TOKENS] == n1


# ---------------------------------------------------------------------------------------------
def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


async def two_turns(s, c, prompt1, out1, extra, rid="t"):
    """Turn 1 P+D, then turn 2's P leg with D's params; returns (d1 params, p2 status, p2 body)."""
    _, p1 = await p_leg(s, c, {"prompt": prompt1}, f"{rid}0", None)
    events, d1 = await d_leg(s, c, {"prompt": prompt1}, f"{rid}0", p1["kv_transfer_params"], out1)
    gen = [tokenizer.piece_id(e["choices"][0]["text"]) for e in events if e["choices"]]
    prompt2 = prompt1 + gen + extra
    status, p2 = await p_leg(s, c, {"prompt": prompt2}, f"{rid}1", d1)
    return d1, status, p2


async def test_full_local_prefix_hit_notifies_d(tracer_provider, span_exporter):
    """P already holds more than D offers: no pull, D's blocks freed by the empty read."""
    async with SimCluster(cost=False, tracer_provider=tracer_provider) as c, aiohttp.ClientSession() as s:
        prompt = ids(1, 320)
        _, p1 = await p_leg(s, c, {"prompt": prompt}, "a0", None)
        _, d1 = await d_leg(s, c, {"prompt": prompt}, "a0", p1["kv_transfer_params"], 1)
        assert d1["remote_num_tokens"] == 320  # 320 prompt + 1 output - 1
        status, p2 = await p_leg(s, c, {"prompt": prompt + ids(500, 20)}, "a1", d1)
        assert status == 200
        assert c.decode[0].engine.holds.get(d1["remote_request_id"]) is None
        assert c.decode[0].engine.cache.num_used == 0
    d = one(span_exporter, sc.SPAN_KV_DECISION, **{sc.GEN_AI_REQUEST_ID: "a1"}).attributes
    assert (d[sc.KV_OUTCOME], d[sc.KV_LOCAL_HIT_TOKENS], d[sc.KV_PULLED_TOKENS], d[sc.KV_RECOMPUTED_TOKENS]) == (
        sc.OUTCOME_LOCAL_HIT,
        320,
        0,
        20,
    )
    assert spans(span_exporter, sc.SPAN_KV_TRANSFER, **{sc.GEN_AI_REQUEST_ID: "a1"}) == []
    r = one(span_exporter, sc.SPAN_KV_RETENTION, **{sc.GEN_AI_REQUEST_ID: "a0"}).attributes
    assert r[sc.KV_RETENTION_OUTCOME] == sc.RETENTION_RELEASED and r[sc.KV_RETENTION_BLOCKS] == 20


async def test_below_threshold_recomputes(tracer_provider, span_exporter):
    async with SimCluster(cost=False, tracer_provider=tracer_provider) as c, aiohttp.ClientSession() as s:
        # P caches 160 tokens; D holds 160 + 40 - 1 = 199; count = 199 - 160 = 39 < 64
        d1, status, p2 = await two_turns(s, c, ids(1, 160), 40, ids(900, 30), rid="b")
        assert status == 200 and d1["remote_num_tokens"] == 199
    d = one(span_exporter, sc.SPAN_KV_DECISION, **{sc.GEN_AI_REQUEST_ID: "b1"}).attributes
    assert (
        d[sc.KV_OUTCOME],
        d[sc.KV_LOCAL_HIT_TOKENS],
        d[sc.KV_REMOTE_TOKENS],
        d[sc.KV_PULLED_TOKENS],
        d[sc.KV_RECOMPUTED_TOKENS],
    ) == (sc.OUTCOME_BELOW_THRESHOLD, 160, 199, 0, 230 - 160)
    assert p2["kv_transfer_params"][sc.KV_PARAMS_KEY][sc.KVT_DECISION] == sc.OUTCOME_BELOW_THRESHOLD


async def test_no_reusable_context(tracer_provider, span_exporter):
    """Turn 2 shares nothing with turn 1 from P's view and D offers nothing: no_remote."""
    async with SimCluster(cost=False, tracer_provider=tracer_provider) as c, aiohttp.ClientSession() as s:
        status, p = await p_leg(s, c, {"prompt": ids(1, 100)}, "n0", None)
        assert status == 200
    d = one(span_exporter, sc.SPAN_KV_DECISION, **{sc.GEN_AI_REQUEST_ID: "n0"}).attributes
    assert dict(d) == {
        sc.GEN_AI_REQUEST_ID: "n0",
        sc.ENGINE_ID: "sim-prefill-0",
        sc.ENGINE_ROLE: sc.ROLE_PREFILL,
        sc.KV_DIRECTION: sc.DIRECTION_D2P,
        sc.KV_PROMPT_TOKENS: 100,
        sc.KV_LOCAL_HIT_TOKENS: 0,
        sc.KV_REMOTE_TOKENS: 0,
        sc.KV_PULLED_TOKENS: 0,
        sc.KV_RECOMPUTED_TOKENS: 100,
        sc.KV_THRESHOLD: 64,
        sc.KV_LOAD_FAILURE_POLICY: "fail",
        sc.KV_OUTCOME: sc.OUTCOME_NO_REMOTE,
    }
    assert p["kv_transfer_params"]["remote_num_tokens"] == 100


async def test_ttl_expiry_without_traffic_then_p_declines(tracer_provider, span_exporter):
    clock = FakeClock()
    cfg = {"kv_connector_extra_config": {"decoder_kv_blocks_ttl": 20}}
    async with (
        SimCluster(cost=False, tracer_provider=tracer_provider, clock=clock, kv_config=cfg) as c,
        aiohttp.ClientSession() as s,
    ):
        prompt1 = ids(1, 160)
        _, p1 = await p_leg(s, c, {"prompt": prompt1}, "e0", None)
        events, d1 = await d_leg(s, c, {"prompt": prompt1}, "e0", p1["kv_transfer_params"], 100)
        d_engine = c.decode[0].engine
        assert d_engine.cache.num_used == math.ceil(259 / BS) == 17
        clock.now += 19.0
        assert d_engine.holds.sweep() == 0 and d_engine.cache.num_used == 17
        clock.now += 1.0
        assert d_engine.holds.sweep() == 1 and d_engine.cache.num_used == 0
        gen = [tokenizer.piece_id(e["choices"][0]["text"]) for e in events if e["choices"]]
        status, body = await p_leg(s, c, {"prompt": prompt1 + gen + ids(900, 10)}, "e1", d1)
        assert status == 500
        assert body == {
            "error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}
        }
    r = one(span_exporter, sc.SPAN_KV_RETENTION, **{sc.GEN_AI_REQUEST_ID: "e0"}).attributes
    assert (r[sc.KV_RETENTION_OUTCOME], r[sc.KV_RETENTION_TTL_S], r[sc.KV_RETENTION_BLOCKS]) == (
        sc.RETENTION_EXPIRED,
        20.0,
        17,
    )
    d = one(span_exporter, sc.SPAN_KV_DECISION, **{sc.GEN_AI_REQUEST_ID: "e1"}).attributes
    assert (d[sc.KV_OUTCOME], d[sc.KV_PULLED_TOKENS], d[sc.KV_RECOMPUTED_TOKENS], d[sc.KV_EXPIRY_REMAINING_S]) == (
        sc.OUTCOME_EXPIRED,
        0,
        270 - 160,
        0.0,
    )
    t = one(span_exporter, sc.SPAN_KV_TRANSFER, **{sc.GEN_AI_REQUEST_ID: "e1"}).attributes
    assert (t[sc.KV_TRANSFER_STATUS], t[sc.KV_TRANSFER_TOKENS]) == (sc.TRANSFER_EXPIRED, 99)
    e = one(span_exporter, sc.SPAN_ENGINE_PREFILL, **{sc.GEN_AI_REQUEST_ID: "e1"})
    assert e.attributes[sc.ERROR_TYPE] == "kv_expired"


async def test_within_margin_recompute_policy_keeps_d_blocks(tracer_provider, span_exporter):
    """4.9 s before D's deadline P declines (5 s margin); with 'recompute' it prefills locally
    and, sending no notification, leaves D's blocks to expire."""
    clock = FakeClock()
    cfg = {"kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"decoder_kv_blocks_ttl": 20}}
    async with (
        SimCluster(cost=False, tracer_provider=tracer_provider, clock=clock, kv_config=cfg) as c,
        aiohttp.ClientSession() as s,
    ):
        prompt1 = ids(1, 160)
        _, p1 = await p_leg(s, c, {"prompt": prompt1}, "m0", None)
        events, d1 = await d_leg(s, c, {"prompt": prompt1}, "m0", p1["kv_transfer_params"], 100)
        clock.now += 15.1
        gen = [tokenizer.piece_id(e["choices"][0]["text"]) for e in events if e["choices"]]
        status, body = await p_leg(s, c, {"prompt": prompt1 + gen + ids(900, 10)}, "m1", d1)
        assert status == 200
        assert body["kv_transfer_params"][sc.KV_PARAMS_KEY][sc.KVT_DECISION] == sc.OUTCOME_EXPIRED
        assert d1["remote_request_id"] in c.decode[0].engine.holds
    r = one(span_exporter, sc.SPAN_KV_RETENTION, **{sc.GEN_AI_REQUEST_ID: "m0"}).attributes
    assert r[sc.KV_RETENTION_OUTCOME] == sc.RETENTION_RELEASED  # cluster shutdown


async def test_pull_failure_injection(tracer_provider, span_exporter):
    async with SimCluster(cost=False, tracer_provider=tracer_provider) as c, aiohttp.ClientSession() as s:
        c.set_pull_failure(lambda dst, src, rid: dst == "sim-decode-0")
        _, p1 = await p_leg(s, c, {"prompt": ids(1, 64)}, "f0", None)
        req = {"prompt": ids(1, 64), "max_tokens": 4, "stream": True, "kv_transfer_params": p1["kv_transfer_params"]}
        async with s.post(c.decode_urls[0] + "/v1/completions", json=req, headers={"X-Request-Id": "f0"}) as resp:
            assert resp.status == 200
            events = sse_events(await resp.text())
        assert events == [
            {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}}
        ]
    t = one(span_exporter, sc.SPAN_KV_TRANSFER, **{sc.GEN_AI_REQUEST_ID: "f0"}).attributes
    assert (t[sc.KV_TRANSFER_STATUS], t[sc.ERROR_TYPE], t[sc.KV_DIRECTION]) == (
        sc.TRANSFER_FAILED,
        "injected_failure",
        sc.DIRECTION_P2D,
    )
    d = one(span_exporter, sc.SPAN_KV_DECISION, **{sc.GEN_AI_REQUEST_ID: "f0", sc.ENGINE_ID: "sim-decode-0"})
    assert d.attributes[sc.KV_OUTCOME] == sc.OUTCOME_FAILED


async def test_capacity_pressure_evicts_lru_unpinned(tracer_provider, span_exporter):
    """10 blocks per worker.  Cached unreferenced blocks are evicted LRU (a request's tail
    first); retained blocks are never evicted: a request that needs them waits until the
    retention ends, like vLLM's waiting queue."""
    clock = FakeClock()
    cfg = {"kv_connector_extra_config": {"decoder_kv_blocks_ttl": 60}}
    async with (
        SimCluster(
            0, 1, cost=False, tracer_provider=tracer_provider, kv_config=cfg, capacity_blocks=10, clock=clock
        ) as c,
        aiohttp.ClientSession() as s,
    ):
        engine = c.decode[0].engine
        url = c.decode_urls[0] + "/v1/completions"

        async def post(prompt, rid, params=None):
            body = {"prompt": prompt, "max_tokens": 1}
            if params is not None:
                body["kv_transfer_params"] = params
            async with s.post(url, json=body, headers={"X-Request-Id": rid}) as r:
                return r.status, await r.json()

        def kvt(body):
            return body["kv_transfer_params"][sc.KV_PARAMS_KEY]

        assert (await post(ids(1, 64), "c0"))[0] == 200  # 4 blocks, cached, unreferenced
        assert (await post(ids(1000, 64), "c1"))[0] == 200  # 4 more
        assert (engine.cache.num_used, engine.cache.num_cached, engine.cache.evictions) == (0, 8, 0)
        # 4 blocks: the 2 never-used ones, then c0's 2 tail blocks (least recently freed)
        assert (await post(ids(2000, 64), "c2"))[0] == 200
        assert (engine.cache.num_cached, engine.cache.evictions) == (10, 2)
        _, body = await post(ids(1, 64), "c3")  # c0's 2 head blocks still hit
        assert kvt(body)[sc.KVT_LOCAL_HIT_TOKENS] == 32 and engine.cache.evictions == 4
        # a request with (non-empty) kv_transfer_params on a bidirectional worker pins its blocks
        _, body = await post(ids(3000, 64), "c4", {"kvtrace": {}})
        assert len(body["kv_transfer_params"]["remote_block_ids"][0]) == 4
        assert (engine.cache.num_used, engine.cache.num_free, engine.cache.evictions) == (4, 6, 8)
        # 97 prompt tokens need 7 blocks: more than the 6 unpinned, so the request queues
        assert (await post(ids(4000, 200), "too-big"))[0] == 400  # 13 blocks > 10: never fits
        waiting = asyncio.create_task(post(ids(4000, 97), "c5"))
        await wait_for_async(lambda: engine.waiting == 1, 5, "c5 queued", interval=0.001)
        clock.now += 60.0
        assert engine.holds.sweep() == 1
        status, body = await asyncio.wait_for(waiting, 10)
        assert status == 200 and kvt(body)[sc.KVT_PROMPT_TOKENS] == 97
        assert (engine.waiting, engine.cache.num_used) == (0, 0)
    r = one(span_exporter, sc.SPAN_KV_RETENTION, **{sc.GEN_AI_REQUEST_ID: "c4"}).attributes
    assert (r[sc.KV_RETENTION_OUTCOME], r[sc.KV_RETENTION_BLOCKS], r[sc.KV_RETENTION_TOKENS]) == (
        sc.RETENTION_EXPIRED,
        4,
        64,
    )
