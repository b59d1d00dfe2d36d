"""Throughput of a zero-cost simulated worker vs a bare aiohttp handler, same machine, same run.

Target (issue 3): a worker with the cost model off serves >= 500 small requests/s on loopback,
so the simulator never bottlenecks tests or proxy benchmarks.  Each server runs in its own
process; the client (aiohttp, ``--concurrency`` connections) runs here.  Prints requests/s of
both and the ratio sim / baseline.

    python benchmarks/sim/bench_sim.py [--seconds 5] [--concurrency 32] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time

TARGET_RPS = 500


def _serve_baseline(port_q) -> None:
    from aiohttp import web

    async def main():
        async def hello(request):
            await request.read()
            return web.json_response({"ok": True})

        app = web.Application()
        app.add_routes([web.post("/v1/completions", hello)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_q.put(site._server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


def _serve_sim(port_q) -> None:
    async def main():
        from kvtrace.sim.cluster import SimCluster

        async with SimCluster(1, 0, cost=False) as c:
            port_q.put(c.prefill[0].port)
            await asyncio.Event().wait()

    asyncio.run(main())


async def _load(url: str, seconds: float, concurrency: int, stream: bool) -> tuple[int, int]:
    import aiohttp

    body = {"model": "m", "prompt": "a small prompt of a few words", "max_tokens": 4, "stream": stream}
    done = errors = 0
    deadline = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def client():
            nonlocal done, errors
            while time.perf_counter() < deadline:
                async with session.post(url, json=body) as resp:
                    await resp.read()
                    if resp.status == 200:
                        done += 1
                    else:
                        errors += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return done, errors


def _measure(target, seconds: float, concurrency: int, stream: bool) -> float:
    q = mp.Queue()
    proc = mp.Process(target=target, args=(q,), daemon=True)
    proc.start()
    try:
        port = q.get(timeout=30)
        url = f"http://127.0.0.1:{port}/v1/completions"
        asyncio.run(_load(url, 0.5, concurrency, stream))  # warm-up
        t0 = time.perf_counter()
        done, errors = asyncio.run(_load(url, seconds, concurrency, stream))
        elapsed = time.perf_counter() - t0
        if errors:
            print(f"  {errors} non-200 responses", file=sys.stderr)
        return done / elapsed
    finally:
        proc.terminate()
        proc.join(5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--stream", action="store_true", help="SSE responses from the sim")
    args = ap.parse_args(argv)
    base = _measure(_serve_baseline, args.seconds, args.concurrency, False)
    sim = _measure(_serve_sim, args.seconds, args.concurrency, args.stream)
    print(f"baseline aiohttp hello: {base:8.0f} req/s")
    print(f"zero-cost sim worker:   {sim:8.0f} req/s ({'stream' if args.stream else 'json'}, max_tokens=4)")
    print(f"ratio sim/baseline:     {sim / base:8.2f}")
    ok = sim >= TARGET_RPS
    print(f"target >= {TARGET_RPS} req/s: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
