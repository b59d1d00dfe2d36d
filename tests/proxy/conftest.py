"""Fixtures of the proxy tests: ``rig_factory``, the proxy between fake workers (fault and hardening
tests; the proxy itself stays out of :mod:`kvtrace.testing`, which sits below it in the layout), and
``make_stack``, the proxy over the zero-cost simulator (acceptance tests)."""

from __future__ import annotations

import json

import aiohttp
import pytest

from kvtrace import semconv as sc
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.proxy.server import start
from kvtrace.sim.cluster import SimCluster
from kvtrace.testing.proxy import BODY, CHAT, FakeWorker, wait_for

from support.sim_stack import Clock, Stack, worker


class Rig:
    """A proxy between fake P and D workers, an HTTP client, and the in-memory span exporter."""

    def __init__(self, p: FakeWorker, d: FakeWorker, proxy, exporter) -> None:
        self.p, self.d, self.proxy, self.exporter = p, d, proxy, exporter
        self.http = aiohttp.ClientSession()

    async def post(self, body=None, raw: bytes | None = None, headers=None):
        data = raw if raw is not None else json.dumps(body if body is not None else BODY).encode()
        async with self.http.post(self.proxy.url + CHAT, data=data, headers=headers or {}) as r:
            return r.status, r.headers, await r.read()

    def spans(self, name):
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    async def server_span(self, n: int = 1):
        await wait_for(lambda: len(self.spans(sc.SPAN_PROXY_REQUEST)) >= n)
        return self.spans(sc.SPAN_PROXY_REQUEST)[n - 1]

    async def close(self) -> None:
        await self.http.close()
        await self.proxy.close()
        await self.p.close()
        await self.d.close()


async def make_rig(tracer_provider, exporter, p_status=200, d_kwargs=None, p_kwargs=None, p_down=False, **cfg) -> Rig:
    """Start fake P and D workers and a proxy (config ``cfg``) between them."""
    p = await FakeWorker("p0", status=p_status, **(p_kwargs or {})).start()
    d = await FakeWorker("d0", **(d_kwargs or {})).start()
    p_worker = Worker("127.0.0.1", p.port)
    if p_down:
        await p.close()  # nothing listens there any more
    cfg.setdefault("prefix_match", False)  # id-less requests stay session-less unless a test asks
    config = ProxyConfig(prefill=[p_worker], decode=[Worker("127.0.0.1", d.port)], **cfg)
    proxy = await start(config, tracer_provider, port=0)
    return Rig(p, d, proxy, exporter)


@pytest.fixture
async def rig_factory(tracer_provider, span_exporter):
    """``await rig_factory(**make_rig kwargs)``; every rig made is closed after the test."""
    made = []

    async def make(**kw) -> Rig:
        rig = await make_rig(tracer_provider, span_exporter, **kw)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        await rig.close()


@pytest.fixture
async def make_stack(tracer_provider, span_exporter):
    """``await make_stack(n_prefill, n_decode, kv_config, **ProxyConfig)``: a :class:`support.sim_stack.Stack`;
    every stack made is closed after the test."""
    made = []

    async def make(n_prefill=1, n_decode=1, kv_config=None, **cfg):
        clock = Clock()
        cluster = SimCluster(
            n_prefill, n_decode, cost=False, tracer_provider=tracer_provider, clock=clock, kv_config=kv_config
        )
        await cluster.__aenter__()
        config = ProxyConfig(
            prefill=[worker(u) for u in cluster.prefill_urls], decode=[worker(u) for u in cluster.decode_urls], **cfg
        )
        proxy = await start(config, tracer_provider, clock=clock, port=0)
        http = aiohttp.ClientSession()
        made.append((cluster, proxy, http))
        return Stack(cluster, proxy, http, clock, span_exporter)

    yield make
    for cluster, proxy, http in made:
        await http.close()
        await proxy.close()
        await cluster.__aexit__(None, None, None)
