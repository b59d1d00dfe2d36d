"""The numbers ``bench_proxy.py`` pools (latency percentiles, each process's CPU time from /proc)
and what it prints: its tables (latency and CPU per mode, event-loop lag, metrics on against off)
and issue #14's targets, each from the numbers of the run."""

from __future__ import annotations

import os
import statistics

STATELESS = "kv_stateless"  # its requests carry no conversation id


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
        if not fwd:  # /proc counts 10 ms ticks: a short run may give the forwarder none
            print(f"c={conc} CPU/request: the forwarder used under one 10 ms tick (too few requests to compare)")
            continue
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
