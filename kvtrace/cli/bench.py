"""``kvtrace bench``: thin CLI over :mod:`kvtrace.bench.api`."""

from __future__ import annotations

import argparse
import json
import math

from kvtrace.cli.options import add_arms_arguments, arms_only_flags
from kvtrace.routing import POLICIES


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kvtrace.bench.published import WORKLOADS
    from kvtrace.bench.scenarios import SCENARIOS

    p.add_argument(
        "--url", help="OpenAI-compatible endpoint (A), e.g. the kvtrace proxy: http://127.0.0.1:8000 (not with --arms)"
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--scenario", choices=list(SCENARIOS), help="built-in agent scenario")
    src.add_argument(
        "--input",
        metavar="FILE",
        help="vLLM multi-turn conversations JSON, generate_conversations config JSON, a kvtrace_scenario JSON, "
        "or a Mooncake FAST'25 trace (JSONL, replayed with its timing; 'mooncake-conversation' = the shipped "
        "subset of its conversation trace)",
    )
    src.add_argument(
        "--workload",
        metavar="NAME",
        help=f"a published workload built in ({', '.join(WORKLOADS)}): the bidirectional benchmark's sweep "
        "(10 conversations x 10 turns, 150/300 tokens, 2 clients) or vLLM's multi-turn P/D PR benchmark "
        "(24 conversations, Llama-3.3-70B)",
    )
    p.add_argument("--traces", metavar="DIR", help="write the bench's spans (Parquet) into DIR")
    p.add_argument("--json", metavar="FILE", help="write summary and per-request/turn/session stats as JSON")
    p.add_argument("--model", help="model name to send (default: the first of GET /v1/models)")
    p.add_argument("--sessions", type=int, help="sessions to run (scenario default; input files: the first N)")
    p.add_argument(
        "--clients",
        type=int,
        help="LLM requests in flight at most (default 4; --workload: the workload's, 2; a Mooncake trace: "
        "unbounded, its arrivals pace it)",
    )
    p.add_argument(
        "--max-active-conversations", type=int, help="sessions open at once (default: --clients; --workload: its own)"
    )
    p.add_argument(
        "--request-rate", type=float, default=math.inf, help="requests/s, Poisson arrivals (default: no pacing)"
    )
    p.add_argument("--seed", type=int, default=0, help="workload seed (same seed = same workload)")
    p.add_argument("--warmup", type=int, default=0, metavar="N", help="run N extra sessions first, not counted")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply tool waits, app work and pauses (0 = none)")
    p.add_argument("--max-tokens", type=int, help="input files: max_tokens for every request (default: from the data)")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (outputs may end early)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument("--api-key", help="bearer token for the endpoint (default: none)")
    p.add_argument("--ab-url", metavar="URL2", help="A/B: run the same workload against URL2 (B) and compare")
    p.add_argument(
        "--repeat", type=int, default=1, help="run the workload N times (A/B: interleaved) for a noise estimate"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr (shown only on a terminal)")
    add_arms_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Multi-turn agent benchmark against an OpenAI-compatible endpoint (e.g. the kvtrace proxy).

    Runs kvtrace agent scenarios (coding-agent, research-assistant, pause-resume, short-followups,
    no-reuse, interrupted, parallel-tools, reasoning-strip) or vLLM multi-turn inputs as traced
    sessions, and prints per-turn TTFT / TPOT / latency / reuse outcome tables.  With --ab-url the
    same seeded workload also runs against a second endpoint and the summary gives B/A ratios per
    turn index, marking differences beyond run-to-run noise.  With --arms (no --url) the workload
    runs on in-process simulated clusters in four arms (P prefix cache off/on x bidirectional
    off/on) per cost preset and the table shows the published gain beside the incremental one.
    --workload runs a published workload built in (published-sweep, vllm-pr-multiturn); with --arms
    --sweep prefix=2000,...,24000 the four arms run once per first-turn prefix length and one table
    per preset gives mean TTFT, P prefill and transfer time per arm per point, and the gains.
    """
    import logging

    from kvtrace.bench import api as bench
    from kvtrace.errors import CLIError

    for noisy in ("httpx", "httpx2", "openai"):  # one INFO line per request otherwise
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))

    clients, active = args.clients, args.max_active_conversations
    if args.workload:
        from kvtrace.bench.published import get

        try:
            spec = get(args.workload)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
        clients = spec.clients if clients is None else clients
        active = spec.max_active_conversations if active is None else active
    config = dict(
        model=args.model,
        sessions=args.sessions,
        clients=clients,  # None: the bench default (4, or unbounded for a timed trace)
        max_active_conversations=active,
        request_rate=args.request_rate,
        seed=args.seed,
        warmup=args.warmup,
        time_scale=args.time_scale,
        repeat=args.repeat,
        ignore_eos=not args.no_ignore_eos,
        max_tokens=args.max_tokens,
        request_timeout_s=args.request_timeout,
        api_key=args.api_key,
    )
    if args.scenario:
        config["scenario"] = args.scenario
    elif args.workload:
        config["published"] = args.workload
    else:
        config["input"] = args.input
    common = dict(traces_dir=args.traces, progress=not args.no_progress)
    if args.arms:
        return _arms(args, config)
    if used := arms_only_flags(args):
        raise CLIError(f"{', '.join(used)} {'goes' if len(used) == 1 else 'go'} only with --arms")
    if not args.url:
        raise CLIError("--url is required (or --arms)")
    try:
        if args.ab_url:
            result = bench.run_ab(args.url, args.ab_url, **common, **config)
        else:
            result = bench.run_bench(args.url, **common, **config)
    except bench.BenchError as exc:
        raise CLIError(str(exc)) from None
    _report(result, args.json)
    failed = result.a.sessions + result.b.sessions if args.ab_url else result.sessions
    return 1 if failed and all(s.error for s in failed) else 0


def _arms(args: argparse.Namespace, config: dict) -> int:
    from kvtrace.bench import api as bench
    from kvtrace.bench import arms
    from kvtrace.bench.fleet import Fleet
    from kvtrace.errors import CLIError

    if args.url or args.ab_url:
        raise CLIError("--arms starts its own simulated clusters: no --url or --ab-url")
    if not args.traces:
        raise CLIError("--arms needs --traces DIR (one run per arm goes under it)")
    presets = tuple(args.presets or arms.PRESETS)
    if args.calibrate_from:
        if args.presets:
            raise CLIError("--calibrate-from replaces the presets: no --presets")
        _print_calibration(args.calibrate_from)
    repeat = config.pop("repeat")  # N runs of each arm, interleaved (not N passes inside one run)
    clock = args.clock or ("wall" if args.sim_time_scale is not None else "virtual")
    if clock == "virtual" and args.sim_time_scale is not None:
        raise CLIError("--sim-time-scale compresses wall time: it goes with --clock wall")
    common = dict(
        clock=clock,
        presets=presets,
        sim_time_scale=args.sim_time_scale,
        progress=not args.no_progress,
        repeat=repeat,
        calibrate_from=args.calibrate_from,
        fleet=Fleet(
            1 if args.prefillers is None else args.prefillers,
            1 if args.decoders is None else args.decoders,
            args.routing or POLICIES[0],
        ),
    )
    try:
        if args.sweep:
            from kvtrace.bench.published import parse_sweep

            _, points = parse_sweep(args.sweep)
            result = arms.run_sweep(args.traces, points, **common, **config)
        else:
            result = arms.run_arms(args.traces, **common, **config)
    except (bench.BenchError, ValueError) as exc:
        raise CLIError(str(exc)) from None
    _report(result, args.json)
    return 0


def _print_calibration(directory: str) -> None:
    """The fit the arms will run at, before any cluster starts (CLIError when it cannot be made)."""
    from kvtrace.analysis.calibrate import CalibrationError, from_directory
    from kvtrace.errors import CLIError

    try:
        print("\n".join(from_directory(directory).lines()), flush=True)
    except CalibrationError as exc:
        raise CLIError(f"--calibrate-from {directory}: {exc}") from None


def _report(result, json_path: str | None) -> None:
    """Print ``result``'s tables; with ``--json``, write its ``to_dict()`` there too."""
    from kvtrace.errors import CLIError

    print(result.format())
    if json_path:
        try:
            with open(json_path, "w") as f:
                json.dump(result.to_dict(), f, indent=1, default=str)
        except OSError as exc:
            raise CLIError(f"cannot write {json_path}: {exc.strerror or exc}") from None
