"""One arm of ``kvtrace bench --arms --clock wall``: ``kvtrace sim`` (the fleet's P and D workers) and
``kvtrace proxy`` as subprocesses on 127.0.0.1, the bench client in this process, every span to
``run_dir``.  Subprocesses, so the workers' token pacing does not share an event loop with the proxy
and the client.  :mod:`kvtrace.bench.inproc` runs the same arm on the virtual clock in this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import aiohttp

from kvtrace.analysis import arms_table as arms_analysis
from kvtrace.bench import api as bench
from kvtrace.bench.fleet import SINGLE, Fleet, consecutive_free_ports

HOST = "127.0.0.1"
READY_TIMEOUT_S = 120.0
CLI = (sys.executable, "-m", "kvtrace.cli")


def arm_ports(fleet: Fleet) -> tuple[int, int, int]:
    """(the proxy's port, the first P's, the first D's; each role's workers on consecutive ports),
    every one chosen while those chosen before it are still bound."""
    held: list[socket.socket] = []
    try:
        proxy = consecutive_free_ports(1, HOST, held=held)
        first_p = consecutive_free_ports(fleet.prefillers, HOST, held=held)
        return proxy, first_p, consecutive_free_ports(fleet.decoders, HOST, held=held)
    finally:
        for s in held:
            s.close()


def check_presets(presets: tuple[str, ...]) -> None:
    """BenchError (one line) unless ``kvtrace sim`` knows every preset: its own parser decides
    (``--preset P --help`` exits 0 after a valid preset, 2 at an unknown one), so the arms never
    start on a name the simulator refuses halfway through the runs."""
    if not presets:
        raise bench.BenchError("--presets needs at least one preset")
    for preset in presets:
        done = subprocess.run([*CLI, "sim", "--preset", preset, "--help"], capture_output=True, text=True, timeout=60)
        if done.returncode:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise bench.BenchError(lines[-1].split("error: ", 1)[-1] if lines else f"unknown preset {preset!r}")


async def run_arm(
    run_dir: str,
    preset: str,
    prefix_caching: bool,
    bidirectional: bool,
    scale: float,
    link: str,
    cfg: dict,
    progress: bool,
    conversation_ttl_s: float,
    calibrate_from: str | None = None,
    fleet: Fleet = SINGLE,
) -> bench.BenchResult:
    """The arm's workload (``cfg``: BenchConfig fields) through a fresh proxy and simulated fleet
    whose model time runs ``scale`` times faster than wall time; ``conversation_ttl_s`` in model s."""
    proxy_port, p_port, d_port = arm_ports(fleet)
    p_ports = [p_port + i for i in range(fleet.prefillers)]
    d_ports = [d_port + i for i in range(fleet.decoders)]
    sim = _sim_argv(preset, calibrate_from, fleet, link, scale, p_port, d_port, run_dir, prefix_caching, bidirectional)
    # the proxy's clock is wall time: its TTL in wall s
    proxy = _proxy_argv(proxy_port, p_ports, d_ports, fleet.routing, run_dir, conversation_ttl_s / scale)
    log = run_dir + ".log"
    os.makedirs(run_dir, exist_ok=True)
    env = {**os.environ, "KVTRACE_METRICS": "0"}
    procs: list[subprocess.Popen] = []
    with open(log, "ab") as out:
        try:
            for cmd in (sim, proxy):
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
            workers = [(f"http://{HOST}:{port}", procs[0]) for port in p_ports + d_ports]
            for url, proc in (*workers, (f"http://{HOST}:{proxy_port}", procs[1])):
                await _ready(url, proc, log)
            label = arms_analysis.arm_label(prefix_caching, bidirectional)
            return await bench.arun_bench(
                f"http://{HOST}:{proxy_port}", traces_dir=run_dir, progress=progress, label=label, **cfg
            )
        finally:
            _stop(procs[::-1])


def _sim_argv(
    preset: str,
    calibrate_from: str | None,
    fleet: Fleet,
    link: str,
    scale: float,
    p_port: int,
    d_port: int,
    run_dir: str,
    prefix_caching: bool,
    bidirectional: bool,
) -> list[str]:
    kv = {"kv_connector_extra_config": {"bidirectional_kv_xfer": bidirectional}}
    costs = ["--calibrate-from", calibrate_from] if calibrate_from else ["--preset", preset]
    return [
        *CLI,
        "sim",
        *costs,
        *("--prefill", str(fleet.prefillers), "--decode", str(fleet.decoders)),
        *("--link", link, "--time-scale", f"{scale:g}", "--host", HOST),
        *("--prefill-port", str(p_port), "--decode-port", str(d_port)),
        *("--traces", run_dir, "--kv-transfer-config", json.dumps(kv)),
        *([] if prefix_caching else ["--no-enable-prefix-caching", "prefill"]),
    ]


def _proxy_argv(
    port: int, p_ports: list[int], d_ports: list[int], routing: str, run_dir: str, ttl_s: float
) -> list[str]:
    return [
        *CLI,
        "proxy",
        *("--host", HOST, "--port", str(port)),
        *("--prefiller-host", HOST, "--prefiller-ports", *map(str, p_ports)),
        *("--decoder-host", HOST, "--decoder-ports", *map(str, d_ports)),
        *("--routing", routing, "--traces", run_dir, "--conversation-ttl", f"{ttl_s:g}"),
    ]


async def _ready(url: str, proc: subprocess.Popen, log: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise bench.BenchError(
                    f"kvtrace {proc.args[3]} exited ({proc.returncode}): {_last_line(log)} (log: {log})"
                )
            try:
                async with http.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)  # polling a process that is starting, bounded by the deadline
    raise bench.BenchError(f"{url} not ready within {READY_TIMEOUT_S:g} s (log: {log})")


def _last_line(log: str) -> str:
    with open(log, errors="replace") as f:
        lines = [line.strip() for line in f.read()[-4000:].splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()  # SIGTERM: both flush their traces before exiting
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
