"""``kvtrace demo``: the whole story on a fresh machine in well under a minute.

Starts a simulated P/D cluster (:class:`kvtrace.sim.cluster.SimCluster`, Qwen3-32B preset) and
the instrumented proxy (:mod:`kvtrace.proxy.server`) and drives a mixed agent workload through
them with :func:`kvtrace.agent.bench.arun_bench`, twice and at the same time, one process (own
event loop, own core) per run: with bidirectional KV transfer on (``DIR/bidir``) and off
(``DIR/baseline``), every component writing Parquet traces.  Two prefill workers: the proxy
round-robins, so a conversation's next turn usually lands on a P that lacks its history (the
case bidirectional transfer is for).
Then it prints the session breakdown, the reuse summary and the per-turn TTFT comparison from
:mod:`kvtrace.analysis` and says how to open the dashboard.

Time: one factor ``S`` (``--time-scale``) compresses everything alike: the simulator's model
time, TTL and lease (``SimCluster(time_scale=S)``), the proxy's conversation TTL, and the agents'
tool waits, app work and pauses (bench ``time_scale=1/S``).  The traces are a consistent replay
in wall time; multiply durations by ``S`` for model time.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import time

from kvtrace.analysis.store import traces_dir

SCENARIOS = ("coding-agent", "research-assistant", "pause-resume", "short-followups")
RUNS = ("bidir", "baseline")
DEFAULT_TIME_SCALE = 50.0
PREFILL_WORKERS = 2  # the proxy round-robins: a conversation's next turn usually lands on the other P
TTL_S = 480.0
LEASE_S = 600.0
PROXY_MARGIN_S = 30.0


def add_arguments(parser) -> None:
    parser.add_argument("--traces", help="trace directory (default: KVTRACE_TRACES_DIR or ./kvtrace-traces); "
                        "runs go to DIR/bidir and DIR/baseline")
    parser.add_argument("--dashboard", action="store_true", help="open the dashboard on the traces afterwards")
    parser.add_argument("--port", type=int, default=8501, help="dashboard port (with --dashboard; default 8501)")
    parser.add_argument("--sessions", type=int, default=2, help="sessions per scenario (default 2)")
    parser.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE,
                        help=f"replay compression factor S (default {DEFAULT_TIME_SCALE:g})")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (same workload in both runs)")


def run(args) -> int:
    """Run a simulated P/D cluster + proxy + agent workload, with and without bidirectional KV reuse.

    Writes Parquet traces to DIR/bidir and DIR/baseline (DIR: --traces, else KVTRACE_TRACES_DIR,
    else ./kvtrace-traces), prints where agent time goes, how much KV was reused, and the per-turn
    TTFT of the two runs; --dashboard then opens the dashboard on them.  Scenarios: coding-agent,
    research-assistant, pause-resume (pauses past D's retention), short-followups (below the
    recompute threshold).  Both runs execute at once, each in its own local process, on 127.0.0.1.
    """
    from kvtrace.cli import CLIError

    if args.sessions < 1 or not args.time_scale > 0:
        raise CLIError("--sessions must be >= 1 and --time-scale > 0")
    _require_extras(CLIError)
    root = traces_dir(args.traces)
    dirs = {name: os.path.join(root, name) for name in RUNS}
    for d in dirs.values():
        _clear_previous(d, CLIError)
    started = time.monotonic()
    _quiet_http_logs()
    print(f"kvtrace demo: running the workload with bidirectional KV transfer on ({dirs['bidir']}) and off "
          f"({dirs['baseline']}), in parallel ...", flush=True)
    run_both(dirs, sessions=args.sessions, time_scale=args.time_scale, seed=args.seed)
    print(f"kvtrace demo: both runs done in {time.monotonic() - started:.1f} s; traces in {root}\n")
    print(summarize(dirs["bidir"], dirs["baseline"], args.time_scale))
    command = f"kvtrace dashboard --traces {dirs['bidir']} --compare {dirs['baseline']}"
    if not args.dashboard:
        print(f"\nOpen the dashboard:  {command}")
        return 0
    from kvtrace.analysis.dashboard_cli import launch

    print(f"\nOpening the dashboard ({command} --port {args.port}); Ctrl-C stops it.", flush=True)
    return launch(dirs["bidir"], port=args.port, compare=dirs["baseline"])


def run_both(dirs: dict[str, str], **kwargs) -> None:
    """Both runs at once, one process each (own core, own event loop: the runs do not slow each
    other down on a 2-core machine)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(len(dirs), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_run_process, dirs[name], bidirectional=name == "bidir", **kwargs) for name in RUNS]
        for future in futures:
            future.result()


def _run_process(directory: str, **kwargs) -> None:
    asyncio.run(run_once(directory, **kwargs))


async def run_once(directory: str, *, bidirectional: bool, sessions: int, time_scale: float, seed: int) -> None:
    """One run: cluster + proxy + workload, every component tracing into ``directory``."""
    import kvtrace
    from kvtrace.agent import bench
    from kvtrace.proxy import server
    from kvtrace.proxy.config import ProxyConfig, Worker
    from kvtrace.sim.cluster import SimCluster

    # P's lease on blocks waiting for D (30 s in vLLM) is raised: compressed 50x it would be 0.6 s of
    # wall time, which a busy 2-core machine can miss; it is not what the demo is about.
    kv = {"kv_connector_extra_config": {"bidirectional_kv_xfer": bidirectional, "decoder_kv_blocks_ttl": TTL_S,
                                        "kv_lease_duration": LEASE_S}}
    proxy_provider = kvtrace.configure("kvtrace-proxy", traces_dir=directory, handle_sigterm=False)
    try:
        async with SimCluster(PREFILL_WORKERS, 1, preset="qwen3-32b", kv_config=kv, time_scale=time_scale,
                              traces_dir=directory) as cluster:
            cfg = ProxyConfig(prefill=[Worker("127.0.0.1", w.port) for w in cluster.prefill],
                              decode=[Worker("127.0.0.1", w.port) for w in cluster.decode], port=0,
                              conversation_ttl_s=(TTL_S - PROXY_MARGIN_S) / time_scale)
            proxy = await server.start(cfg, tracer_provider=proxy_provider)
            try:
                await bench.arun_bench(proxy.url, workload=workload(sessions, seed), traces_dir=directory,
                                       time_scale=1.0 / time_scale, clients=16, seed=seed, nonce="demo")
            finally:
                await proxy.close()
    finally:
        proxy_provider.shutdown()


def workload(sessions: int, seed: int):
    """The demo's sessions: ``sessions`` of each scenario in :data:`SCENARIOS`, one workload."""
    from kvtrace.agent import scenarios
    from kvtrace.agent.workload import Workload, from_scenario

    plans = []
    for name in SCENARIOS:
        plans += from_scenario(scenarios.get(name), sessions, seed, "demo").sessions
    return Workload("demo", plans, seed)


def summarize(bidir_dir: str, baseline_dir: str, time_scale: float) -> str:
    """The printed summary: breakdown and reuse of the bidirectional run, per-turn comparison."""
    from kvtrace.analysis import text
    from kvtrace.analysis.store import open_store

    bidir, baseline = open_store(bidir_dir), open_store(baseline_dir)
    out = [
        f"Times are wall-clock ms of a replay compressed {time_scale:g}x (multiply by {time_scale:g} for model time).",
        "",
        f"== Where agent time goes (bidirectional run, {bidir_dir}) ==",
        text.md_table(*text.breakdown_totals_rows(bidir)),
        "",
        text.md_table(*text.breakdown_rows(bidir, limit=12)),
        "",
        "== KV reuse (bidirectional run) ==",
        text.md_table(*text.reuse_rows(bidir)),
        "",
        text.md_table(*text.decision_mix_rows(bidir)),
        "",
        "== TTFT and turn latency by turn index (ratio = bidir / baseline; < 1 = faster with reuse) ==",
        text.md_table(*text.compare_rows(baseline, bidir)),
    ]
    return "\n".join(out)


def _quiet_http_logs() -> None:
    """The OpenAI client logs every request at INFO; the demo's output is the summary."""
    import logging

    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _require_extras(error) -> None:
    missing = [m for m in ("aiohttp", "openai") if _missing(m)]
    if missing:
        raise error(f"the demo needs {', '.join(missing)}: pip install 'kvtrace[demo]'")


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def _clear_previous(directory: str, error) -> None:
    """Remove an earlier demo run's traces (only Parquet files in date=/hour= partitions)."""
    if not os.path.exists(directory):
        return
    for base, dirs, files in os.walk(directory):
        rel = os.path.relpath(base, directory)
        if rel != "." and not all(p.split("=")[0] in ("date", "hour") for p in rel.split(os.sep)):
            raise error(f"{directory} holds something other than kvtrace traces ({rel}); choose another --traces")
        if any(not (f.endswith(".parquet") or f.endswith(".tmp")) for f in files):
            raise error(f"{directory} holds files other than Parquet traces; choose another --traces")
    print(f"kvtrace demo: replacing the previous demo traces in {directory}", file=sys.stderr)
    shutil.rmtree(directory)
