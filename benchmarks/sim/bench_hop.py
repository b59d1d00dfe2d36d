"""What one HTTP exchange between two components of a virtual fleet costs (issue 41).

In ``bench_fleet.py`` the bench's client, the proxy and the simulated workers are aiohttp servers
and clients in one process, joined by :mod:`kvtrace.sim.memnet` on the virtual loop, and a request
makes three exchanges: client -> proxy, proxy -> P, proxy -> D.  This measures one exchange alone:
an aiohttp client POSTs a chat body of ``--body-kb`` KB to an aiohttp handler that reads it and
streams ``--chunks`` server-sent events back (what the fleet's streams carry:
:mod:`kvtrace.sim.streaming`), one exchange after another over a kept-alive connection.  It runs
twice in this process, on the virtual loop over memnet and, as the baseline, on asyncio's own loop
over loopback TCP, and prints the CPU (this process's, user + system) per exchange of each and
their ratio.  With ``--per-request-ms`` (a fleet run's CPU per request) it prints the share of it
that three such exchanges are: what taking HTTP out of a virtual fleet could save at most.

    python benchmarks/sim/bench_hop.py [--exchanges 3000] [--body-kb 8 64] [--chunks 3]
        [--per-request-ms 5.4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

HOPS_PER_REQUEST = 3  # client -> proxy, proxy -> P, proxy -> D
WARMUP = 50


def _body(kb: int) -> bytes:
    words = "word " * (kb * 1024 // 5)
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": words}], "stream": True}).encode()


async def _measure(exchanges: int, body: bytes, chunks: int) -> float:
    """CPU s per exchange, on the running loop (whatever network it has)."""
    from aiohttp import ClientSession, TCPConnector, web

    event = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(chunks):
            await resp.write(event)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    headers = {"Content-Type": "application/json"}
    try:
        async with ClientSession(connector=TCPConnector(limit=1)) as session:

            async def one() -> None:
                async with session.post(url, data=body, headers=headers) as r:
                    async for _ in r.content:
                        pass

            for _ in range(WARMUP):
                await one()
            start = time.process_time()
            for _ in range(exchanges):
                await one()
            return (time.process_time() - start) / exchanges
    finally:
        await runner.cleanup()


def main() -> None:
    from kvtrace.sim import virtual

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--exchanges", type=int, default=3000)
    p.add_argument("--body-kb", type=int, nargs="+", default=[8, 64])
    p.add_argument("--chunks", type=int, default=3)
    p.add_argument("--per-request-ms", type=float, default=None, help="a fleet run's CPU ms per request")
    args = p.parse_args()
    print(f"{args.exchanges} exchanges each, {args.chunks} events streamed back, CPU per exchange\n")
    print("| body KB | virtual loop, memnet µs | asyncio, loopback TCP µs | virtual / TCP | 3 hops, ms per request |")
    print("|---:|---:|---:|---:|---:|")
    for kb in args.body_kb:
        body = _body(kb)
        mem = virtual.run(_measure(args.exchanges, body, args.chunks))
        tcp = asyncio.run(_measure(args.exchanges, body, args.chunks))
        hops = HOPS_PER_REQUEST * mem * 1e3
        print(f"| {kb} | {mem * 1e6:.0f} | {tcp * 1e6:.0f} | {mem / tcp:.2f} | {hops:.3f} |")
        if args.per_request_ms:
            share = 100 * hops / args.per_request_ms
            print(f"  {kb} KB bodies: three exchanges are {share:.1f} % of {args.per_request_ms} ms")


if __name__ == "__main__":
    main()
