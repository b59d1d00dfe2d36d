"""Run the real-vLLM P/D rig N times and catch engine stalls with their stacks.

Each run starts P, D and D2 (tests/support/vllm_scenario.py: the e2e test's traffic) in a child process,
or with ``--pytest`` the e2e test itself.  While it runs, a monitor reads the vLLM logs every 2 s:
when one shows vLLM's shared-memory stall warning (``No available shared memory broadcast block
found in 60 seconds``) or nothing progresses for ``--stall-s`` (no rig step, no HTTP response),
it writes ``py-spy dump --native`` of every process of the run to ``RUN/stacks-K.txt`` (again
every ``--stall-s`` while the stall lasts, at most ``--max-dumps``).  Logs stay in ``RUN/``.

``--connector plain,kvtrace`` alternates kvtrace's connector and vLLM's plain NixlConnector
(kvtrace's vLLM plugin not loaded) run by run, so machine load hits both alike; the load average
is recorded per run.  ``--layout mp`` keeps vLLM's multiproc executor (a worker process per
engine, the layout that stalled); ``uni`` is the rig's default.  Results: ``OUT/results.jsonl``
(one line per run) and ``OUT/summary.md``.

    python scripts/e2e_stall.py --runs 20 --connector plain,kvtrace --layout mp --out /tmp/stall
    python scripts/e2e_stall.py --runs 10 --pytest --out /tmp/accept
    python scripts/e2e_stall.py summary /tmp/stall /tmp/accept     # one table over several outputs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support import vllm_diag as diag  # noqa: E402

_WALL = re.compile(r"vLLM P/D e2e wall time: ([0-9.]+)s")
_PYTEST_SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|error).*)$", re.M)
POLL_S = 2.0
_KERNEL_EVENTS = re.compile(r"lockup|hung task|virtual machine fork|rcu.*stall|Out of memory", re.I)


def _child_command(args, connector: str, run_dir: Path) -> list[str]:
    if args.pytest:
        return [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-s",
            str(ROOT / "tests/vllm/test_end_to_end.py"),
            "--basetemp",
            str(run_dir / "pytest"),
        ]
    return [
        sys.executable,
        __file__,
        "_one",
        "--base",
        str(run_dir),
        "--layout",
        args.layout,
        "--connector",
        connector,
        "--ready-s",
        str(args.ready_s),
    ] + (["--keep-vllm-pinning"] if args.keep_vllm_pinning else [])


def _progress_mark(run_dir: Path, driver_log: Path) -> tuple[int, int]:
    """(rig steps printed, requests answered): changes whenever the run makes progress."""
    answered = 0
    for log in _server_logs(run_dir, driver_log):
        try:
            answered += log.read_text(errors="replace").count('"POST /v1/')
        except OSError:
            pass
    try:
        steps = driver_log.read_text(errors="replace").count("[rig +")
    except OSError:
        steps = 0
    return steps, answered


def _server_logs(run_dir: Path, driver_log: Path) -> list[Path]:
    return [p for p in run_dir.rglob("*.log") if p != driver_log]


def _dump(run_dir: Path, pid: int, k: int, reason: str, elapsed: float) -> Path:
    path = run_dir / f"stacks-{k}.txt"
    head = f"# {reason} at +{elapsed:.0f}s of the run; load average {os.getloadavg()}\n"
    path.write_text(head + diag.dump_stacks(diag.process_tree(pid)))
    print(f"    stall: {reason} at +{elapsed:.0f}s -> {path}", flush=True)
    return path


def _machine() -> dict:
    """Machine-wide counters that tell a starved or paused machine from a stalled engine: CPU time
    stolen by the hypervisor (jiffies), CPU pressure (PSI, us some task waited), kernel events."""
    counters = {"steal": 0, "psi_cpu_us": 0}
    try:
        counters["steal"] = int(Path("/proc/stat").read_text().split()[8])
        psi = Path("/proc/pressure/cpu").read_text().split("\n")[0]
        counters["psi_cpu_us"] = int(psi.rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        pass
    try:
        kmsg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        kmsg = ""
    counters["kernel"] = [line for line in kmsg.splitlines() if _KERNEL_EVENTS.search(line)]
    return counters


def _sample_threads(path: Path, pid: int, elapsed: float) -> None:
    """Append every vLLM thread's state, CPU ticks and wait channel (cheap /proc reads): a stall's
    window then shows whether the stalled worker ran, slept or sat in the kernel."""
    with open(path, "a") as f:
        f.write(f"@ +{elapsed:.1f}s load {os.getloadavg()[0]:.2f}\n")
        for proc in diag.process_tree(pid):
            name = diag.title(proc)
            if name.startswith("VLLM::") or "api_server" in name:
                f.write(f"pid {proc} {name[:40]}\n{diag.kernel_view(proc, stacks=False)}\n")


def _kill_tree(pid: int) -> None:
    """SIGKILL the run and every server it started (servers run in their own sessions)."""
    for p in reversed(diag.process_tree(pid)):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_once(args, index: int, connector: str, out: Path) -> dict:
    run_dir = out / f"run-{index:02d}-{connector}"
    run_dir.mkdir(parents=True, exist_ok=True)
    driver_log = run_dir / "driver.log"
    loads, dumps, reasons = [os.getloadavg()[0]], [], []
    machine, started_at = _machine(), time.strftime("%H:%M:%S")
    started = time.monotonic()
    max_late = 0.0
    with open(driver_log, "wb") as log:
        child = subprocess.Popen(
            _child_command(args, connector, run_dir),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    mark, last_progress, shm_seen, last_dump = None, started, 0, 0.0
    try:
        while child.poll() is None:
            slept = time.monotonic()
            time.sleep(POLL_S)  # the monitor's sampling period
            now = time.monotonic()
            max_late = max(max_late, now - slept - POLL_S)  # woken this late: the machine did not run it
            loads.append(os.getloadavg()[0])
            if args.sample_threads:
                _sample_threads(run_dir / "threads.log", child.pid, now - started)
            if now - started > args.run_timeout:
                reasons.append(f"run timeout {args.run_timeout}s")
                dumps.append(_dump(run_dir, child.pid, len(dumps), reasons[-1], now - started))
                break
            new_mark = _progress_mark(run_dir, driver_log)
            if new_mark != mark:
                mark, last_progress = new_mark, now
            shm = diag.shm_warnings(_server_logs(run_dir, driver_log))
            reason = None
            if shm > shm_seen:
                reason, shm_seen = f"shared-memory stall warning #{shm}", shm
            elif mark[0] and now - last_progress >= args.stall_s and now - last_dump >= args.stall_s:
                # from the first rig step on (start-up has its own bounded readiness wait)
                reason = f"no progress for {now - last_progress:.0f}s"
            if reason and len(dumps) < args.max_dumps:
                reasons.append(reason)
                dumps.append(_dump(run_dir, child.pid, len(dumps), reason, now - started))
                last_dump = now
    finally:
        _kill_tree(child.pid)
        child.wait()
    after = _machine()
    text = driver_log.read_text(errors="replace")
    wall = _WALL.search(text)
    summary = _PYTEST_SUMMARY.findall(text)
    return {
        "run": index,
        "connector": connector,
        "layout": "test default" if args.pytest else args.layout,
        "mode": "pytest" if args.pytest else "scenario",
        "rc": child.returncode,
        "wall_s": round(time.monotonic() - started, 1),
        "rig_wall_s": float(wall.group(1)) if wall else None,
        "load_start": round(loads[0], 2),
        "load_mean": round(statistics.fmean(loads), 2),
        "load_max": round(max(loads), 2),
        "started_at": started_at,
        "monitor_late_s": round(max_late, 1),
        "steal_s": (after["steal"] - machine["steal"]) / os.sysconf("SC_CLK_TCK"),
        "cpu_pressure_pct": round(
            100 * (after["psi_cpu_us"] - machine["psi_cpu_us"]) / 1e6 / max(1e-9, time.monotonic() - started), 1
        ),
        "kernel_events": after["kernel"][len(machine["kernel"]) :],
        "shm_warnings": diag.shm_warnings(_server_logs(run_dir, driver_log)),
        "stall_reasons": reasons,
        "stacks": [str(p) for p in dumps],
        "pytest": summary[-1][0] if summary else None,
        "dir": str(run_dir),
    }


def _summary(results: list[dict]) -> str:
    lines = [
        "| run | start | connector | layout | rc | wall s | load mean (max) | CPU pressure % | monitor late s "
        "| kernel events | shm warnings | stall dumps | pytest |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['run']} | {r.get('started_at', '')} | {r['connector']} | {r['layout']} | {r['rc']} | "
            f"{r['wall_s']} | {r['load_mean']} ({r['load_max']}) | {r.get('cpu_pressure_pct', '')} | "
            f"{r.get('monitor_late_s', '')} | {len(r.get('kernel_events', ()))} | {r['shm_warnings']} | "
            f"{len(r['stacks'])} | {r['pytest'] or ''} |"
        )
    lines.append("")
    for connector in sorted({r["connector"] for r in results}):
        rs = [r for r in results if r["connector"] == connector]
        walls = sorted(r["wall_s"] for r in rs)
        stalled = sum(1 for r in rs if r["shm_warnings"])
        lines.append(
            f"- {connector}: {len(rs)} runs, {sum(1 for r in rs if r['rc'])} failed, {stalled} with a "
            f"shared-memory stall warning; wall median {statistics.median(walls):.0f} s, max {walls[-1]:.0f} s; "
            f"load mean {statistics.fmean(r['load_mean'] for r in rs):.2f}"
        )
    return "\n".join(lines) + "\n"


def summarize(dirs: list[str]) -> int:
    """``e2e_stall.py summary DIR...``: one table over the results.jsonl of several outputs."""
    results = [json.loads(line) for d in dirs for line in (Path(d) / "results.jsonl").read_text().splitlines()]
    print(_summary(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--connector", default="kvtrace", help="kvtrace, plain, or a comma list to alternate")
    parser.add_argument("--layout", choices=("uni", "mp"), default="uni")
    parser.add_argument("--pytest", action="store_true", help="run tests/vllm/test_end_to_end.py (kvtrace, its layout)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stall-s", type=float, default=60.0)
    parser.add_argument("--max-dumps", type=int, default=5)
    parser.add_argument("--run-timeout", type=float, default=900.0)
    parser.add_argument("--ready-s", type=float, default=240.0, help="start-up deadline of the servers (scenario runs)")
    parser.add_argument("--sample-threads", action="store_true", help="log every vLLM thread's state every 2 s")
    parser.add_argument(
        "--keep-vllm-pinning",
        action="store_true",
        help="leave vLLM's NIXL worker threads pinned to the last core (scenario runs)",
    )
    args = parser.parse_args(argv)
    connectors = args.connector.split(",")
    if not set(connectors) <= {"kvtrace", "plain"} or (args.pytest and connectors != ["kvtrace"]):
        parser.error("--connector: kvtrace and/or plain; --pytest runs kvtrace only")
    if diag.py_spy() is None:
        print("warning: py-spy not installed (pip install py-spy): stalls are logged without stacks", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for i in range(args.runs):
        connector = connectors[i % len(connectors)]
        print(f"run {i} ({connector}, {'pytest' if args.pytest else args.layout}) ...", flush=True)
        result = run_once(args, i, connector, args.out)
        results.append(result)
        print(
            f"    rc={result['rc']} wall={result['wall_s']}s load={result['load_mean']} "
            f"shm={result['shm_warnings']} dumps={len(result['stacks'])} {result['pytest'] or ''}",
            flush=True,
        )
        with open(args.out / "results.jsonl", "a") as f:
            f.write(json.dumps(result) + "\n")
        (args.out / "summary.md").write_text(_summary(results))
    print(_summary(results))
    return 0 if all(r["rc"] == 0 and not r["shm_warnings"] for r in results) else 1


def _one(argv: list[str]) -> int:
    """One rig run in this process (the child of run_once)."""
    parser = argparse.ArgumentParser(prog="e2e_stall.py _one")
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--layout", choices=("uni", "mp"), required=True)
    parser.add_argument("--connector", choices=("kvtrace", "plain"), required=True)
    parser.add_argument("--ready-s", type=float, required=True)
    parser.add_argument("--keep-vllm-pinning", action="store_true")
    args = parser.parse_args(argv)
    from support import vllm_scenario

    try:
        vllm_scenario.run(
            args.base,
            layout=args.layout,
            connector=args.connector,
            ready_s=args.ready_s,
            unpin=not args.keep_vllm_pinning,
        )
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_one"]:
        sys.exit(_one(sys.argv[2:]))
    if sys.argv[1:2] == ["summary"]:
        sys.exit(summarize(sys.argv[2:]))
    sys.exit(main())
