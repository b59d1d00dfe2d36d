"""The proxy CPU that session identification by prefix matching adds per request (issue #13).

Starts a zero-cost simulator (``kvtrace sim --no-cost``, 1 P + 1 D) and two ``kvtrace proxy``
processes on it, identical but for ``--no-prefix-match`` on the second (``off``, the baseline;
Prometheus metrics off on both, Parquet traces on unless ``--no-traces``).  Clients hold multi-turn
chat conversations (a system prompt of ``--system-words`` words, then ``--turns`` turns of a
``--user-words`` user message and the streamed answer appended to the history, as an agent sends
them), in two variants:

- ``idless``: no conversation id anywhere (an ``openai``-client agent): ``on`` finds each turn's
  session by its prefix, ``off`` cannot (no session: what the proxy did before #13);
- ``conversation_id``: the body names the session: both proxies have it, ``on`` also hashes the
  messages, checks continuity and rebuilds the reply from D's stream.

Each variant runs on both proxies ``--rounds`` times, interleaved (on, off, on, off, ...), so drift in
the machine's load hits both alike.  Per proxy: CPU seconds of its process per request (user +
system from /proc/PID/stat, 10 ms ticks; includes the span export thread), p50/p99 latency; the
table prints the medians over rounds and the ratio on/off measured in this one run.  Last, the
in-process cost of the prefix work alone (hash chain, find, check, record, reply rebuilt from the
SSE bytes) per request at each history length: a noise-robust complement.

    python benchmarks/proxy/bench_prefix.py [--requests 300] [--concurrency 1 8] [--rounds 3]
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
from bench_proxy import HOST, cpu_s, free_port, pct, spawn, stop, wait_ready

VARIANTS = ("idless", "conversation_id")
REQUEST_TIMEOUT_S = 30.0  # a zero-cost request takes milliseconds: one that takes this long is stuck
errors: list[str] = []  # requests that failed or got stuck (listed at the end: they must be none)


def system_prompt(words: int) -> str:
    return " ".join(f"rule{i % 97}" for i in range(words))


async def answer(http, url: str, messages: list, max_tokens: int, extra: dict) -> str:
    """One streamed chat turn; the answer's content as a client reassembles it."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "stream": True, **extra}
    parts = []
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {await r.text()}")
        async for line in r.content:
            if line.startswith(b"data: {"):
                for choice in json.loads(line[6:]).get("choices") or ():
                    parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


async def load(http, url: str, args, variant: str, tag: str) -> tuple[list[float], int]:
    """``args.requests`` turns over ``args.concurrency`` workers, each holding conversations of
    ``args.turns`` turns; latencies (ms) and the number of requests."""
    system = {"role": "system", "content": system_prompt(args.system_words)}
    lat: list[float] = []
    left = iter(range(args.requests))

    async def worker(w: int) -> None:
        conv = 0
        messages: list = []
        for i in left:
            if not messages or len(messages) >= 1 + 2 * args.turns:
                conv += 1
                messages = [system]
            key = f"{tag}-{w}-{conv}"
            messages.append({"role": "user", "content": f"{key} step {i} " + "detail " * args.user_words})
            extra = {"conversation_id": key} if variant == "conversation_id" else {}
            t0 = time.perf_counter()
            try:
                text = await answer(http, url, messages, args.max_tokens, extra)
            except (TimeoutError, aiohttp.ClientError, RuntimeError) as exc:
                errors.append(f"{key} turn {len(messages) // 2}: {type(exc).__name__} {exc}")
                messages = []  # start a new conversation
                continue
            lat.append((time.perf_counter() - t0) * 1000)
            messages.append({"role": "assistant", "content": text})

    await asyncio.gather(*(worker(w) for w in range(args.concurrency)))
    return lat, args.requests


async def measure(args, urls: dict, pids: dict) -> dict:
    """``out[(variant, conc, proxy)]`` = list of (cpu µs/request, p50 ms, p99 ms), one per round."""
    out: dict = {}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
        for conc in args.concurrency:
            for variant in VARIANTS:
                for rnd in range(args.rounds):
                    for name in ("on", "off"):
                        run_args = argparse.Namespace(**{**vars(args), "concurrency": conc})
                        tag = f"{variant}-{conc}-{rnd}-{name}"
                        await load(
                            http,
                            urls[name],
                            argparse.Namespace(**{**vars(run_args), "requests": conc * 4}),
                            variant,
                            tag + "w",
                        )  # warm-up: connections
                        c0 = cpu_s(pids[name])[1]  # the proxy and its writer process
                        lat, n = await load(http, urls[name], run_args, variant, tag)
                        c1 = cpu_s(pids[name])[1]
                        out.setdefault((variant, conc, name), []).append(
                            ((c1 - c0) / n * 1e6, pct(lat, 50), pct(lat, 99))
                        )
    return out


def report(out: dict, concurrency: list[int]) -> None:
    print(
        f"{'variant':<16} {'conc':>4} {'cpu us/req on':>13} {'off':>6} {'on/off':>6} {'p50 on':>7} {'off':>7} "
        f"{'p99 on':>7} {'off':>7}  cpu on/off per round"
    )
    for conc in concurrency:
        for variant in VARIANTS:
            on, off = out[(variant, conc, "on")], out[(variant, conc, "off")]
            med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
            rounds = " ".join(f"{a[0] / b[0]:.2f}" for a, b in zip(on, off, strict=True))
            print(
                f"{variant:<16} {conc:>4} {med(on, 0):13.0f} {med(off, 0):6.0f} {med(on, 0) / med(off, 0):6.2f} "
                f"{med(on, 1):7.2f} {med(off, 1):7.2f} {med(on, 2):7.2f} {med(off, 2):7.2f}  {rounds}"
            )


def unit_cost(args, n: int = 2000) -> None:
    """In process: µs per request of the prefix work alone, by history length (messages)."""
    from kvtrace.proxy import prefix_table

    system = {"role": "system", "content": system_prompt(args.system_words)}
    reply_sse = b"".join(
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok%d "}}]}\n\n'
        % i
        for i in range(args.max_tokens)
    )
    print("# in process: prefix work per request (chain + find + check + served, reply rebuilt from the SSE)")
    print(f"{'messages':>8} {'us/request':>10}")
    for turns in (1, args.turns // 2 or 1, args.turns):
        table = prefix_table.PrefixTable()
        history = [system]
        for t in range(turns):
            history += [
                {"role": "user", "content": f"step {t} " + "detail " * args.user_words},
                {"role": "assistant", "content": "tok " * args.max_tokens},
            ]
        history.append({"role": "user", "content": "next " + "detail " * args.user_words})
        t0 = time.perf_counter()
        for _ in range(n):
            hashes = prefix_table.chain(history)
            key = table.find(hashes) or prefix_table.new_session_id()
            table.check(key, hashes)
            reply = prefix_table.Reply()
            reply.feed(reply_sse)
            table.served(key, hashes, reply.message())
        print(f"{len(history):>8} {(time.perf_counter() - t0) / n * 1e6:10.1f}")


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="measured requests per variant, proxy, round")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved on/off rounds per variant")
    ap.add_argument("--turns", type=int, default=8, help="turns per conversation")
    ap.add_argument("--system-words", type=int, default=1500, help="system prompt length (words)")
    ap.add_argument("--user-words", type=int, default=60, help="user message length (words)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-traces", action="store_true", help="proxies without Parquet export")
    args = ap.parse_args()

    p_port, d_port, on_port, off_port = (free_port() for _ in range(4))
    logs = tempfile.mkdtemp(prefix="kvtrace-bench-prefix-")
    procs: list[subprocess.Popen] = []
    try:
        procs.append(
            spawn(
                [
                    sys.executable,
                    "-m",
                    "kvtrace.cli",
                    "sim",
                    "--no-cost",
                    "--prefill-port",
                    str(p_port),
                    "--decode-port",
                    str(d_port),
                ]
                + ([] if args.no_traces else ["--traces", os.path.join(logs, "sim")]),
                logs,
                "sim",
                metrics=False,
            )
        )
        urls = {}
        for name, port in (("on", on_port), ("off", off_port)):
            cmd = [
                sys.executable,
                "-m",
                "kvtrace.cli",
                "proxy",
                "--port",
                str(port),
                "--prefiller-port",
                str(p_port),
                "--decoder-port",
                str(d_port),
            ] + ([] if args.no_traces else ["--traces", os.path.join(logs, name)])
            procs.append(
                spawn(
                    cmd + ([] if name == "on" else ["--no-prefix-match"]),
                    logs,
                    f"proxy-{name}",
                    {"KVTRACE_METRICS": "0"},
                )
            )
            urls[name] = f"http://{HOST}:{port}"
        for url, proc in (
            (f"http://{HOST}:{p_port}", procs[0]),
            (f"http://{HOST}:{d_port}", procs[0]),
            (urls["on"], procs[1]),
            (urls["off"], procs[2]),
        ):
            await wait_ready(url, proc)
        out = await measure(args, urls, {"on": procs[1].pid, "off": procs[2].pid})
        print(
            f"# zero-cost simulator 1P+1D; streaming chat, {args.turns}-turn conversations, system prompt "
            f"{args.system_words} words, user {args.user_words}, max_tokens {args.max_tokens}; {args.requests} "
            f"requests x {args.rounds} rounds per cell; traces={'off' if args.no_traces else 'parquet'}; "
            f"cpus={os.cpu_count()}"
        )
        print("# proxy CPU per request with prefix matching on vs off (--no-prefix-match), medians over rounds")
        report(out, args.concurrency)
        print(f"# failed or stuck requests (> {REQUEST_TIMEOUT_S:g} s): {len(errors)}; traces and logs in {logs}")
        for line in errors:
            print("  " + line)
    finally:
        stop(procs)
    unit_cost(args)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
