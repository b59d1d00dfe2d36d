"""A worker's connection gate: legs beyond its connections wait first come first served, each wait
is recorded (span, /metrics), a full queue is a 503 with Retry-After, and a wait is not a connect."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from multidict import CIMultiDict
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.proxy.server import start
from kvtrace.proxy.upstream import Gate, PoolFull
from kvtrace.testing.proxy import BODY, CHAT, FakeWorker, wait_for

DECODE_GATE = 0  # index of the only D worker's client in Pool.decode


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_a_gate_of_two_serves_five_waiters_in_arrival_order_and_records_each_wait():
    clock = Clock()
    gate = Gate(limit=2, max_queue=5, clock=clock)
    assert [await gate.acquire(), await gate.acquire()] == [None, None]  # free: no wait recorded
    order, waits = [], {}

    async def waiter(i: int) -> None:
        waits[i] = await gate.acquire()
        order.append(i)

    tasks = []
    for i in range(5):
        tasks.append(asyncio.create_task(waiter(i)))
        await wait_for(lambda i=i: gate.queued == i + 1)
    with pytest.raises(PoolFull) as full:
        await gate.acquire("http://w:1")
    assert (full.value.retry_after_s, gate.rejected) == (1, 1)  # nobody has waited yet: the 1 s floor
    assert str(full.value) == "worker http://w:1 is busy: 5 requests already wait for a connection"
    for k in range(5):
        clock.t = k + 1.0  # every waiter queued at t=0; the k-th slot frees at t=k+1
        gate.release()
        await wait_for(lambda k=k: len(order) == k + 1)
    assert order == [0, 1, 2, 3, 4]
    assert waits == {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0}
    assert (gate.in_use, gate.queued) == (2, 0)
    # moving average of 1..5 s with weight 0.2: 0.2, 0.56, 1.048, 1.638, 2.311 -> Retry-After 3
    gate.max_queue = 0
    with pytest.raises(PoolFull) as full:
        await gate.acquire()
    assert full.value.retry_after_s == 3
    assert gate.wait_counts[0] == 2 and sum(gate.wait_counts) == 7 and gate.wait_sum == 15.0
    gate.release()
    gate.release()
    assert gate.in_use == 0
    await asyncio.gather(*tasks)


async def test_a_waiter_that_leaves_frees_its_place_and_a_slot_granted_as_it_leaves_passes_on():
    gate = Gate(limit=1, max_queue=3)
    assert await gate.acquire() is None
    got = []

    async def waiter(name: str) -> None:
        await gate.acquire()
        got.append(name)

    b, c, d = (asyncio.create_task(waiter(n)) for n in "bcd")
    await wait_for(lambda: gate.queued == 3)
    c.cancel()  # leaves the queue while waiting
    await wait_for(lambda: gate.queued == 2)
    gate.release()  # hands the slot to b ...
    b.cancel()  # ... which is cancelled before it runs: the slot must go on to d, not be lost
    await wait_for(lambda: got == ["d"])
    assert (gate.in_use, gate.queued, b.cancelled(), c.cancelled()) == (1, 0, True, True)
    gate.release()
    assert gate.in_use == 0


@pytest.fixture
async def workers():
    p, d = await FakeWorker("p0").start(), await FakeWorker("d0", hold_each=True).start()
    yield p, d
    for event in d.held.values():
        event.set()
    await p.close()
    await d.close()


async def _proxy(p, d, tracer_provider, **cfg):
    config = ProxyConfig(prefill=[Worker("127.0.0.1", p.port)], decode=[Worker("127.0.0.1", d.port)], **cfg)
    return await start(config, tracer_provider, port=0)


async def _post(http, url: str, rid: str) -> tuple[int, dict, bytes]:
    body = {**BODY, sc.BODY_CONVERSATION_ID: f"c-{rid}"}
    async with http.post(url + CHAT, json=body, headers={sc.HEADER_REQUEST_ID: rid}) as r:
        return r.status, dict(r.headers), await r.read()


def _metrics(text: str) -> dict:
    return {
        (s.name, s.labels.get(sc.LABEL_ROLE), s.labels.get("le")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


async def test_d_legs_beyond_two_connections_queue_in_order_with_their_waits_and_a_full_queue_is_a_503(
    workers, tracer_provider, span_exporter
):
    p, d = workers
    proxy = await _proxy(p, d, tracer_provider, max_worker_connections=2, max_worker_queue=5)
    gate = proxy.proxy.pool.decode[DECODE_GATE].gate
    loop = asyncio.get_running_loop()
    rids = [f"r{i}" for i in range(7)]
    sent, queued_at, tasks = {}, {}, {}
    async with aiohttp.ClientSession() as http:
        for i, rid in enumerate(rids):
            sent[rid] = loop.time()
            tasks[rid] = asyncio.create_task(_post(http, proxy.url, rid))
            if i < 2:
                await wait_for(lambda rid=rid: rid in d.held)  # on one of the two connections
            else:
                await wait_for(lambda i=i: gate.queued == i - 1)
                queued_at[rid] = loop.time()
        status, headers, data = await _post(http, proxy.url, "r7")  # the sixth waiter: the queue is full
        assert status == 503
        assert headers["Retry-After"] == "1"
        msg = "worker " + d.url + " is busy: 5 requests already wait for a connection"
        assert json.loads(data) == {"error": {"message": msg, "type": sc.ERROR_POOL_FULL, "code": 503}}
        released_at, seen_at = {}, {}
        for k in range(5):  # free one connection at a time: the oldest waiter takes it
            released_at[rids[k]] = loop.time()
            d.held[rids[k]].set()
            await wait_for(lambda k=k: rids[k + 2] in d.held)
            seen_at[rids[k + 2]] = loop.time()
        for rid in rids[5:]:
            d.held[rid].set()
        results = await asyncio.gather(*tasks.values())
        assert [r[0] for r in results] == [200] * 7
        assert [CIMultiDict(h)[sc.HEADER_REQUEST_ID] for h, _ in d.received] == rids  # first come first served
        await wait_for(lambda: gate.in_use == 0)
        async with http.get(proxy.url + "/metrics") as r:
            metrics = _metrics(await r.text())
    await proxy.close()

    spans = span_exporter.get_finished_spans()
    legs = {s.attributes[sc.GEN_AI_REQUEST_ID]: s for s in spans if s.name == sc.SPAN_PROXY_DECODE}
    assert all(sc.PROXY_POOL_WAIT_MS not in legs[rid].attributes for rid in rids[:2])
    for k, rid in enumerate(rids[2:]):
        wait_ms = legs[rid].attributes[sc.PROXY_POOL_WAIT_MS]
        assert (released_at[rids[k]] - queued_at[rid]) * 1000 <= wait_ms, rid
        assert wait_ms <= (seen_at.get(rid, loop.time()) - sent[rid]) * 1000, rid
    prefill = [s for s in spans if s.name == sc.SPAN_PROXY_PREFILL]
    assert len(prefill) == 8 and not any(sc.PROXY_POOL_WAIT_MS in s.attributes for s in prefill)

    (server,) = [s for s in spans if s.name == sc.SPAN_PROXY_REQUEST and s.attributes[sc.GEN_AI_REQUEST_ID] == "r7"]
    ident = {k: server.attributes[k] for k in (sc.GEN_AI_REQUEST_ID, sc.SESSION_ID, sc.GEN_AI_CONVERSATION_ID)}
    assert ident == {sc.GEN_AI_REQUEST_ID: "r7", sc.SESSION_ID: "c-r7", sc.GEN_AI_CONVERSATION_ID: "c-r7"}
    ident[sc.TURN_INDEX] = server.attributes[sc.TURN_INDEX]
    assert dict(legs["r7"].attributes) == {
        **ident,
        sc.SERVER_ADDRESS: "127.0.0.1",
        sc.SERVER_PORT: d.port,
        sc.PROXY_DECODE_ENDPOINT: d.url,
        sc.ERROR_TYPE: sc.ERROR_POOL_FULL,
    }
    assert legs["r7"].status.status_code == StatusCode.ERROR
    assert (server.attributes[sc.HTTP_RESPONSE_STATUS_CODE], server.attributes[sc.ERROR_TYPE]) == (
        503,
        sc.ERROR_POOL_FULL,
    )
    assert server.attributes[sc.PROXY_DECODE_ENDPOINT] == d.url

    m = sc.METRIC_PROXY_POOL_WAIT
    assert metrics[(sc.METRIC_PROXY_POOL_REJECTED + "_total", sc.ROLE_DECODE, None)] == 1
    assert metrics[(sc.METRIC_PROXY_POOL_REJECTED + "_total", sc.ROLE_PREFILL, None)] == 0
    assert metrics[(m + "_count", sc.ROLE_DECODE, None)] == 7  # the refused one never got a slot
    assert metrics[(m + "_bucket", sc.ROLE_DECODE, "0.0")] == 2  # r0, r1 did not wait
    assert metrics[(m + "_count", sc.ROLE_PREFILL, None)] == 8
    assert metrics[(m + "_bucket", sc.ROLE_PREFILL, "0.0")] == 8
    waited_s = sum(legs[rid].attributes[sc.PROXY_POOL_WAIT_MS] for rid in rids[2:]) / 1000
    assert metrics[(m + "_sum", sc.ROLE_DECODE, None)] == pytest.approx(waited_s, abs=1e-5)
    for name in (sc.METRIC_PROXY_POOL_IN_USE, sc.METRIC_PROXY_POOL_QUEUED):
        assert metrics[(name, sc.ROLE_DECODE, None)] == metrics[(name, sc.ROLE_PREFILL, None)] == 0


async def test_a_leg_that_waited_past_the_connect_timeout_for_a_connection_still_gets_200(
    workers, tracer_provider, span_exporter
):
    p, d = workers
    connect_s = 0.2
    proxy = await _proxy(p, d, tracer_provider, max_worker_connections=1, connect_timeout_s=connect_s)
    gate = proxy.proxy.pool.decode[DECODE_GATE].gate
    async with aiohttp.ClientSession() as http:
        first = asyncio.create_task(_post(http, proxy.url, "a"))
        await wait_for(lambda: "a" in d.held)
        second = asyncio.create_task(_post(http, proxy.url, "b"))
        await wait_for(lambda: gate.queued == 1)
        await asyncio.sleep(3 * connect_s)  # the condition under test: time spent waiting, not a sync
        d.held["a"].set()
        await wait_for(lambda: "b" in d.held)
        d.held["b"].set()
        assert [(await first)[0], (await second)[0]] == [200, 200]
    await proxy.close()
    (leg,) = [
        s
        for s in span_exporter.get_finished_spans()
        if s.name == sc.SPAN_PROXY_DECODE and s.attributes[sc.GEN_AI_REQUEST_ID] == "b"
    ]
    assert leg.attributes[sc.PROXY_POOL_WAIT_MS] >= 3 * connect_s * 1000
    assert sc.ERROR_TYPE not in leg.attributes and leg.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200


def test_the_pool_bounds_default_to_their_settings_and_unusable_values_are_refused(monkeypatch):
    workers = {"prefill": [Worker("127.0.0.1", 1)], "decode": [Worker("127.0.0.1", 2)]}
    monkeypatch.setenv(settings.PROXY_MAX_WORKER_CONNECTIONS.env, "7")
    monkeypatch.setenv(settings.PROXY_MAX_WORKER_QUEUE.env, "0")  # 0: no queue, busy means 503 at once
    config = ProxyConfig(**workers)
    assert (config.max_worker_connections, config.max_worker_queue) == (7, 0)
    assert ProxyConfig(**workers, max_worker_connections=3).max_worker_connections == 3  # arguments win
    with pytest.raises(ValueError, match="^max_worker_connections must be >= 1$"):
        ProxyConfig(**workers, max_worker_connections=0)
    with pytest.raises(ValueError, match="^max_worker_queue must be >= 0$"):
        ProxyConfig(**workers, max_worker_queue=-1)
