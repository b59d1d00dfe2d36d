"""The virtual-time loop (kvtrace.sim.virtual): the served simulator, the proxy and the bench in one
process, no sockets, no sleeps; one seed, the same results."""

from __future__ import annotations

import gc
import time

import pytest

from kvtrace.sim import virtual

pytest.importorskip("aiohttp")
pytest.importorskip("openai")


async def _bench(traces_dir: str):
    from kvtrace.bench import inproc

    cfg = dict(scenario="pause-resume", sessions=2, seed=1, nonce="v")
    return await inproc.run_arm(traces_dir, "qwen3-32b", False, True, "efa-3200", cfg, "A", 450.0)


def _rows(result) -> list[tuple]:
    return [(r.session, r.turn, r.ttft_ms, r.latency_ms, r.outcome, r.pulled_tokens) for r in result.requests]


def test_a_pause_past_the_ttl_runs_in_seconds_and_one_seed_gives_the_same_requests(tmp_path):
    t0 = time.monotonic()
    first = virtual.run(_bench(str(tmp_path / "a")), seed=1)
    wall = time.monotonic() - t0
    second = virtual.run(_bench(str(tmp_path / "b")), seed=1)
    assert first.duration_s > 600  # simulated: pause-resume pauses 600 s, past D's 480 s TTL
    assert wall < 60
    assert _rows(first) == _rows(second)
    assert first.format() == second.format()
    outcomes = sorted(r.outcome for r in first.requests)
    assert outcomes == ["no_remote"] * 4 + ["pulled"] * 4


def test_clocks_are_restored_after_a_run():
    before = time.time()
    virtual.run(_noop(), seed=0)
    assert abs(time.time() - before) < 60  # the real clock again, not the virtual epoch


async def _thresholds():
    return gc.get_threshold()


async def _fails():
    raise KeyError("the run's own error")


def test_the_collector_runs_less_often_during_a_run_and_as_before_after_it():
    before = gc.get_threshold()
    assert virtual.run(_thresholds()) == virtual.GC_THRESHOLDS != before
    assert gc.get_threshold() == before
    with pytest.raises(KeyError, match="the run's own error"):
        virtual.run(_fails())
    assert gc.get_threshold() == before


async def _noop():
    import asyncio

    await asyncio.sleep(3600)  # an hour of virtual time
    return time.time()


def test_fast_events_run_in_time_order_with_the_timers_each_at_its_own_time():
    import asyncio

    async def main():
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, float]] = []
        woken = loop.create_future()

        def fast(tag):
            seen.append((tag, loop.time()))
            if tag == "wake":
                woken.set_result(loop.time())

        async def timer(tag, delay):
            await asyncio.sleep(delay)
            seen.append((tag, loop.time()))

        for when, tag in ((3.0, "f3"), (1.0, "f1"), (2.5, "wake"), (1.0, "f1b")):
            loop.call_fast(when, fast, tag)
        timers = [asyncio.create_task(timer("t2", 2.0)), asyncio.create_task(timer("t4", 4.0))]
        at = await woken  # the waiter runs at the fast event's time, before anything later
        seen.append(("woken", loop.time()))
        await asyncio.gather(*timers)
        return at, seen

    at, seen = virtual.run(main(), seed=0)
    assert at == 2.5
    assert seen == [("f1", 1.0), ("f1b", 1.0), ("t2", 2.0), ("wake", 2.5), ("woken", 2.5), ("f3", 3.0), ("t4", 4.0)]


async def _requests_with_pauses():
    import asyncio

    import aiohttp
    from aiohttp import web

    peers = []

    async def hello(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(text="hi")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, keepalive_timeout=75.0)  # the server would keep it longer
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    try:
        async with aiohttp.ClientSession() as http:  # keeps an idle connection 15 s
            for pause in (1.0, 20.0, 0.0):
                async with http.get(url) as resp:
                    assert await resp.text() == "hi"
                await asyncio.sleep(pause)
    finally:
        await runner.cleanup()
    return peers


def test_client_pools_expire_idle_connections_on_the_virtual_clock():
    """aiohttp's pool bound ``time.monotonic`` at import: on the real clock a connection idle for
    virtual minutes looked fresh, and was reused even as a server on the loop's clock closed it (the
    proxy's 60 s idle timeout: a connection error)."""
    first, second, third = virtual.run(_requests_with_pauses(), seed=0)
    assert first == second != third  # reused after 1 s, not after 20 s (the pool keeps one 15 s)


async def _worker_resources() -> list[dict]:
    from opentelemetry.sdk.trace import TracerProvider

    from kvtrace.sim.cluster import SimCluster
    from kvtrace.telemetry import make_resource

    made: list[dict] = []

    def factory(service, attrs):
        made.append(dict(make_resource(service, attrs).attributes))
        return TracerProvider(resource=make_resource(service, attrs))

    async with SimCluster(1, 1, cost=False, tracer_provider_factory=factory):
        pass
    return made


def test_workers_on_the_virtual_loop_say_their_timestamps_are_simulated():
    """``kvtrace.sim.clock``: what the report and the dashboard read to say a run's times are
    simulated (tests/sim/test_cluster.py has ``wall`` for a cluster on asyncio's loop)."""
    from kvtrace import semconv as sc

    made = virtual.run(_worker_resources(), seed=0)
    assert [(r[sc.ENGINE_ROLE], r[sc.SIM_CLOCK]) for r in made] == [
        (sc.ROLE_PREFILL, sc.CLOCK_VIRTUAL),
        (sc.ROLE_DECODE, sc.CLOCK_VIRTUAL),
    ]
