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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from kvtrace.proxy.stream import Aggregator
from kvtrace.semconv import KV_PARAMS_KEY
from kvtrace.testing.wait import free_port

HOST = "127.0.0.1"
HERE = Path(__file__).resolve().parent
MESSAGES = [{"role": "user", "content": "summarise the plot of a short story about a lighthouse keeper"}]
TRACED = ("kvtrace", "kv_inproc", "kv_sdk", "kv_nometric", "kv_stateless", "kv_asyncio", "kv_uvloop")
STATELESS = "kv_stateless"  # its requests carry no conversation id


async def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
            try:
                async with http.get(url + "/health") as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"{url} not ready after {timeout}s")


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


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def _stat_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def cpu_s(pid: int | None) -> tuple[float, float] | None:
    """(CPU seconds of ``pid``, of ``pid`` plus its live children) so far; None off Linux."""
    if pid is None:
        return None
    try:
        own = _stat_cpu(pid)
        kids = 0.0
        for child in _children(pid):
            try:
                kids += _stat_cpu(child)
            except OSError:
                pass
    except OSError:
        return None
    return own, own + kids


class Acc:
    """One mode's pooled numbers at one concurrency."""

    def __init__(self) -> None:
        self.lat: list[float] = []
        self.elapsed = 0.0
        self.n = 0
        self.cpu = [0.0, 0.0]
        self.has_cpu = True

    def add(self, lat: list[float], elapsed: float, c0, c1) -> None:
        self.lat += lat
        self.elapsed += elapsed
        self.n += len(lat)
        if c0 is None or c1 is None:
            self.has_cpu = False
        else:
            self.cpu[0] += c1[0] - c0[0]
            self.cpu[1] += c1[1] - c0[1]

    def row(self) -> tuple:
        """(p50 ms, p99 ms, req/s, CPU µs/request, with children)"""
        cpu = [c / self.n * 1e6 for c in self.cpu] if self.has_cpu else [None, None]
        return pct(self.lat, 50), pct(self.lat, 99), self.n / self.elapsed, cpu[0], cpu[1]


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


def _q(values: list[float], q: float) -> str:
    if not values:
        return "-"
    v = sorted(values)
    return f"{v[min(len(v) - 1, int(q * len(v)))]:.2f}"


def report(results: dict, modes: list[str], concurrency: list[int]) -> None:
    """One row per mode and concurrency; "vs PD" columns are against ``direct_pd`` (the P/D work a
    proxy must do), "vs D" against ``direct_d``.  ``cpu``: CPU of the proxy process per request;
    ``cpu+ch``: with its child processes (the writer process)."""
    print(
        f"{'mode':<12} {'conc':>4} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>7} {'+p50 PD':>8} {'+p99 PD':>8} "
        f"{'+p50 D':>7} {'+p99 D':>7} {'tput/PD':>7} {'tput/D':>7} {'cpu us':>7} {'cpu+ch':>7}"
    )
    for conc in concurrency:
        d50, d99, drps, *_ = results[("direct_d", conc)]
        pd50, pd99, pdrps, *_ = results[("direct_pd", conc)]
        for mode in modes:
            p50, p99, rps, cpu, cpu_all = results[(mode, conc)]
            cpu_cols = f"{cpu:7.0f} {cpu_all:7.0f}" if cpu is not None else f"{'-':>7} {'-':>7}"
            print(
                f"{mode:<12} {conc:>4} {p50:8.3f} {p99:8.3f} {rps:7.0f} {p50 - pd50:8.3f} {p99 - pd99:8.3f} "
                f"{p50 - d50:7.3f} {p99 - d99:7.3f} {rps / pdrps:7.1%} {rps / drps:7.1%} {cpu_cols}"
            )


def report_lag(lag: dict, args, conc: int) -> None:
    print(f"\n# event-loop lag (1 ms probe), {args.lag_requests} requests per mode at c={conc}, ms")
    print(
        "(GIL hold: the most thread CPU one stretch of export work took in the proxy process: a\n"
        " writer-process exporter's longest slice, else the longest export call; load does not inflate it)"
    )
    print(
        f"{'mode':<12} {'samples':>7} {'exports':>7} {'p50':>6} {'p99':>6} {'max':>7} {'in-exp':>7} "
        f"{'p99 exp':>7} {'max exp':>7} {'GIL hold':>9}"
    )
    for mode, o in lag.items():
        hold = o["slice"] if o["slice"] is not None else o["export_cpu"]
        hold_s = f"{hold:9.2f}" if hold is not None else f"{'-':>9}"
        print(
            f"{mode:<12} {len(o['lags']):>7} {o['exports']:>7} {_q(o['lags'], 0.5):>6} {_q(o['lags'], 0.99):>6} "
            f"{_q(o['lags'], 1):>7} {len(o['export']):>7} {_q(o['export'], 0.99):>7} {_q(o['export'], 1):>7} {hold_s}"
        )


def report_metrics(results: dict, concurrency: list[int]) -> None:
    """What Prometheus metrics cost the proxy: metrics on (scraped every second) vs off, same run."""
    print("\n# metrics on vs off (kvtrace vs kv_nometric)")
    print(
        f"{'conc':>4} {'+p50 ms':>8} {'+p99 ms':>8} {'tput on/off':>11} {'cpu us/req on':>13} {'off':>6} {'on/off':>6}"
    )
    for conc in concurrency:
        on50, on99, onrps, oncpu, _ = results[("kvtrace", conc)]
        off50, off99, offrps, offcpu, _ = results[("kv_nometric", conc)]
        cpu = (
            f"{oncpu:13.0f} {offcpu:6.0f} {oncpu / offcpu:6.2f}" if oncpu and offcpu else f"{'-':>13} {'-':>6} {'-':>6}"
        )
        print(f"{conc:>4} {on50 - off50:8.3f} {on99 - off99:8.3f} {onrps / offrps:11.1%} {cpu}")


def report_targets(results: dict, lag: dict | None, concurrency: list[int]) -> None:
    """Issue #14's proxy targets, from this run; beside each, the same figure for the other modes of
    this run that bear on it (traces off, SDK spans, in-process export, ``--baseline-cmd``)."""
    print("\n# targets (issue #14), each against its baseline measured in this run")

    def verdict(ok: bool) -> str:
        return "HOLDS" if ok else "MISSED"

    others = [
        m for m in ("kv_stateless", "kv_notrace", "kv_sdk", "kv_inproc", "baseline") if (m, concurrency[0]) in results
    ]

    def added(mode: str, conc: int) -> tuple[float, float]:
        (p50, p99), (pd50, pd99) = results[(mode, conc)][:2], results[("direct_pd", conc)][:2]
        return p50 - pd50, p99 - pd99

    def beside(fmt) -> str:
        return "; ".join(f"{m} {fmt(m)}" for m in others)

    if 1 in concurrency:
        on50, on99 = added("kvtrace", 1)
        print(
            f"c=1 +p99 vs direct P->D {on99:.2f} ms (<= 2 ms): {verdict(on99 <= 2.0)}   "
            + beside(lambda m: f"{added(m, 1)[1]:.2f}")
        )
        print(
            f"c=1 +p50 vs direct P->D {on50:.2f} ms (<= 0.5 ms): {verdict(on50 <= 0.5)}   "
            + beside(lambda m: f"{added(m, 1)[0]:.2f}")
        )
        if ("kv_notrace", 1) in results:
            off99 = added("kv_notrace", 1)[1]
            print(
                f"c=1 +p99 traces on {on99:.2f} ms vs off {off99:.2f} ms: {on99 - off99:+.2f} ms (<= 1.5 ms): "
                f"{verdict(on99 - off99 <= 1.5)}"
            )
    if 16 in concurrency:

        def tput(mode: str, base: str = "direct_pd") -> float:
            return results[(mode, 16)][2] / results[(base, 16)][2]

        print(
            f"c=16 throughput {tput('kvtrace'):.1%} of direct P->D (>= 80 %): {verdict(tput('kvtrace') >= 0.8)}   "
            + beside(lambda m: f"{tput(m):.1%}")
        )
        same = tput("kvtrace", "direct_reuse")
        print(
            f"c=16 throughput with the same worker work: multi-turn kvtrace {same:.1%} of direct P->D with reuse, "
            f"kv_stateless {tput(STATELESS):.1%} of direct P->D (>= 80 %): "
            f"{verdict(same >= 0.8)}, {verdict(tput(STATELESS) >= 0.8)}"
        )
    for conc in concurrency:
        if ("forwarder", conc) not in results or results[("forwarder", conc)][3] is None:
            continue
        fwd = results[("forwarder", conc)][3]
        own, with_writer = results[("kvtrace", conc)][3:5]
        print(
            f"c={conc} CPU/request {own:.0f} us ({with_writer:.0f} us with the writer process) vs forwarder "
            f"{fwd:.0f} us: {own / fwd:.2f}x ({with_writer / fwd:.2f}x) (<= 1.5x): {verdict(own / fwd <= 1.5)} "
            f"({verdict(with_writer / fwd <= 1.5)})   "
            + beside(
                lambda m, conc=conc, fwd=fwd: f"{results[(m, conc)][4] / fwd:.2f}x" if results[(m, conc)][4] else "-"
            )
        )
    for conc, by_mode in (lag or {}).items():
        report_lag_target(by_mode, conc, verdict)


def report_lag_target(lag: dict, conc: int, verdict) -> None:
    """The loop-lag and GIL-hold targets at one lag-phase concurrency: the proxies without export
    (``kv_notrace``) show the lag the machine's scheduling alone causes at that load."""
    if "kvtrace" in lag:
        during = lag["kvtrace"]["export"]
        worst = max(during) if during else None
        if worst is None:
            print(f"c={conc} max loop lag while exports run: no export overlapped a probe sample")
        else:
            print(
                f"c={conc} max loop lag while exports run {worst:.2f} ms (<= 2 ms): {verdict(worst <= 2.0)}   "
                + "; ".join(
                    f"{m} {max(o['export']) if o['export'] else max(o['lags'], default=0):.2f}"
                    for m, o in lag.items()
                    if m != "kvtrace"
                )
                + " (no export: max of all samples: the machine's own scheduling lag)"
            )
        hold = lag["kvtrace"]["slice"]
        if hold is not None:
            print(
                f"c={conc} longest GIL hold by export work in the proxy {hold:.2f} ms (<= 2 ms): "
                f"{verdict(hold <= 2.0)}   "
                + "; ".join(
                    f"{m} {o['slice'] if o['slice'] is not None else o['export_cpu'] or 0:.2f}"
                    for m, o in lag.items()
                    if m != "kvtrace" and (o["slice"] or o["export_cpu"])
                )
            )


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
