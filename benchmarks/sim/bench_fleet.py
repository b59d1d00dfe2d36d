"""A fleet in virtual time at scale: Mooncake's conversation trace, tiled to ``--sessions``, on
``--prefillers`` P and ``--decoders`` D behind the proxy's ``--routing``, one arm of ``kvtrace bench
--arms`` per run (``kvtrace.bench.inproc.run_arm`` on the virtual loop, spans to Parquet as always).

Issue 41's target: 10,000 sessions on 8P8D in at most 60 s of CPU.  By default the shipped subset
(every 20th session of the trace, 405) is tiled (``kvtrace.bench.mooncake.tile``): copy k starts
``--period`` s after copy k-1 (default 600 s: 6 copies at once, 30 % of the whole trace's rate) and
shares no KV with the others.  ``--trace FILE`` replays another Mooncake trace instead, the whole
conversation trace for one (8,099 sessions in an hour: ``python scripts/mooncake_subset.py fetch
FILE``), its copies past its own sessions following each other (``--period`` its span).  At the whole
trace's rate 8P8D's KV pools fill with blocks held for reverse pulls and requests time out: what
that costs and what serves it is in docs/benchmarks.md.

Prints, per arm: requests planned, recorded and failed (by kind), CPU s (user + system, this
process and its threads; the loop's thread apart), wall s, peak RSS, requests per CPU s, and the
simulated span.  ``--baseline N`` first runs the first N sessions both ways, the fast path
and the served one (a chunk per token, a timer per decode step: ``stream_interval`` 1 and
``kvtrace.sim.decoding`` off), and prints the CPU ratio; ``--quick`` is 400 sessions and
``--baseline 40``.

    python benchmarks/sim/bench_fleet.py --quick
    python benchmarks/sim/bench_fleet.py --trace conversation_trace.jsonl --sessions 8099
    python benchmarks/sim/bench_fleet.py --sessions 10000 [--arm pcache-on_bidir-on | --all-arms]
        [--prefillers 8 --decoders 8 --routing kv-aware --preset qwen3-32b --period S] [--traces DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import sys
import tempfile
import time
from collections import Counter

TARGET_CPU_S = 60.0  # for 10,000 sessions, one arm
SUBSET_SESSIONS = 405
SUBSET_PERIOD_S = 600.0  # the subset's copies: 6 at once, 30 % of the whole trace's rate


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _workload(sessions: int, period_s: float | None, trace: str | None = None):
    """``sessions`` of the trace (default: the shipped subset), tiled ``period_s`` apart (default: 600 s
    for the subset, a trace's own span for another: its copies follow each other)."""
    from kvtrace.bench import mooncake

    rows = mooncake.read_rows(trace or mooncake.shipped("mooncake-conversation"))
    n = len(mooncake.sessions(rows)) if trace else SUBSET_SESSIONS
    if period_s is None:
        period_s = math.ceil((rows[-1].timestamp_ms - rows[0].timestamp_ms) / 1000) if trace else SUBSET_PERIOD_S
    copies = max(1, math.ceil(sessions / n))
    wl = mooncake.workload(rows, name=f"mooncake-x{copies}", nonce="arms", copies=copies, period_s=period_s)
    wl.sessions = wl.sessions[:sessions]
    return wl


def run_one(args, wl, arm: tuple[bool, bool], run_dir: str, fast: bool) -> dict:
    """One arm on a fresh cluster; ``fast`` False: the served code path (a chunk per token, a
    timer per decode step)."""
    from kvtrace.bench import inproc
    from kvtrace.bench.fleet import Fleet
    from kvtrace.sim import decoding, virtual

    fleet = Fleet(args.prefillers, args.decoders, args.routing)
    cfg = {"workload": wl, "nonce": "arms"}
    fast_loop = decoding.fast_loop
    if not fast:
        decoding.fast_loop = lambda engine: None  # the served path's per-token sleeps
    cpu0, main0, wall0 = _cpu(), time.thread_time(), time.perf_counter()
    try:
        main = inproc.run_arm(
            run_dir, args.preset, *arm, "efa-3200", cfg, "bench", 450.0, None, fleet, None if fast else 1
        )
        result = virtual.run(main, seed=0)
    finally:
        decoding.fast_loop = fast_loop
    cpu, main_cpu, wall = _cpu() - cpu0, time.thread_time() - main0, time.perf_counter() - wall0
    kinds = Counter(r.error for r in result.requests if r.error is not None)
    return {
        "requests": len(result.requests),
        "planned": wl.n_llm_calls,
        "errors": sum(kinds.values()),
        "kinds": dict(kinds.most_common()),
        "cpu": cpu,
        "main_cpu": main_cpu,
        "wall": wall,
        "sim": result.duration_s,
    }


def _line(name: str, r: dict) -> str:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (
        f"{name}: {r['planned']} requests planned, {r['requests']} recorded, {r['errors']} failed "
        f"{r['kinds'] or ''}, CPU {r['cpu']:.1f} s ({r['main_cpu']:.1f} s the loop's thread), wall {r['wall']:.1f} s, "
        f"peak RSS {rss:.0f} MiB (process so far), {r['requests'] / r['cpu']:.0f} requests/CPU s, "
        f"{r['sim']:.0f} s simulated"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=10_000)
    p.add_argument("--prefillers", type=int, default=8)
    p.add_argument("--decoders", type=int, default=8)
    p.add_argument("--routing", default="kv-aware")
    p.add_argument("--preset", default="qwen3-32b")
    p.add_argument("--period", type=float, help="s between two copies' starts (default: 600; a --trace: its span)")
    p.add_argument("--arm", default="pcache-on_bidir-on", help="pcache-{on,off}_bidir-{on,off}")
    p.add_argument("--all-arms", action="store_true")
    p.add_argument("--baseline", type=int, default=0, metavar="N", help="first N sessions both ways: the CPU ratio")
    p.add_argument("--quick", action="store_true", help="--sessions 400 --baseline 40")
    p.add_argument("--trace", metavar="FILE", help="a Mooncake trace to replay (default: the shipped subset, tiled)")
    p.add_argument("--traces", metavar="DIR", help="keep the runs' spans here (default: a temporary directory)")
    args = p.parse_args(argv)
    if args.quick:
        args.sessions, args.baseline = 400, args.baseline or 40
    arms = (
        [(c, b) for c in (False, True) for b in (False, True)]
        if args.all_arms
        else [(args.arm.split("_")[0] == "pcache-on", args.arm.split("_")[1] == "bidir-on")]
    )
    root = args.traces or tempfile.mkdtemp(prefix="kvtrace-bench-fleet-")
    print(f"{args.prefillers}P{args.decoders}D, routing {args.routing}, {args.preset}, traces in {root}")
    try:
        if args.baseline:
            wl = _workload(args.baseline, args.period, args.trace)
            fast = run_one(args, wl, arms[-1], os.path.join(root, "baseline-fast"), True)
            served = run_one(args, wl, arms[-1], os.path.join(root, "baseline-served"), False)
            print(_line(f"{args.baseline} sessions, fast path", fast))
            print(_line(f"{args.baseline} sessions, served path", served))
            print(f"CPU served / fast: x{served['cpu'] / fast['cpu']:.1f}")
        t0 = time.perf_counter()
        wl = _workload(args.sessions, args.period, args.trace)
        print(f"workload: {len(wl.sessions)} sessions, {wl.n_llm_calls} requests, {time.perf_counter() - t0:.1f} s")
        total = 0.0
        for c, b in arms:
            arm = f"pcache-{'on' if c else 'off'}_bidir-{'on' if b else 'off'}"
            r = run_one(args, wl, (c, b), os.path.join(root, arm), True)
            total += r["cpu"]
            print(_line(arm, r), flush=True)
        per_arm = total / len(arms)
        verdict = "met" if per_arm * 10_000 / max(1, args.sessions) <= TARGET_CPU_S else "not met"
        print(
            f"CPU per arm {per_arm:.1f} s for {args.sessions} sessions; target {TARGET_CPU_S:g} s / 10,000: {verdict}"
        )
    finally:
        if not args.traces:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
