"""The what-if replay predicts a virtual-clock run: record the simulated cluster (through the proxy)
on the virtual-time loop at one setting, replay those traces at other settings, run it again on the
virtual clock at each, compare.  On the virtual clock nothing stalls a run, so no run is retried or
excused: every decision and the GiB·s held equal the replay's, and mean TTFT is within the replay's own
model error (15 %) (the served simulator's proof, test_replay_predicts_simulator.py, has to detect busy runs)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis.common import rows
from kvtrace.analysis.whatif.replay import load, replay
from kvtrace.sim import virtual
from kvtrace.store import connect

pytest.importorskip("aiohttp")
pytest.importorskip("openai")

SEED = 11
OFFER_MARGIN_S = 10.0  # below D's TTL less vLLM's 5 s read margin
RECORDED = (480.0, 64)
# pause-resume pauses 600 s before its resumed turn: past 480, within 900; threshold 256 is above
# the short follow-ups' new tokens
SETTINGS = [(900.0, 64), (480.0, 256)]
SCENARIOS = (("pause-resume", 3), ("short-followups", 2))


async def _run(directory: str, ttl: float, threshold: int) -> None:
    import kvtrace
    from kvtrace.bench import api as bench
    from kvtrace.proxy import server
    from kvtrace.proxy.config import ProxyConfig, Worker
    from kvtrace.sim.cluster import SimCluster

    extra = {"decoder_kv_blocks_ttl": ttl, "kv_recompute_threshold": threshold, "kv_lease_duration": 1200.0}
    proxy_provider = kvtrace.configure("kvtrace-proxy", traces_dir=directory, handle_sigterm=False)
    try:
        async with SimCluster(
            1, 1, kv_config={"kv_connector_extra_config": extra}, traces_dir=directory, metrics=False
        ) as cluster:
            cfg = ProxyConfig(
                prefill=[Worker("127.0.0.1", w.port) for w in cluster.prefill],
                decode=[Worker("127.0.0.1", w.port) for w in cluster.decode],
                port=0,
                conversation_ttl_s=ttl - OFFER_MARGIN_S,
            )
            # the proxy's default clock is bound at import: hand it the (patched) monotonic clock
            proxy = await server.start(cfg, tracer_provider=proxy_provider, clock=time.monotonic)
            try:
                for i, (scenario, sessions) in enumerate(SCENARIOS):
                    await bench.arun_bench(
                        proxy.url, traces_dir=directory, label=f"s{i}", scenario=scenario, sessions=sessions,
                        clients=sessions, seed=SEED, nonce=f"w{i}",
                    )  # fmt: skip
            finally:
                await proxy.close()
    finally:
        proxy_provider.shutdown()


def _recorded_run(directory: str, ttl: float, threshold: int):
    virtual.run(_run(directory, ttl, threshold), seed=SEED)
    return connect(directory)


def _decisions(con) -> list[dict]:
    return rows(
        con,
        "SELECT session_id, turn, outcome FROM kv_decisions WHERE direction = ? ORDER BY start_ns, span_id",
        [sc.DIRECTION_D2P],
    )


def _measured(con) -> tuple[float, float]:
    held = rows(con, "SELECT sum(byte_seconds) AS bs FROM kv_retention")[0]["bs"] or 0.0
    ttft = rows(con, "SELECT avg(ttft_ms) AS t FROM requests")[0]["t"]
    return held / 2**30, ttft


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("recorded"))
    return _recorded_run(directory, *RECORDED)


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"ttl{s[0]:g}-threshold{s[1]}")
def test_the_replay_predicts_every_decision_of_a_virtual_run(recorded, tmp_path, setting):
    rec = load(recorded)
    assert (rec.ttl_s, rec.threshold) == RECORDED
    order = _decisions(recorded)
    r = replay(rec, *setting)
    predicted = {(d["session_id"], d["turn"]): sc.OUTCOMES[c] for d, c in zip(order, r.codes, strict=True)}
    run = _recorded_run(str(tmp_path / "run"), *setting)
    actual = {(d["session_id"], d["turn"]): d["outcome"] for d in _decisions(run)}
    assert predicted == actual
    assert Counter(actual.values()) != Counter(d["outcome"] for d in order)  # the setting changed decisions
    gib_s, ttft = _measured(run)
    assert r.row["gib_s_held"] == pytest.approx(gib_s, rel=1e-6)  # no stall to blur retention: exact
    assert r.row["ttft_mean_ms"] == pytest.approx(ttft, rel=0.15)
