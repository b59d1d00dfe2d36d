"""Issue #15 (proxy side): what each hostile or broken input costs a ``kvtrace proxy`` process.

Each case starts fake P and D workers (:class:`kvtrace.testing.proxy.FakeWorker`, in this process)
and a fresh ``kvtrace proxy`` subprocess between them, drives the case and prints one row: what the
client saw, the proxy's RSS growth (VmRSS after minus before) and peak (VmHWM), and how long the
proxy held the request or connection.  Cases:

- ``long-ids``: 1000 streaming requests with 512 KB conversation ids (8 at a time);
- ``health-100k``: ``/health`` on a table of 100 k conversations (in this process: the handler's
  time per call, median of 50);
- ``big-prefill``: P answers a 200 MB body; ``big-decode``: D streams 200 MB of data lines to a
  non-streaming client (the proxy aggregates);
- ``trickle``: D sends one token, then one byte a second, forever;
- ``slow-clients``: 300 connections send half a request head and wait; ``half-body``: one client
  sends 10 of 1000 announced body bytes;
- ``garbage``: D sends ``{"finish_reason":"stop","choices":5}`` mid-stream (curl-like client);
- ``surrogate``: a body with ``"\\ud800"`` among 300 concurrent good requests.

The before column comes from running this file with ``PYTHONPATH=<older checkout>`` (flags the
older proxy lacks are left out; ``kvtrace/testing/proxy.py`` of this checkout must be on the path):

    python benchmarks/proxy/bench_hardening.py [--cases long-ids trickle ...] [--hold-s 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp

from kvtrace.testing.proxy import FakeWorker, http_head, raw_request
from kvtrace.testing.wait import free_port, wait_for_async

HOST = "127.0.0.1"
CHAT = "/v1/chat/completions"
# the limits this run gives the new proxy (short, so the cases end quickly); an older proxy ignores them
LIMITS = {"--request-timeout": "5", "--client-header-timeout": "3", "--client-body-timeout": "3"}


def body(**kw) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True, **kw}


def mem(pid: int) -> dict:
    """VmRSS and VmHWM of ``pid`` in MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


class Proxy:
    """A ``kvtrace proxy`` subprocess in front of ``p`` and ``d``."""

    def __init__(self, p: FakeWorker, d: FakeWorker, logdir: str) -> None:
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "proxy",
            "--port",
            str(self.port),
            "--prefiller-port",
            str(p.port),
            "--decoder-port",
            str(d.port),
            "--prefiller-host",
            HOST,
            "--decoder-host",
            HOST,
        ]
        helptext = subprocess.run(cmd[:4] + ["--help"], capture_output=True, text=True).stdout
        self.hardened = "--request-timeout" in helptext
        if self.hardened:
            cmd += [x for kv in LIMITS.items() for x in kv]
        self.log = open(os.path.join(logdir, f"proxy-{self.port}.log"), "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    async def ready(self) -> None:
        async with aiohttp.ClientSession() as http:

            async def up() -> bool:
                try:
                    async with http.get(self.url + "/health") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            try:
                await wait_for_async(up, 60, f"{self.url}/health", interval=0.1)
            except TimeoutError as exc:
                raise SystemExit(f"proxy not ready: {exc}") from None

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


async def with_proxy(case, logdir: str, p_kwargs=None, d_kwargs=None, **kw) -> dict:
    p = await FakeWorker("p0", **(p_kwargs or {})).start()
    d = await FakeWorker("d0", **(d_kwargs or {})).start()
    proxy = Proxy(p, d, logdir)
    try:
        await proxy.ready()
        before = mem(proxy.proc.pid)
        row = await case(proxy, p, d, **kw)
        after = mem(proxy.proc.pid)
        row["rss_growth_mib"] = round(after["VmRSS"] - before["VmRSS"], 1)
        row["rss_peak_mib"] = round(after["VmHWM"], 1)
        return row
    finally:
        proxy.close()
        await p.close()
        await d.close()


async def long_ids(proxy, p, d) -> dict:
    statuses: dict = {}
    ids = iter(range(1000))
    async with aiohttp.ClientSession() as http:

        async def worker():
            for i in ids:
                conv = f"{i:05d}" + "y" * (512 * 1024)
                async with http.post(proxy.url + CHAT, json=body(conversation_id=conv)) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1

        await asyncio.gather(*(worker() for _ in range(8)))
        async with http.get(proxy.url + "/health") as r:
            health = await r.json()
    return {"client": f"statuses {statuses}", "held": f"table {health.get('cached_conversations')} entries"}


async def big_response(proxy, p, d, stream: bool) -> dict:
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + CHAT, json=body(stream=stream)) as r:
            data = await r.read()
            status = r.status
    return {"client": f"HTTP {status}, {len(data) / 2**20:.1f} MiB", "held": f"{time.monotonic() - t0:.1f} s"}


async def trickle(proxy, p, d, hold_s: float) -> dict:
    t0 = time.monotonic()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(proxy.url + CHAT, json=body()) as r:
                data = await asyncio.wait_for(r.read(), hold_s)
        last = [ln for ln in data.decode().splitlines() if ln.startswith("data: ")][-2:]
        return {"client": f"HTTP {r.status}, ends {last}", "held": f"{time.monotonic() - t0:.1f} s"}
    except TimeoutError:
        return {"client": "no end of stream", "held": f"> {hold_s:g} s (still open)"}


async def slow_clients(proxy, p, d, hold_s: float, n: int = 300) -> dict:
    conns = []
    for _ in range(n):
        reader, writer = await asyncio.open_connection(HOST, proxy.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        conns.append((reader, writer))
    t0 = time.monotonic()

    async def closed(reader) -> float | None:
        try:
            await asyncio.wait_for(reader.read(), hold_s)
            return time.monotonic() - t0
        except TimeoutError:
            return None

    times = await asyncio.gather(*(closed(r) for r, _ in conns))
    for _, w in conns:
        w.close()
    done = [t for t in times if t is not None]
    held = f"closed {len(done)}/{n}" + (f" after {max(done):.1f} s" if done else f" within {hold_s:g} s")
    return {"client": "half-sent request heads", "held": held}


async def half_body(proxy, p, d, hold_s: float) -> dict:
    raw = json.dumps(body()).encode()
    reader, writer = await asyncio.open_connection(HOST, proxy.port)
    writer.write(http_head(CHAT, raw, connection="keep-alive") + raw[:10])
    t0 = time.monotonic()
    try:
        data = await asyncio.wait_for(reader.read(), hold_s)
        return {"client": data.split(b"\r\n", 1)[0].decode() or "closed", "held": f"{time.monotonic() - t0:.1f} s"}
    except TimeoutError:
        return {"client": "no answer", "held": f"> {hold_s:g} s (still open)"}
    finally:
        writer.close()


async def garbage(proxy, p, d, hold_s: float) -> dict:
    raw = json.dumps(body()).encode()
    t0 = time.monotonic()
    try:
        got = await raw_request(proxy.url, http_head(CHAT, raw), raw, timeout=hold_s)
    except (TimeoutError, asyncio.IncompleteReadError) as exc:
        return {"client": f"broken response ({type(exc).__name__})", "held": f"{time.monotonic() - t0:.1f} s"}
    ok = got.complete and len(got.status_lines) == 1 and got.body.endswith(b"data: [DONE]\n\n")
    return {
        "client": f"status lines {got.status_lines}, chunked body complete={got.complete}, ends with [DONE]={ok}",
        "held": f"{time.monotonic() - t0:.1f} s",
    }


async def surrogate(proxy, p, d) -> dict:
    async with aiohttp.ClientSession() as http:

        async def post(data: bytes) -> int:
            async with http.post(proxy.url + CHAT, data=data) as r:
                await r.read()
                return r.status

        good = json.dumps(body()).encode()
        bad = json.dumps(body(conversation_id="x\ud800")).encode()
        statuses = await asyncio.gather(post(bad), *(post(good) for _ in range(300)))
    return {"client": f"bad: HTTP {statuses[0]}; good: {statuses[1:].count(200)}/300 HTTP 200", "held": "-"}


async def health_100k(logdir: str) -> dict:
    from kvtrace.proxy.app import Proxy as App
    from kvtrace.proxy.config import ProxyConfig, Worker

    app = App(ProxyConfig(prefill=[Worker(HOST, 1)], decode=[Worker(HOST, 2)], max_conversations=200_000))
    for i in range(100_000):
        key = f"conversation-{i}"
        app.table.begin(key)
        app.table.store(key, 0, {"remote_block_ids": [list(range(i % 64))], "remote_engine_id": "d"}, "http://d")
    times = []
    for _ in range(50):
        t0 = time.perf_counter()
        await app.health(None)
        times.append((time.perf_counter() - t0) * 1000)
    return {
        "client": "GET /health",
        "held": f"{statistics.median(times):.3f} ms of blocked loop per call",
        "rss_growth_mib": "-",
        "rss_peak_mib": "-",
    }


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cases = [
        "long-ids",
        "health-100k",
        "big-prefill",
        "big-decode",
        "trickle",
        "slow-clients",
        "half-body",
        "garbage",
        "surrogate",
    ]
    ap.add_argument("--cases", nargs="+", default=cases, choices=cases)
    ap.add_argument("--hold-s", type=float, default=15.0, help="give up waiting after this many s")
    args = ap.parse_args()
    logdir = tempfile.mkdtemp(prefix="kvtrace-bench-hardening-")
    line = (
        b"data: "
        + json.dumps({"choices": [{"index": 0, "delta": {"content": "z" * 65_000}, "finish_reason": None}]}).encode()
        + b"\n\n"
    )
    first = b'data: {"choices":[{"index":0,"delta":{"content":"t0"},"finish_reason":null}]}\n\n'
    runs = {
        "long-ids": lambda: with_proxy(long_ids, logdir),
        "health-100k": lambda: health_100k(logdir),
        "big-prefill": lambda: with_proxy(big_response, logdir, p_kwargs={"pad_bytes": 200 << 20}, stream=True),
        "big-decode": lambda: with_proxy(big_response, logdir, d_kwargs={"script": [line] * 3200}, stream=False),
        "trickle": lambda: with_proxy(trickle, logdir, d_kwargs={"trickle_s": 1.0}, hold_s=args.hold_s),
        "slow-clients": lambda: with_proxy(slow_clients, logdir, hold_s=args.hold_s),
        "half-body": lambda: with_proxy(half_body, logdir, hold_s=args.hold_s),
        "garbage": lambda: with_proxy(
            garbage,
            logdir,
            hold_s=args.hold_s,
            d_kwargs={"script": [first, b'data: {"finish_reason":"stop","choices":5}\n\n']},
        ),
        "surrogate": lambda: with_proxy(surrogate, logdir),
    }
    print(
        f"# kvtrace proxy from {os.path.dirname(os.path.dirname(__import__('kvtrace').__file__))}; "
        f"limits given when supported: {LIMITS}; logs in {logdir}"
    )
    print(f"{'case':<13} {'rss +MiB':>9} {'peak MiB':>9}  held / cost | client saw")
    for name in args.cases:
        row = await runs[name]()
        print(
            f"{name:<13} {row['rss_growth_mib']:>9} {row['rss_peak_mib']:>9}  {row['held']} | {row['client']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
