"""D's KV pool bounds retention as in vLLM: blocks held for a remote reader are never evicted, a
request that needs them waits in the scheduler's FCFS queue until a pull, a notification or the
TTL returns them, and the wait is on its engine span (``kvtrace.engine.queue.*``).

Pools of 10 blocks of 16 tokens; zero-cost simulator on an injected clock, so every wait is exact."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from kvtrace import semconv as sc
from kvtrace.sim.cluster import SimCluster
from kvtrace.testing.wait import wait_for_async

from support.pd_legs import d_leg, p_leg

TTL = {"kv_connector_extra_config": {"decoder_kv_blocks_ttl": 60}}


class FakeClock:
    def __init__(self, now: float = 5000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def engine_span(exporter, rid: str):
    found = [
        s
        for s in exporter.get_finished_spans()
        if s.name in (sc.SPAN_ENGINE_PREFILL, sc.SPAN_ENGINE_DECODE) and s.attributes[sc.GEN_AI_REQUEST_ID] == rid
    ]
    assert len(found) == 1, rid
    return found[0]


def plain(rid: str, engine_id: str, role: str, prompt: int) -> dict:
    """The engine-span attributes of a one-token request without kv_transfer_params."""
    return {
        sc.GEN_AI_REQUEST_ID: rid,
        sc.ENGINE_ID: engine_id,
        sc.ENGINE_ROLE: role,
        sc.KV_PROMPT_TOKENS: prompt,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 1,
        sc.REQUEST_CACHED_TOKENS: 0,
    }


def queued(wait_ms: float, reason: str, needed: int, free: int, held: int, freed_by: str | None) -> dict:
    out = {
        sc.ENGINE_QUEUE_WAIT_MS: wait_ms,
        sc.ENGINE_QUEUE_REASON: reason,
        sc.ENGINE_QUEUE_BLOCKS_NEEDED: needed,
        sc.ENGINE_QUEUE_BLOCKS_FREE: free,
        sc.ENGINE_QUEUE_BLOCKS_HELD: held,
    }
    if freed_by is not None:
        out[sc.ENGINE_QUEUE_FREED_BY] = freed_by
    return out


async def post(session, url: str, prompt: list[int], rid: str, params: dict | None = None):
    body = {"prompt": prompt, "max_tokens": 1}
    if params is not None:
        body["kv_transfer_params"] = params
    async with session.post(url + "/v1/completions", json=body, headers={"X-Request-Id": rid}) as r:
        return r.status, await r.json()


async def test_requests_wait_in_order_for_retained_blocks_until_the_ttl_frees_them(tracer_provider, span_exporter):
    clock = FakeClock()
    async with (
        SimCluster(
            0, 1, cost=False, tracer_provider=tracer_provider, kv_config=TTL, capacity_blocks=10, clock=clock
        ) as c,
        aiohttp.ClientSession() as s,
    ):
        engine, url = c.decode[0].engine, c.decode_urls[0]
        status, body = await post(s, url, ids(1, 64), "keep", {"kvtrace": {}})  # D retains its 4 blocks
        assert status == 200 and len(body["kv_transfer_params"]["remote_block_ids"][0]) == 4
        big = asyncio.create_task(post(s, url, ids(1000, 97), "big"))  # 7 blocks: 6 free
        await wait_for_async(lambda: engine.waiting == 1, 5, "big queued", interval=0.001)
        small = asyncio.create_task(post(s, url, ids(2000, 16), "small"))  # 1 block fits, but big is first
        await wait_for_async(lambda: engine.waiting == 2, 5, "small queued", interval=0.001)
        clock.now += 59.0
        assert engine.holds.sweep() == 0 and engine.waiting == 2  # evicting held blocks is never an option
        clock.now += 1.0
        assert engine.holds.sweep() == 1
        assert [(await asyncio.wait_for(t, 10))[0] for t in (big, small)] == [200, 200]
        assert (engine.waiting, engine.cache.num_used) == (0, 0)

    d0 = ("sim-decode-0", sc.ROLE_DECODE)
    assert dict(engine_span(span_exporter, "big").attributes) == {
        **plain("big", *d0, 97),
        **queued(60_000.0, sc.QUEUE_KV_HELD, 7, 6, 4, sc.RETENTION_EXPIRED),
    }
    # zero cost: big ran to its end (and freed its blocks) before small, behind it, was looked at
    assert dict(engine_span(span_exporter, "small").attributes) == {
        **plain("small", *d0, 16),
        **queued(60_000.0, sc.QUEUE_FCFS, 1, 6, 4, sc.FREED_FINISHED),
    }
    assert sc.ENGINE_QUEUE_WAIT_MS not in engine_span(span_exporter, "keep").attributes  # it never waited


async def test_a_request_waiting_for_retained_blocks_gets_in_when_the_next_turn_pulls_them(
    tracer_provider, span_exporter
):
    clock = FakeClock()
    async with (
        SimCluster(cost=False, tracer_provider=tracer_provider, capacity_blocks=10, clock=clock) as c,
        aiohttp.ClientSession() as s,
    ):
        engine = c.decode[0].engine
        turn1 = {"prompt": ids(1, 48)}
        status, p1 = await p_leg(s, c, turn1, "a-0", None)
        assert status == 200
        _, d1 = await d_leg(s, c, turn1, "a-0", p1["kv_transfer_params"], 81)
        assert d1["remote_num_tokens"] == 128 and len(d1["remote_block_ids"][0]) == 8  # 8 of 10 blocks held
        waiting = asyncio.create_task(post(s, c.decode_urls[0], ids(5000, 40), "w"))  # 3 blocks: 2 free
        await wait_for_async(lambda: engine.waiting == 1, 5, "w queued", interval=0.001)
        clock.now += 7.0
        status, p2 = await p_leg(s, c, {"prompt": ids(1, 140)}, "a-1", d1)  # pulls 128 - 48 (P's hit) tokens
        assert status == 200
        summary = p2["kv_transfer_params"][sc.KV_PARAMS_KEY]
        assert (summary[sc.KVT_DECISION], summary[sc.KVT_PULLED_TOKENS]) == (sc.OUTCOME_PULLED, 80)
        assert (await asyncio.wait_for(waiting, 10))[0] == 200

    retention = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_RETENTION]
    assert [r.attributes[sc.KV_RETENTION_OUTCOME] for r in retention] == [sc.RETENTION_READ]
    assert dict(engine_span(span_exporter, "w").attributes) == {
        **plain("w", "sim-decode-0", sc.ROLE_DECODE, 40),
        **queued(7_000.0, sc.QUEUE_KV_HELD, 3, 2, 8, sc.RETENTION_READ),
    }


async def test_a_request_cancelled_while_queued_keeps_its_wait_and_lets_the_next_one_in(tracer_provider, span_exporter):
    """Running requests' blocks (kv_in_use); the head of the queue goes away and the request
    behind it, which fits, is admitted without any block coming back."""
    clock = FakeClock()
    async with SimCluster(0, 1, cost=False, tracer_provider=tracer_provider, capacity_blocks=10, clock=clock) as c:
        engine = c.decode[0].engine

        def submit(prompt, rid):
            return engine.submit(prompt, max_tokens=1, params=None, request_id=rid, internal_id=rid + "-0")

        running = submit(ids(1, 100), "running")
        await running.prefill()  # 7 blocks in use until it finishes
        head, behind = submit(ids(500, 80), "head"), submit(ids(900, 16), "behind")  # 5 blocks, 1 block
        head_task = asyncio.create_task(head.prefill())
        await wait_for_async(lambda: engine.waiting == 1, 5, "head queued", interval=0.001)
        behind_task = asyncio.create_task(behind.prefill())
        await wait_for_async(lambda: engine.waiting == 2, 5, "behind queued", interval=0.001)
        clock.now += 2.0
        head_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await head_task
        head.abort(sc.ERROR_CLIENT_DISCONNECT)
        await asyncio.wait_for(behind_task, 10)
        assert (engine.waiting, engine.cache.num_used) == (0, 8)
        behind.finish()
        running.finish()
        assert engine.cache.num_used == 0

    d0 = ("sim-decode-0", sc.ROLE_DECODE)
    head_attrs = {
        **plain("head", *d0, 80),
        **queued(2_000.0, sc.QUEUE_KV_IN_USE, 5, 3, 0, None),
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 0,
        sc.ERROR_TYPE: sc.ERROR_CLIENT_DISCONNECT,
    }
    assert dict(engine_span(span_exporter, "head").attributes) == head_attrs
    assert dict(engine_span(span_exporter, "behind").attributes) == {
        **plain("behind", *d0, 16),
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 0,
        **queued(2_000.0, sc.QUEUE_FCFS, 1, 3, 0, None),
    }


async def test_d_waiting_for_its_pool_keeps_p_lease_alive_with_heartbeats(tracer_provider, span_exporter):
    """vLLM's D heartbeats P's lease from the request's arrival until its load: a D leg that waits
    60 s for D's pool still reads P's blocks although P's lease is 30 s."""
    clock = FakeClock()
    async with (
        SimCluster(cost=False, tracer_provider=tracer_provider, capacity_blocks=10, clock=clock, kv_config=TTL) as c,
        aiohttp.ClientSession() as s,
    ):
        p_engine, d_engine = c.prefill[0].engine, c.decode[0].engine
        a = {"prompt": ids(1, 48)}
        _, pa = await p_leg(s, c, a, "a-0", None)
        await d_leg(s, c, a, "a-0", pa["kv_transfer_params"], 81)  # D retains 8 of its 10 blocks until 5060
        b = {"prompt": ids(3000, 48)}
        _, pb = await p_leg(s, c, b, "b-0", None)  # P's lease on b's 3 blocks: until 5030
        d_b = asyncio.create_task(d_leg(s, c, b, "b-0", pb["kv_transfer_params"], 33))  # 5 blocks: 2 free
        await wait_for_async(lambda: d_engine.waiting == 1, 5, "b's D leg queued", interval=0.001)
        clock.now += 45.0
        assert p_engine.holds.sweep() == 0 and len(p_engine.holds) == 1  # past 5030, renewed by D
        clock.now += 15.0
        assert d_engine.holds.sweep() == 1  # a's retention expires: b gets in and pulls
        _, d_params = await asyncio.wait_for(d_b, 10)
        assert d_params[sc.KV_PARAMS_KEY][sc.KVT_DECISION] == sc.OUTCOME_PULLED
        assert len(p_engine.holds) == 0

    d_spans = [
        s
        for s in span_exporter.get_finished_spans()
        if s.name == sc.SPAN_ENGINE_DECODE and s.attributes[sc.GEN_AI_REQUEST_ID] == "b-0"
    ]
    assert len(d_spans) == 1
    assert dict(d_spans[0].attributes) == {
        sc.GEN_AI_REQUEST_ID: "b-0",
        sc.ENGINE_ID: "sim-decode-0",
        sc.ENGINE_ROLE: sc.ROLE_DECODE,
        sc.KV_PROMPT_TOKENS: 48,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 33,
        sc.REQUEST_CACHED_TOKENS: 48,
        **queued(60_000.0, sc.QUEUE_KV_HELD, 5, 2, 8, sc.RETENTION_EXPIRED),
    }
