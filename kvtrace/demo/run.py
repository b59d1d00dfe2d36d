"""What ``kvtrace demo`` runs: the whole story on a fresh machine in well under a minute.

Starts a simulated P/D cluster (:class:`kvtrace.sim.cluster.SimCluster`, Qwen3-32B preset) and
the instrumented proxy (:mod:`kvtrace.proxy.server`) and drives an agent workload through them
with :func:`kvtrace.bench.api.arun_bench`, twice and at the same time, one process (own event
loop, own core) per run: with bidirectional KV transfer on (``DIR/bidir``) and off
(``DIR/baseline``), every component writing Parquet traces.  Two prefill workers: the proxy
round-robins, so a conversation's next turn often lands on a P that lacks its history (the case
bidirectional transfer is for: the baseline must recompute it there).
Then it prints the session breakdown, the reuse summary and the per-turn TTFT comparison from
:mod:`kvtrace.analysis` (tables from :mod:`kvtrace.analysis.report.text`) and says how to open the
dashboard.

Workload (:func:`scenarios`): demo versions of the built-in scenarios with the context sizes of
real agents (a ~2k-token system prompt, file contents, test logs and fetched pages of thousands of
tokens), because reuse only pays for long contexts: a coding agent, a research assistant, a
pause-resume session (pauses past D's retention) and short follow-ups (below the recompute
threshold).  Every turn makes exactly one LLM call, so turn 0 has nothing to reuse in either run
and its TTFT ratio shows the harness's noise.

Time: one factor ``S`` (``--time-scale``, default 5) compresses everything alike: the
simulator's model time, TTL and lease (``SimCluster(time_scale=S)``), the proxy's conversation
TTL, and the agents' tool waits, app work and pauses (bench ``time_scale=1/S``).  The traces are a
consistent replay in wall time; multiply durations by ``S`` for model time.  ``S`` is mild so that
simulated prefill time (hundreds of ms of wall time for a long context) dominates the harness's
own HTTP/Python overhead per request (tens of ms, not compressed), and D's retention
(``decoder_kv_blocks_ttl``) is shortened to :data:`TTL_S` so the pause-resume session can outlast
it within the demo's time budget.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys

SCENARIOS = ("pause-resume", "coding-agent", "research-assistant", "short-followups")  # longest first
RUNS = ("bidir", "baseline")
DEFAULT_TIME_SCALE = 5.0  # kvtrace demo --time-scale
PREFILL_WORKERS = 2  # the proxy round-robins: a conversation's next turn often lands on the other P
TTL_S = 45.0  # decoder_kv_blocks_ttl, model seconds (vLLM's default is 480 s)
RESUME_PAUSE_S = 60.0  # the pause-resume session's pause: longer than TTL_S
LEASE_S = 600.0  # kv_lease_duration: P's hold for D (30 s in vLLM); never the subject here
PROXY_MARGIN_S = 10.0  # the proxy stops offering D's blocks this long before D drops them
SYSTEM_TOKENS = (1800, 2200)  # instructions + tool definitions
START_GAP_S = 3.0  # model seconds between session starts


def run_both(dirs: dict[str, str], **kwargs) -> None:
    """Both runs at once, one process each (:mod:`kvtrace.demo.processes`: own core, own event
    loop; a signal stops both)."""
    from kvtrace.demo import processes

    processes.run_all(
        _run_process, {name: dict(directory=dirs[name], bidirectional=name == "bidir", **kwargs) for name in RUNS}
    )


def _run_process(directory: str, **kwargs):
    """One run's process: import everything first, then freeze the imported objects out of the
    garbage collector's reach and make its collections rare, so that full collections (hundreds
    of ms over openai's and OTel's module objects on a busy machine) do not stall the event loop
    mid-request and show up as TTFT.  Returns the run's coroutine (:func:`run_once`).  The process
    lives for one run (~200 MB)."""
    import gc

    import kvtrace.bench.api  # noqa: F401
    import kvtrace.proxy.server  # noqa: F401
    import kvtrace.sim.cluster  # noqa: F401

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    return run_once(directory, **kwargs)


async def run_once(directory: str, *, bidirectional: bool, sessions: int, time_scale: float, seed: int) -> None:
    """One run: cluster + proxy + workload, every component tracing into ``directory``."""
    import kvtrace
    from kvtrace.proxy import server
    from kvtrace.proxy.config import ProxyConfig, Worker
    from kvtrace.sim.cluster import SimCluster

    # LEASE_S: P's lease on blocks waiting for D (30 s in vLLM) is raised: compressed S times it
    # could be missed by a busy 2-core machine; it is not what the demo is about.
    kv = {
        "kv_connector_extra_config": {
            "bidirectional_kv_xfer": bidirectional,
            "decoder_kv_blocks_ttl": TTL_S,
            "kv_lease_duration": LEASE_S,
        }
    }
    proxy_provider = kvtrace.configure("kvtrace-proxy", traces_dir=directory, handle_sigterm=False)
    try:
        async with SimCluster(
            PREFILL_WORKERS, 1, preset="qwen3-32b", kv_config=kv, time_scale=time_scale, traces_dir=directory
        ) as cluster:
            cfg = ProxyConfig(
                prefill=[Worker("127.0.0.1", w.port) for w in cluster.prefill],
                decode=[Worker("127.0.0.1", w.port) for w in cluster.decode],
                port=0,
                conversation_ttl_s=(TTL_S - PROXY_MARGIN_S) / time_scale,
            )
            proxy = await server.start(cfg, tracer_provider=proxy_provider)
            try:
                await drive(proxy.url, workload(sessions, seed), directory, time_scale, seed)
            finally:
                await proxy.close()
    finally:
        proxy_provider.shutdown()


async def drive(url: str, workloads: list, directory: str, time_scale: float, seed: int) -> None:
    """Start one session every :data:`START_GAP_S` model seconds (agents do not all arrive at the
    same instant; a burst would queue every turn 0 on P and blur the reference row), each through
    :func:`kvtrace.bench.api.arun_bench` with its own one-session workload and one shared
    tracer provider."""
    import kvtrace
    from kvtrace.bench import api as bench

    provider = kvtrace.configure("kvtrace-bench", traces_dir=directory, handle_sigterm=False)

    async def start(i: int, one) -> None:
        await asyncio.sleep(i * START_GAP_S / time_scale)
        await bench.arun_bench(
            url, workload=one, tracer_provider=provider, time_scale=1.0 / time_scale, clients=1, seed=seed, nonce="demo"
        )

    try:
        await asyncio.gather(*(start(i, one) for i, one in enumerate(workloads)))
    finally:
        provider.shutdown()


def workload(sessions: int, seed: int) -> list:
    """The demo's sessions in start order, one single-session workload each: ``sessions`` of
    each of :func:`scenarios`, longest scenario first so the run ends early (the same seed draws
    the same texts, sizes and waits in both runs)."""
    from kvtrace.bench.workload import Workload, from_scenario

    drawn = [from_scenario(scenario, sessions, seed, "demo") for scenario in scenarios()]
    return [Workload(w.name, [plan], seed) for w in drawn for plan in w.sessions]


def scenarios() -> list:
    """Demo versions of the built-in scenarios (names in :data:`SCENARIOS`) with realistic
    context sizes: tool outputs, file contents and pasted documents of thousands of tokens on
    top of a ~2k-token system prompt.  One LLM call per turn; times are model seconds."""
    from kvtrace.bench.distributions import Constant
    from kvtrace.bench.distributions import Uniform as U
    from kvtrace.bench.scenarios import LLM, Scenario, Tool, TurnSpec, Work

    system = U(*SYSTEM_TOKENS)
    think = U(2.0, 8.0)
    coding = Scenario(
        "coding-agent",
        "read three files (the failing module, its test, a helper), then run tests -> read the log -> patch, repeated",
        system_tokens=system,
        turns=(
            TurnSpec("task", U(150, 300), (Tool(("read_file",) * 3, U(0.2, 0.5), U(3000, 5000)), LLM(U(100, 200)))),
            TurnSpec(
                "test-fix",
                U(5, 20),
                (Work("apply_patch", U(0.05, 0.2)), Tool(("run_tests",), U(2.0, 5.0), U(800, 2000)), LLM(U(100, 200))),
                repeat=5,
            ),
        ),
    )
    research = Scenario(
        "research-assistant",
        "gather pages (parallel tools), compare with one more page, user correction, revise",
        system_tokens=system,
        turns=(
            TurnSpec(
                "gather", U(50, 100), (Tool(("web_search", "fetch_page"), U(1.0, 3.0), U(3000, 5000)), LLM(U(150, 250)))
            ),
            TurnSpec(
                "compare",
                U(30, 60),
                (
                    Work("rank_sources", U(0.05, 0.2)),
                    Tool(("fetch_page",), U(0.5, 2.0), U(3000, 5000)),
                    LLM(U(150, 250)),
                ),
                pause_s=U(5.0, 20.0),
            ),
            TurnSpec("correction", U(10, 30), (LLM(U(100, 200)),), pause_s=U(3.0, 12.0)),
            TurnSpec("revise", U(20, 40), (LLM(U(150, 250)),), pause_s=U(3.0, 12.0)),
        ),
    )
    pause = Scenario(
        "pause-resume",
        f"a pasted document, a follow-up, then a {RESUME_PAUSE_S:g} s pause (longer than "
        f"D's {TTL_S:g} s retention) and two more turns",
        system_tokens=system,
        turns=(
            TurnSpec("task", U(8000, 12000), (LLM(U(100, 200)),)),
            TurnSpec("follow-up", U(20, 40), (LLM(U(100, 200)),), pause_s=think),
            TurnSpec("resume", U(20, 40), (LLM(U(100, 200)),), pause_s=Constant(RESUME_PAUSE_S)),
            TurnSpec("after", U(20, 40), (LLM(U(100, 200)),), pause_s=think),
        ),
    )
    short = Scenario(
        "short-followups",
        "a pasted document, then short answers to short follow-ups (under 64 new "
        "tokens per turn: P recomputes them when it has the rest cached)",
        system_tokens=system,
        turns=(
            TurnSpec("ask", U(4000, 6000), (LLM(U(16, 32)),)),
            TurnSpec("follow-up", U(4, 12), (LLM(U(8, 24)),), pause_s=U(1.0, 5.0), repeat=6),
        ),
    )
    return [pause, coding, research, short]


def quiet_http_logs() -> None:
    """The OpenAI client logs every request at INFO; the demo's output is the summary."""
    import logging

    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)


def require_extras(error) -> None:
    missing = [m for m in ("aiohttp", "openai") if _missing(m)]
    if missing:
        raise error(f"the demo needs {', '.join(missing)}: pip install 'kvtrace[demo]'")


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def writable(directory: str, error) -> None:
    from kvtrace.store.access import NotWritable, ensure_writable

    try:
        ensure_writable(directory)
    except NotWritable as exc:
        raise error(str(exc)) from None


def clear_previous(directory: str, error) -> None:
    """Remove an earlier demo run's traces (only Parquet files in date=/hour= partitions)."""
    if not os.path.exists(directory):
        return
    for base, _dirs, files in os.walk(directory):
        rel = os.path.relpath(base, directory)
        if rel != "." and not all(p.split("=")[0] in ("date", "hour") for p in rel.split(os.sep)):
            raise error(f"{directory} holds something other than kvtrace traces ({rel}); choose another --traces")
        if any(not (f.endswith(".parquet") or f.endswith(".tmp")) for f in files):
            raise error(f"{directory} holds files other than Parquet traces; choose another --traces")
    print(f"kvtrace demo: replacing the previous demo traces in {directory}", file=sys.stderr)
    shutil.rmtree(directory)
