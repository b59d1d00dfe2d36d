"""Latency, throughput, CPU and event-loop lag the kvtrace proxy adds over calling the workers directly.

Starts a zero-cost simulator (``kvtrace sim --no-cost``, 1 P + 1 D) and, as subprocesses, every
proxy compared, then drives streaming chat requests at concurrency 1 / 16 / 64 in these modes:

- ``direct_d``: the client calls D alone;
- ``direct_pd``: the client itself calls P (max_tokens=1) then streams D: the minimum P/D work, and
  the honest baseline of a proxy that must also call P;
- ``direct_reuse``: the same, and each client worker offers P the blocks D kept from its previous
  request (D's final ``kv_transfer_params``, as a stateful proxy does): the workers' work of the
  multi-turn proxy modes below (P decides and pulls, D releases), without a proxy — their
  like-for-like throughput baseline;
- ``forwarder``: ``forwarder.py``, a bare aiohttp P-then-D forwarder (no tracing, no state): the CPU
  baseline of any aiohttp proxy;
- ``kvtrace``: ``kvtrace proxy`` with traces exported to Parquet (by the writer process, the default)
  and Prometheus metrics on;
- ``kv_inproc``: the same with ``KVTRACE_WRITER_PROCESS=0`` (conversion and writes in the proxy's own
  export thread, as before issue #14);
- ``kv_notrace``: no Parquet export (spans are still made);
- ``kv_sdk``: traces on, spans made by the OpenTelemetry SDK's own tracer
  (``KVTRACE_PROXY_FASTSPANS=0``) instead of :mod:`kvtrace.telemetry.fastspans`;
- ``kv_nometric``: traces on, ``KVTRACE_METRICS=0`` (``--metrics both``, the default);
- ``kv_stateless``: traces on, requests without a ``conversation_id`` and ``--no-prefix-match``: the
  forwarder's work (P then D, no offer of D's blocks) plus tracing.  Every other proxy mode gets the
  same conversation id for all requests of a client worker, so the kvtrace proxies offer D's blocks
  of the previous turn to P each time (P decides, D releases: work on the workers and in the proxy
  that ``direct_pd`` and the forwarder do not do, and ``direct_reuse`` does); this mode is the
  like-for-like comparison with ``direct_pd`` and the forwarder;
- ``kv_<loop>``: with ``--loop-ab``, traces on under the other event loop than the default one;
- ``baseline``: ``--baseline-cmd`` (e.g. vLLM's upstream proxy), if given.

After a warm-up of every mode, each kvtrace proxy exports the spans it queued (``/lagprobe/flush``),
so its writer process starts and pays its imports before any measured round.  Modes alternate: each
concurrency level runs ``--rounds`` rounds, every mode once per round in a
rotated order, so all of them see the same machine load (the numbers pool the rounds).  Printed per
mode: p50/p99 latency (request sent -> [DONE]), req/s, the latency added over ``direct_pd`` and
``direct_d``, throughput as a ratio of each, and the proxy's CPU time per request (user + system
from /proc around each measured run, 10 ms ticks) without and with its child processes (the Parquet
writer).  The metrics-on proxies are scraped (``GET /metrics``) every second meanwhile, as Prometheus
would.  Then event-loop lag phases, one per ``--lag-concurrency`` (1 and 16): each kvtrace mode runs
``--lag-requests`` with a 1 ms lag probe in its loop (``lagprobe.py``, off during the CPU runs);
printed: lag p50/p99/max over all samples and over the samples that overlap a span export, and the
longest GIL-holding slice the writer-process exporter measured (its thread's CPU time).  Last, the
targets of issue #14, each with the numbers of this run and whether it holds.

    python benchmarks/proxy/bench_proxy.py [--requests 400] [--rounds 4] [--baseline-cmd 'python \
/tmp/upstream-proxy/disagg_proxy_multiturn.py --host {host} --port {port} \
--prefiller-port {prefill_port} --decoder-port {decode_port}']

(vLLM's upstream proxy is examples/online_serving/disaggregated_serving/disagg_proxy_multiturn.py in
the vLLM repository, not in the vllm wheel; it needs fastapi, uvicorn and httpx.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from proxy_report import STATELESS, Acc, cpu_s, report, report_lag, report_metrics, report_targets

from kvtrace.proxy.stream import Aggregator
from kvtrace.semconv import KV_PARAMS_KEY
from kvtrace.testing.wait import free_port, wait_for_async

HOST = "127.0.0.1"
HERE = Path(__file__).resolve().parent
MESSAGES = [{"role": "user", "content": "summarise the plot of a short story about a lighthouse keeper"}]
TRACED = ("kvtrace", "kv_inproc", "kv_sdk", "kv_nometric", "kv_stateless", "kv_asyncio", "kv_uvloop")


async def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    async with aiohttp.ClientSession() as http:

        async def up() -> bool:
            if proc.poll() is not None:
                raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
            try:
                async with http.get(url + "/health") as r:
                    return r.status < 500
            except aiohttp.ClientError:
                return False

        try:
            await wait_for_async(up, timeout, f"{url}/health", interval=0.1)
        except TimeoutError as exc:
            raise SystemExit(f"{url} not ready: {exc}") from None


def body(max_tokens: int, stream: bool = True, **extra) -> dict:
    return {"model": "m", "messages": MESSAGES, "max_tokens": max_tokens, "stream": stream, **extra}


async def one_direct_pd(http, p_url, d_url, max_tokens, i):
    p_body = body(1, stream=False, kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
    async with http.post(p_url + "/v1/chat/completions", json=p_body) as r:
        params = (await r.json()).get("kv_transfer_params")
    async with http.post(d_url + "/v1/chat/completions", json=body(max_tokens, kv_transfer_params=params)) as r:
        async for _ in r.content.iter_any():
            pass


async def one_direct_reuse(http, p_url, d_url, max_tokens, i, kept: dict):
    """``one_direct_pd`` offering P the blocks D kept from worker ``i``'s previous request."""
    offer = {"do_remote_decode": True, "do_remote_prefill": False}
    if i in kept:
        offer = {**kept.pop(i), **offer}
    async with http.post(p_url + "/v1/chat/completions", json=body(1, stream=False, kv_transfer_params=offer)) as r:
        params = (await r.json()).get("kv_transfer_params")
    stream = Aggregator(chat=True)  # the proxy's reader of D's stream: the finishing chunk's params
    async with http.post(d_url + "/v1/chat/completions", json=body(max_tokens, kv_transfer_params=params)) as r:
        async for chunk in r.content.iter_any():
            stream.feed(chunk)
    stream.flush()
    if stream.kv_params:
        stream.kv_params.pop(KV_PARAMS_KEY, None)  # D's report for tracing, not part of the offer
        kept[i] = {**stream.kv_params, "remote_host": HOST}


async def one_stream(http, url, max_tokens, i, conv):
    extra = {"conversation_id": f"bench-{i}"} if conv else {}
    async with http.post(url + "/v1/chat/completions", json=body(max_tokens, **extra)) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {await r.text()}")
        async for _ in r.content.iter_any():
            pass


async def load(call, concurrency: int, requests: int) -> tuple[list[float], float]:
    """Run ``requests`` calls with ``concurrency`` workers; latencies (ms) and elapsed seconds."""
    lat: list[float] = []
    counter = iter(range(requests))

    async def worker(w: int) -> None:
        for _ in counter:
            t0 = time.perf_counter()
            await call(w)
            lat.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return lat, time.perf_counter() - t0


async def bench(args, urls: dict, p_url: str, d_url: str, pids: dict) -> dict:
    """``results[(mode, conc)] = (p50 ms, p99 ms, req/s, CPU µs/request, with children)``."""
    results: dict = {}
    kept: dict = {}  # direct_reuse: per client worker, the params of the blocks D kept for it
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        calls = {
            "direct_d": lambda w: one_stream(http, d_url, args.max_tokens, w, conv=False),
            "direct_pd": lambda w: one_direct_pd(http, p_url, d_url, args.max_tokens, w),
            "direct_reuse": lambda w: one_direct_reuse(http, p_url, d_url, args.max_tokens, w, kept),
        }
        for name, url in urls.items():
            calls[name] = (lambda u, c: lambda w: one_stream(http, u, args.max_tokens, w, conv=c))(
                url, name != STATELESS
            )
        names = list(calls)
        for conc in args.concurrency:
            n = max(args.requests, conc * 8)
            per_round = -(-n // args.rounds)
            acc = {name: Acc() for name in names}
            for name in names:
                await load(calls[name], conc, max(conc * 2, 20))  # warm-up: connections, caches
            await flush(http, urls)
            for r in range(args.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    c0 = cpu_s(pids.get(name))
                    lat, elapsed = await load(calls[name], conc, per_round)
                    acc[name].add(lat, elapsed, c0, cpu_s(pids.get(name)))
            for name in names:
                results[(name, conc)] = acc[name].row()
    return results


async def flush(http, urls: dict) -> None:
    """Have every kvtrace proxy export what it queued: its writer process (started by the first
    export) then pays its start-up (imports) before the measured rounds, not in one of them."""
    for mode, url in urls.items():
        if mode.startswith("kv"):
            async with http.get(url + "/lagprobe/flush") as r:
                got = await r.json()
            if mode in TRACED and not got["flushed"]:
                raise SystemExit(f"{mode}: spans not exported after the warm-up: {got}")


async def lag_phase(args, urls: dict, conc: int) -> dict:
    """Per kvtrace mode: the lag probe's samples over ``--lag-requests`` at concurrency ``conc``,
    in ``--rounds`` alternating rounds."""
    modes = [m for m in urls if m.startswith("kv")]
    out = {m: {"lags": [], "export": [], "exports": 0, "slice": None, "export_cpu": None} for m in modes}
    per_round = -(-args.lag_requests // args.rounds)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        for r in range(args.rounds):
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                url = urls[mode]
                async with http.get(url + "/lagprobe/start") as resp:
                    await resp.read()

                def stream(w, url=url, mode=mode):  # url, mode bound: loop variables
                    return one_stream(http, url, args.max_tokens, w, conv=mode != STATELESS)

                await load(stream, conc, per_round)
                async with http.get(url + "/lagprobe/stop") as resp:
                    got = await resp.json()
                o = out[mode]
                o["lags"] += got["lags"]
                o["export"] += [lag for lag, flag in zip(got["lags"], got["flags"], strict=True) if flag]
                o["exports"] += got["exports"]
                if got["max_slice_cpu_ms"] is not None:
                    o["slice"] = max(o["slice"] or 0.0, got["max_slice_cpu_ms"])
                if got["max_export_cpu_ms"] is not None:
                    o["export_cpu"] = max(o["export_cpu"] or 0.0, got["max_export_cpu_ms"])
    return out


async def scrape(url: str, interval: float = 1.0) -> None:
    """GET /metrics every ``interval`` s, as a Prometheus server would, until cancelled."""
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(url + "/metrics", headers={"Accept": "application/openmetrics-text"}) as r:
                await r.read()
            await asyncio.sleep(interval)  # the scrape interval being simulated


def spawn(cmd: list[str], log_dir: str, name: str, env: dict | None = None) -> subprocess.Popen:
    """Start ``cmd`` with its output in ``log_dir/name.log`` (a pipe nobody reads would block it)."""
    log = open(os.path.join(log_dir, f"{name}.log"), "wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def kvtrace_modes(args, traces: str) -> dict[str, tuple[list[str], dict]]:
    """mode -> (extra ``kvtrace proxy`` arguments, environment) of every kvtrace proxy compared."""
    t = ["--traces", traces]
    modes = {
        "kvtrace": (t, {}),
        "kv_inproc": (t, {"KVTRACE_WRITER_PROCESS": "0"}),
        "kv_notrace": ([], {}),
        "kv_sdk": (t, {"KVTRACE_PROXY_FASTSPANS": "0"}),
    }
    if args.metrics == "both":
        modes["kv_nometric"] = (t, {"KVTRACE_METRICS": "0"})
    modes[STATELESS] = (t + ["--no-prefix-match"], {})
    if args.loop_ab:
        from kvtrace.proxy.runtime import loop_factory

        other = "asyncio" if loop_factory(args.loop) is not None else "uvloop"
        modes[f"kv_{other}"] = (t + ["--loop", other], {})
    for extra, env in modes.values():
        if args.loop:
            extra += ["--loop", args.loop] if "--loop" not in extra else []
        env.setdefault("KVTRACE_METRICS", "0" if args.metrics == "off" else "1")
    return modes


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400, help="measured requests per mode and concurrency")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds per concurrency level")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--baseline-cmd", help="another proxy; {port} {host} {prefill_port} {decode_port} are filled in")
    ap.add_argument(
        "--metrics",
        choices=("both", "on", "off"),
        default="both",
        help="kvtrace proxies with Prometheus metrics on, off, or both side by side (default)",
    )
    ap.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), help="event loop of the kvtrace proxies")
    ap.add_argument("--loop-ab", action="store_true", help="also run kvtrace under the other event loop")
    ap.add_argument("--lag-requests", type=int, default=3000, help="requests per mode in the lag phase (0: none)")
    ap.add_argument(
        "--lag-concurrency",
        type=int,
        nargs="+",
        default=[1, 16],
        help="concurrency of the lag phase, one phase each (default 1 and 16: at 16 the 2-core "
        "machine's scheduling shows in every proxy's lag, exporting or not)",
    )
    args = ap.parse_args()

    p_port, d_port, f_port, b_port = (free_port() for _ in range(4))
    procs: dict[str, subprocess.Popen] = {}
    tmp = tempfile.mkdtemp(prefix="kvtrace-bench-proxy-")  # traces and process logs
    try:
        procs["sim"] = spawn(
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
            ],
            tmp,
            "sim",
        )
        p_url, d_url = f"http://{HOST}:{p_port}", f"http://{HOST}:{d_port}"
        urls = {}
        procs["forwarder"] = spawn(
            [
                sys.executable,
                str(HERE / "forwarder.py"),
                "--port",
                str(f_port),
                "--prefill-port",
                str(p_port),
                "--decode-port",
                str(d_port),
            ],
            tmp,
            "forwarder",
        )
        urls["forwarder"] = f"http://{HOST}:{f_port}"
        for mode, (extra, env) in kvtrace_modes(args, os.path.join(tmp, "traces")).items():
            port = free_port()
            cmd = [
                sys.executable,
                str(HERE / "lagprobe.py"),
                "proxy",
                "--port",
                str(port),
                "--prefiller-port",
                str(p_port),
                "--decoder-port",
                str(d_port),
                *extra,
            ]
            procs[mode] = spawn(cmd, tmp, mode, env)
            urls[mode] = f"http://{HOST}:{port}"
        if args.baseline_cmd:
            filled = args.baseline_cmd.format(port=b_port, host=HOST, prefill_port=p_port, decode_port=d_port)
            procs["baseline"] = spawn(shlex.split(filled), tmp, "baseline")
            urls["baseline"] = f"http://{HOST}:{b_port}"
        for url, name in [(p_url, "sim"), (d_url, "sim")] + [(u, n) for n, u in urls.items()]:
            await wait_ready(url, procs[name])
        pids = {name: procs[name].pid for name in urls}
        scrapers = [
            asyncio.create_task(scrape(urls[m]))
            for m in urls
            if m.startswith("kv") and m != "kv_nometric" and args.metrics != "off"
        ]
        try:
            results = await bench(args, urls, p_url, d_url, pids)
            lag = {conc: await lag_phase(args, urls, conc) for conc in args.lag_concurrency if args.lag_requests > 0}
        finally:
            for task in scrapers:
                task.cancel()
        from kvtrace.proxy.runtime import loop_factory

        loop = "uvloop" if loop_factory(args.loop) is not None else "asyncio"
        print(
            f"# zero-cost simulator 1P+1D, max_tokens={args.max_tokens}, streaming chat, {args.rounds} rounds, "
            f"kvtrace loop={loop}, metrics={args.metrics}, cpus={os.cpu_count()}, "
            f"load={os.getloadavg()[0]:.1f}"
        )
        report(results, ["direct_d", "direct_pd", "direct_reuse", *urls], args.concurrency)
        for conc, by_mode in (lag or {}).items():
            report_lag(by_mode, args, conc)
        if "kv_nometric" in urls:
            report_metrics(results, args.concurrency)
        report_targets(results, lag, args.concurrency)
    finally:
        stop(list(procs.values()))
    return 0


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every process (last started first), then wait for each; kill one that hangs."""
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
