"""One arm of ``kvtrace bench --arms --clock virtual``: the simulated cluster (1 P + 1 D, or the
:class:`~kvtrace.bench.fleet.Fleet` asked for), the proxy
and the bench client in this process, on the virtual-time loop (:mod:`kvtrace.sim.virtual`).

The same code as the served arm (``kvtrace sim`` + ``kvtrace proxy`` subprocesses): the same
SimCluster, the same proxy app, the same bench runner, the same providers writing to ``run_dir``;
only the loop's clock and its transports differ.  Model time is not compressed (time scale 1):
virtual time costs nothing to wait, so every TTL, lease and pause is its model value.  Every
component keeps its own provider (resource), and all of them export through one
:class:`~kvtrace.bench.armspans.ArmSpans` (the same rows as a provider each, far fewer files;
with OTLP export on, an exporter per component as served).
"""

from __future__ import annotations

import math
import time

from kvtrace.bench import api as bench
from kvtrace.bench import armspans
from kvtrace.bench.fleet import SINGLE, Fleet
from kvtrace.proxy import server
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.sim.cluster import SimCluster

HOST = "127.0.0.1"
DIRECT_CLIENT = True  # the bench's chat calls through kvtrace.agent.direct (the SDK's requests and spans)


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
    stream_interval: float | None = None,
) -> bench.BenchResult:
    """``stream_interval``: the workers' (:mod:`kvtrace.sim.streaming`); None: the answer's first
    token with text, then the rest at once, unless the workload's client stops reading early."""
    if stream_interval is None:
        stream_interval = 1 if may_interrupt(cfg) else math.inf
    kv = {"kv_connector_extra_config": {"bidirectional_kv_xfer": bidirectional}}
    spans = armspans.sink(run_dir)
    proxy_provider = spans.provider("kvtrace-proxy")
    try:
        async with SimCluster(
            fleet.prefillers,
            fleet.decoders,
            preset=preset,
            kv_config=kv,
            link=link,
            traces_dir=run_dir,
            tracer_provider_factory=spans.provider,
            host=HOST,
            metrics=False,
            cost_model=cost_model,
            no_prefix_caching=() if prefix_caching else ("prefill",),
            stream_interval=stream_interval,
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
                bench_provider = spans.provider("kvtrace-bench")  # where arun_bench would make its own
                try:
                    return await bench.arun_bench(
                        proxy.url, tracer_provider=bench_provider, label=label, direct_client=DIRECT_CLIENT, **cfg
                    )
                finally:
                    bench_provider.shutdown()
            finally:
                await proxy.close()
    finally:
        proxy_provider.shutdown()
        spans.close()


def may_interrupt(cfg: dict) -> bool:
    """Whether the workload's client may stop reading a stream early (``interrupt_after`` counts
    chunks, so its streams must come token by token)."""
    from kvtrace.bench import scenarios as scn
    from kvtrace.bench.workload import LLMAction

    workload, scenario, path = cfg.get("workload"), cfg.get("scenario"), cfg.get("input")
    if workload is not None:
        return any(isinstance(a, LLMAction) and a.interrupt_after is not None for a in _actions(workload))
    if isinstance(scenario, str):
        scenario = scn.SCENARIOS.get(scenario)
    if scenario is None and path is not None:
        scenario = _scenario_file(path)
    if scenario is None:
        return False  # a trace, vLLM's inputs, a published workload: no interruptions
    return any(isinstance(s, scn.LLM) and s.interrupt_after is not None for t in scenario.turns for s in t.steps)


def _actions(workload):
    return (a for plan in workload.sessions for turn in plan.turns for a in turn.actions)


def _scenario_file(path: str):
    """The scenario of a ``kvtrace_scenario`` input file, else None (bad files fail later, in the bench)."""
    import json

    from kvtrace.bench import scenarios as scn

    try:
        with open(path, encoding="utf-8") as f:
            conf = json.load(f)
        return scn.from_dict(conf) if isinstance(conf, dict) and conf.get("filetype") == scn.FILETYPE else None
    except (OSError, ValueError):
        return None
