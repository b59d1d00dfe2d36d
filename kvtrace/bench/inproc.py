"""One arm of ``kvtrace bench --arms --clock virtual``: the simulated cluster (1 P + 1 D, or the
:class:`~kvtrace.bench.fleet.Fleet` asked for), the proxy
and the bench client in this process, on the virtual-time loop (:mod:`kvtrace.sim.virtual`).

The same code as the served arm (``kvtrace sim`` + ``kvtrace proxy`` subprocesses): the same
SimCluster, the same proxy app, the same bench runner, the same providers writing to ``run_dir``;
only the loop's clock and its transports differ.  Model time is not compressed (time scale 1):
virtual time costs nothing to wait, so every TTL, lease and pause is its model value.
"""

from __future__ import annotations

import time

import kvtrace
from kvtrace.bench import api as bench
from kvtrace.bench.fleet import SINGLE, Fleet
from kvtrace.proxy import server
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.sim.cluster import SimCluster

HOST = "127.0.0.1"


async def run_arm(
    run_dir: str,
    preset: str,
    prefix_caching: bool,
    bidirectional: bool,
    link: str,
    cfg: dict,
    label: str,
    conversation_ttl_s: float,
    cost_model=None,
    fleet: Fleet = SINGLE,
) -> bench.BenchResult:
    kv = {"kv_connector_extra_config": {"bidirectional_kv_xfer": bidirectional}}
    proxy_provider = kvtrace.configure("kvtrace-proxy", traces_dir=run_dir, handle_sigterm=False)
    try:
        async with SimCluster(
            fleet.prefillers,
            fleet.decoders,
            preset=preset,
            kv_config=kv,
            link=link,
            traces_dir=run_dir,
            host=HOST,
            metrics=False,
            cost_model=cost_model,
            no_prefix_caching=() if prefix_caching else ("prefill",),
        ) as cluster:
            config = ProxyConfig(
                prefill=[Worker(HOST, w.port) for w in cluster.prefill],
                decode=[Worker(HOST, w.port) for w in cluster.decode],
                port=0,
                conversation_ttl_s=conversation_ttl_s,
                routing=fleet.routing,
            )
            # the proxy's clock argument defaults to the real monotonic clock (bound at import)
            proxy = await server.start(config, tracer_provider=proxy_provider, clock=time.monotonic)
            try:
                return await bench.arun_bench(proxy.url, traces_dir=run_dir, label=label, **cfg)
            finally:
                await proxy.close()
    finally:
        proxy_provider.shutdown()
