"""A fleet worker that cannot be reached: its legs go on to another worker of the role, it leaves the
routing for --worker-cooldown (so least-loaded does not pour the fleet's turns into a dead worker,
which always looks idle), its blocks are not offered while it is out, and /health and /metrics say
how many are out."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from kvtrace import semconv as sc
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.proxy.server import start
from kvtrace.proxy.upstream import MAX_COOLDOWN_FACTOR, Health
from kvtrace.sim.cluster import SimCluster
from kvtrace.testing.proxy import BODY, CHAT, FakeWorker, closed_port, wait_for

from support.sim_stack import Clock, dead_first_prefiller, two_turn_sessions


def _servers(span_exporter) -> list:
    spans = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_PROXY_REQUEST]
    return sorted(spans, key=lambda s: s.start_time)


def test_cooldown_doubles_with_failures_in_a_row_up_to_its_cap():
    h = Health(5.0)
    ends = []
    for _ in range(7):
        h.failed(100.0)
        ends.append(h.down_until)
    assert ends == [105.0, 110.0, 120.0, 140.0, 180.0, 100.0 + 5.0 * MAX_COOLDOWN_FACTOR, 180.0]
    assert (h.up(179.9), h.up(180.0), h.ejections) == (False, True, 7)
    h.reached()
    assert (h.failures, h.up(0.0)) == (0, True)
    h.failed(100.0)
    assert h.down_until == 105.0  # a fresh run of failures starts over


def test_no_cooldown_never_takes_a_worker_out():
    h = Health(0.0)
    h.failed(100.0)
    assert (h.up(100.0), h.ejections, h.failures) == (True, 0, 1)


@pytest.mark.parametrize("policy", [sc.ROUTING_LEAST_LOADED, sc.ROUTING_KV_AWARE])
async def test_a_dead_prefiller_does_not_draw_the_turns(tracer_provider, span_exporter, policy, caplog):
    """Over the simulator (1 live P, 1 dead, 2 D): least-loaded sent every other turn or more to the dead
    P (it fails at once, so it always looks idle) and answered them 502; now every turn is served, and the
    dead P is tried once, then passed over while its cooldown runs."""
    clock = Clock()
    cluster = SimCluster(1, 2, cost=False, tracer_provider=tracer_provider, clock=clock)
    await cluster.__aenter__()
    config, dead = dead_first_prefiller(cluster, policy)
    proxy = await start(config, tracer_provider, clock=clock, port=0)
    try:
        async with aiohttp.ClientSession() as http:
            statuses = await two_turn_sessions(http, proxy.url, ("a", "b", "c"))
            async with http.get(proxy.url + "/health") as r:
                health = await r.json()
            async with http.get(proxy.url + "/metrics") as r:
                metrics = await r.text()
    finally:
        await proxy.close()
        await cluster.__aexit__(None, None, None)
    assert statuses == [200] * 6
    assert [r.getMessage() for r in caplog.records if r.name == "kvtrace.proxy.upstream"] == [
        f"kvtrace proxy: prefill worker http://127.0.0.1:{dead} could not be reached (ClientConnectorError): "
        "out of the routing for 60 s"
    ]
    await wait_for(lambda: len(_servers(span_exporter)) == 6)
    servers = _servers(span_exporter)
    live = cluster.prefill_urls[0]
    assert [s.attributes[sc.PROXY_PREFILL_ENDPOINT] for s in servers] == [live] * 6
    attempts = [s.attributes.get(sc.PROXY_PREFILL_ATTEMPTS) for s in servers]
    assert attempts == [2, None, None, None, None, None]  # only the first turn tried the dead P
    assert servers[0].attributes[sc.ROUTE_PREFILL_REASON] == sc.ROUTE_FAILOVER
    legs = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_PROXY_PREFILL]
    dead_legs = [s for s in legs if s.attributes[sc.SERVER_PORT] == dead]
    assert [s.attributes[sc.ERROR_TYPE] for s in dead_legs] == ["ClientConnectorError"]
    # later turns of a session still reuse D's blocks: the failover kept the offer
    assert [s.attributes[sc.PROXY_OFFER] for s in servers] == [False, True] * 3
    assert (health["prefill_workers_down"], health["decode_workers_down"]) == (1, 0)
    assert f'{sc.METRIC_PROXY_WORKERS_DOWN}{{role="prefill"}} 1.0' in metrics
    assert f'{sc.METRIC_PROXY_EJECTIONS}_total{{role="prefill"}} 1.0' in metrics
    assert f'{sc.METRIC_PROXY_EJECTIONS}_total{{role="decode"}} 0.0' in metrics
    up = sorted(line for line in metrics.splitlines() if line.startswith(sc.METRIC_PROXY_WORKER_UP + "{"))
    expected = [(sc.ROLE_PREFILL, f"http://127.0.0.1:{dead}", 0), (sc.ROLE_PREFILL, live, 1)]
    expected += [(sc.ROLE_DECODE, u, 1) for u in cluster.decode_urls]
    assert up == sorted(f'{sc.METRIC_PROXY_WORKER_UP}{{endpoint="{e}",role="{r}"}} {v}.0' for r, e, v in expected)


async def test_a_dead_holder_is_passed_over_and_its_blocks_not_offered(tracer_provider, span_exporter):
    """session-affine, 2 D: a's turn 0 on dA, b's on dB; dA dies.  c's turn 0, rotated to dA, goes on to dB
    (failover); then a's turn 1 is not offered dA's blocks (holder_down) and goes to the least-loaded live D."""
    p = await FakeWorker("p0").start()
    da, db = await FakeWorker("dA").start(), await FakeWorker("dB").start()
    config = ProxyConfig(
        prefill=[Worker("127.0.0.1", p.port)],
        decode=[Worker("127.0.0.1", da.port), Worker("127.0.0.1", db.port)],
        routing=sc.ROUTING_SESSION_AFFINE,
        prefix_match=False,
    )
    proxy = await start(config, tracer_provider, port=0)
    statuses = []
    async with aiohttp.ClientSession() as http:

        async def turn(conv: str) -> None:
            async with http.post(proxy.url + CHAT, json={**BODY, sc.BODY_CONVERSATION_ID: conv}) as r:
                statuses.append(r.status)

        await turn("a")
        await turn("b")
        await da.close()
        await turn("c")
        await turn("a")
    await proxy.close()
    await p.close()
    await db.close()
    assert statuses == [200] * 4
    await wait_for(lambda: len(_servers(span_exporter)) == 4)
    keep = (
        sc.SESSION_ID,
        sc.PROXY_OFFER_REASON,
        sc.PROXY_DECODE_ENDPOINT,
        sc.ROUTE_DECODE_REASON,
        sc.PROXY_DECODE_ATTEMPTS,
    )
    got = [tuple(s.attributes.get(k) for k in keep) for s in _servers(span_exporter)]
    assert got == [
        ("a", sc.OFFER_NO_ENTRY, da.url, sc.ROUTE_LEAST_LOADED, None),
        ("b", sc.OFFER_NO_ENTRY, db.url, sc.ROUTE_LEAST_LOADED, None),
        ("c", sc.OFFER_NO_ENTRY, db.url, sc.ROUTE_FAILOVER, 2),
        ("a", sc.OFFER_HOLDER_DOWN, db.url, sc.ROUTE_LEAST_LOADED, None),  # no holder: the entry was dropped
    ]
    d_legs = sorted(
        (s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_PROXY_DECODE), key=lambda s: s.start_time
    )
    failover = [(s.attributes[sc.SERVER_PORT], s.attributes.get(sc.PROXY_FAILOVER)) for s in d_legs]
    assert failover == [(da.port, None), (db.port, None), (da.port, None), (db.port, True), (db.port, None)]
    assert p.received[-1][1]["kv_transfer_params"]["remote_engine_id"] is None  # nothing offered to P


async def test_the_model_list_comes_from_a_d_that_answers(tracer_provider):
    p, d = await FakeWorker("p0").start(), await FakeWorker("d0").start()
    dead = closed_port()
    config = ProxyConfig(
        prefill=[Worker("127.0.0.1", p.port)], decode=[Worker("127.0.0.1", dead), Worker("127.0.0.1", d.port)]
    )
    proxy = await start(config, tracer_provider, port=0)
    alone_config = ProxyConfig(prefill=[Worker("127.0.0.1", p.port)], decode=[Worker("127.0.0.1", dead)])
    alone = await start(alone_config, tracer_provider, port=0)
    got = []
    async with aiohttp.ClientSession() as http:
        for url in (proxy.url, proxy.url, proxy.url, alone.url):
            async with http.get(url + "/v1/models") as r:
                got.append((r.status, await r.json()))
        async with http.get(proxy.url + "/health") as r:
            down = (await r.json())["decode_workers_down"]
    await proxy.close()
    await alone.close()
    await p.close()
    await d.close()
    listed = {"object": "list", "data": [{"id": "fake", "object": "model"}]}
    msg = f"decode worker http://127.0.0.1:{dead} failed: ClientConnectorError"
    failed = {"message": msg, "type": "upstream_error"}
    assert got == [(200, listed)] * 3 + [(502, {"error": {**failed, "code": 502}})]
    assert down == 1


async def test_a_burst_at_a_dead_worker_fails_over_once_and_counts_one_ejection(tracer_provider, span_exporter):
    """32 concurrent turns, least-loaded over a dead P and a live one: the legs already sent to the dead
    P when it went out fail over too, and are not counted again (one ejection, one cooldown)."""
    p, d = await FakeWorker("p0").start(), await FakeWorker("d0").start()
    dead = closed_port()
    config = ProxyConfig(
        prefill=[Worker("127.0.0.1", dead), Worker("127.0.0.1", p.port)],
        decode=[Worker("127.0.0.1", d.port)],
        routing=sc.ROUTING_LEAST_LOADED,
        prefix_match=False,
    )
    proxy = await start(config, tracer_provider, port=0)
    async with aiohttp.ClientSession() as http:

        async def turn(i: int) -> int:
            async with http.post(proxy.url + CHAT, json={**BODY, sc.BODY_CONVERSATION_ID: f"c{i}"}) as r:
                await r.read()
                return r.status

        statuses = await asyncio.gather(*(turn(i) for i in range(32)))
        async with http.get(proxy.url + "/metrics") as r:
            metrics = await r.text()
    await proxy.close()
    await p.close()
    await d.close()
    assert statuses == [200] * 32
    assert len(p.received) == 32
    await wait_for(lambda: len(_servers(span_exporter)) == 32)
    tried_dead = [s for s in _servers(span_exporter) if s.attributes.get(sc.PROXY_PREFILL_ATTEMPTS) == 2]
    assert tried_dead and all(s.attributes[sc.ROUTE_PREFILL_REASON] == sc.ROUTE_FAILOVER for s in tried_dead)
    assert f'{sc.METRIC_PROXY_EJECTIONS}_total{{role="prefill"}} 1.0' in metrics
