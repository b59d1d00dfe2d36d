"""The what-if replay and session continuity: a turn whose messages diverged from what D
holds is never offered D's blocks, so no retention TTL or threshold can make it pull."""

from __future__ import annotations

import asyncio

import pytest

from kvtrace.analysis.whatif.replay import load, replay
from kvtrace.bench import scenarios
from kvtrace.store import connect

SCALE = 20.0


async def _record(directory: str, keep_reasoning: bool) -> None:
    import kvtrace
    from kvtrace.bench import api as bench
    from kvtrace.proxy import server
    from kvtrace.proxy.config import ProxyConfig, Worker
    from kvtrace.sim.cluster import SimCluster

    providers = [
        kvtrace.configure(name, traces_dir=directory, handle_sigterm=False)
        for name in ("kvtrace-proxy", "kvtrace-bench")
    ]
    try:
        async with SimCluster(1, 1, time_scale=SCALE, traces_dir=directory) as cluster:
            cfg = ProxyConfig(
                prefill=[Worker("127.0.0.1", w.port) for w in cluster.prefill],
                decode=[Worker("127.0.0.1", w.port) for w in cluster.decode],
                port=0,
            )
            proxy = await server.start(cfg, tracer_provider=providers[0])
            try:
                scenario = scenarios.get("reasoning-strip").with_(keep_reasoning=keep_reasoning)
                await bench.arun_bench(
                    proxy.url,
                    scenario=scenario,
                    sessions=2,
                    tracer_provider=providers[1],
                    time_scale=0.0,
                    clients=2,
                    nonce="c",
                )
            finally:
                await proxy.close()
    finally:
        for provider in providers:
            provider.shutdown()


@pytest.mark.parametrize("keep", [True, False])
def test_diverged_turns_never_pull_in_the_replay(tmp_path, keep):
    asyncio.run(_record(str(tmp_path), keep))
    rec = load(connect(tmp_path))
    recorded = replay(rec, rec.ttl_s, rec.threshold).row
    longer = replay(rec, rec.ttl_s * 4, 16).row  # a longer retention and a lower threshold
    assert recorded["decisions"] == 12 and recorded["recorded"]
    if keep:  # every later call extends what D holds: it pulls, recorded and replayed
        assert recorded["pulled"] == longer["pulled"] == 10
    else:  # every later call diverged: nothing to pull, whatever the setting
        assert recorded["pulled"] == longer["pulled"] == 0
        assert recorded["no_remote"] == longer["no_remote"] == 12
