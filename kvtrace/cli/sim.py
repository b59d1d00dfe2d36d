"""``kvtrace sim``: run a simulated P/D cluster until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvtrace.sim.costmodel import LINKS, PRESETS
    from kvtrace.sim.wire import TOOL_CALL_MODES

    parser.add_argument("--preset", default="qwen3-32b", choices=sorted(PRESETS), help="cost model / KV size preset")
    parser.add_argument("--prefill", type=int, default=1, metavar="N", help="prefill workers (default 1)")
    parser.add_argument("--decode", type=int, default=1, metavar="M", help="decode workers (default 1)")
    parser.add_argument("--prefill-port", type=int, default=8100, help="first prefill port; more use port+1, ...")
    parser.add_argument("--decode-port", type=int, default=8200, help="first decode port; more use port+1, ...")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--traces", metavar="DIR", help="write Parquet traces here (else KVTRACE_TRACES_DIR)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="compress simulated time by this factor")
    parser.add_argument("--no-cost", action="store_true", help="zero-cost mode: no simulated delays")
    parser.add_argument(
        "--kv-transfer-config",
        metavar="JSON",
        help="vLLM --kv-transfer-config JSON (bidirectional_kv_xfer defaults to true)",
    )
    parser.add_argument("--link", default="efa-3200", choices=sorted(LINKS), help="P<->D link preset")
    parser.add_argument(
        "--block-size",
        type=int,
        help="tokens per KV block (default: the preset's: 16; glm5-fp8 64, vLLM's sparse MLA; "
        "--calibrate-from: the traces')",
    )
    parser.add_argument(
        "--calibrate-from",
        metavar="DIR",
        help="fit prefill, transfer and decode-step costs to the trace directory DIR (real vLLM or another "
        "sim run), print them with the spans behind them, and run at those rates instead of --preset's",
    )
    parser.add_argument("--capacity-blocks", type=int, default=65536, help="KV blocks per worker")
    parser.add_argument("--model", help="served model name (default: accept any, list the preset)")
    parser.add_argument(
        "--no-enable-prefix-caching",
        nargs="*",
        choices=("prefill", "decode"),
        metavar="ROLE",
        help="vLLM's --no-enable-prefix-caching, per role: on the prefill and/or decode workers "
        "(no ROLE = both), as the published bidirectional benchmark ran P",
    )
    parser.add_argument(
        "--tool-calls",
        choices=TOOL_CALL_MODES,
        help="script the model's tool use, for testing agents (default off: always text): first-tool = a chat "
        "request offering tools whose last message is the user's gets a call of the first tool (arguments {}, "
        "finish_reason tool_calls); after the tool result, a text reply",
    )


def _kv_config(raw: str | None) -> dict | None:
    from kvtrace.errors import CLIError
    from kvtrace.sim.scheduler import ConfigError, KVConfig

    if not raw:
        return None
    try:
        cfg = json.loads(raw)
    except ValueError as exc:
        raise CLIError(f"--kv-transfer-config is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise CLIError("--kv-transfer-config must be a JSON object")
    try:
        KVConfig.from_dict(cfg)
    except ConfigError as exc:
        raise CLIError(f"--kv-transfer-config: {exc}") from None
    return cfg


def _no_prefix_caching(args) -> tuple[str, ...]:
    roles = args.no_enable_prefix_caching
    if roles is None:
        return ()
    return tuple(roles) or ("prefill", "decode")


def _check(args) -> None:
    from kvtrace.errors import CLIError

    if args.prefill < 0 or args.decode < 0 or args.prefill + args.decode == 0:
        raise CLIError("need at least one worker (--prefill/--decode)")
    if args.time_scale <= 0:
        raise CLIError("--time-scale must be positive")
    if (args.block_size is not None and args.block_size <= 0) or args.capacity_blocks <= 0:
        raise CLIError("--block-size and --capacity-blocks must be positive")
    for name in ("prefill_port", "decode_port"):
        if not 0 <= getattr(args, name) <= 65535:
            raise CLIError(f"--{name.replace('_', '-')} must be a port number")


def calibrated_cost(directory: str, *, enabled: bool, time_scale: float):
    """(the fit of ``directory``, a :class:`kvtrace.sim.fitted.FittedCostModel` at its rates);
    CLIError when the traces cannot be calibrated."""
    from kvtrace.analysis.calibrate import CalibrationError, from_directory
    from kvtrace.errors import CLIError
    from kvtrace.sim.fitted import FittedCostModel

    try:
        cal = from_directory(directory)
    except CalibrationError as exc:
        raise CLIError(f"--calibrate-from {directory}: {exc}") from None
    return cal, FittedCostModel(cal.cost_numbers(), enabled=enabled, time_scale=time_scale)


async def _serve(args, kv_config, cost_model=None, block_size: int | None = None) -> None:
    import asyncio
    import signal

    from kvtrace.sim.cluster import SimCluster

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with SimCluster(
        args.prefill,
        args.decode,
        preset=args.preset,
        kv_config=kv_config,
        time_scale=args.time_scale,
        cost=not args.no_cost,
        traces_dir=args.traces,
        host=args.host,
        prefill_port=args.prefill_port,
        decode_port=args.decode_port,
        block_size=block_size,
        capacity_blocks=args.capacity_blocks,
        link=args.link,
        model=args.model,
        no_prefix_caching=_no_prefix_caching(args),
        tool_calls=args.tool_calls,
        cost_model=cost_model,
    ) as cluster:
        off = (
            ", prefix caching off on " + "+".join(sorted(cluster.no_prefix_caching))
            if cluster.no_prefix_caching
            else ""
        )
        print(
            f"kvtrace sim: preset {cluster.preset}, bidirectional={cluster.kv.bidirectional}, "
            f"time scale {args.time_scale}{' (no cost)' if args.no_cost else ''}{off}"
            f"{', tool calls ' + args.tool_calls if args.tool_calls else ''}",
            flush=True,
        )
        for url in cluster.prefill_urls:
            print(f"  prefill {url}", flush=True)
        for url in cluster.decode_urls:
            print(f"  decode  {url}", flush=True)
        await stop.wait()
    print("kvtrace sim: stopped, traces flushed", flush=True)


def run(args) -> int:
    """Run a simulated vLLM P/D cluster (NixlConnector, bidirectional KV transfer) on 127.0.0.1.

    Workers speak vLLM 0.33's OpenAI API (/v1/completions, /v1/chat/completions, /health,
    /v1/models, and /metrics like vLLM's: vllm:kvtrace_*, TTFT, vllm:nixl_*; KVTRACE_METRICS=0 turns
    it off) and kv_transfer_params protocol, decide pull-vs-recompute with vLLM's rules, and
    emit kvtrace engine/decision/transfer/retention spans.  Runs until SIGINT/SIGTERM, then
    releases held blocks and flushes traces.

    With --calibrate-from DIR the costs are fitted to a recorded trace directory (a real vLLM run
    through kvtrace's connector, or another sim run) by least squares: prefill (fixed + per new
    token + per causal attention pair), KV transfer (fixed + per byte), decode step (fixed + per
    context token of the running batch), and the KV bytes per token and block size; each number is
    printed with the spans and sample counts behind it and the fit's residual, and the workers run
    at those rates (kvtrace.sim.preset "calibrated").
    """
    import asyncio

    from kvtrace import telemetry
    from kvtrace.errors import CLIError

    _check(args)
    kv_config = _kv_config(args.kv_transfer_config)
    cost_model, block_size = None, args.block_size  # None: the preset's
    if args.calibrate_from:
        cal, cost_model = calibrated_cost(args.calibrate_from, enabled=not args.no_cost, time_scale=args.time_scale)
        block_size = args.block_size or cal.block_size
        print("\n".join(cal.lines()), flush=True)
    try:
        telemetry.check_traces_dir(args.traces)
    except OSError as exc:  # NotWritable: one line naming the directory and the reason
        raise CLIError(str(exc)) from None
    try:
        asyncio.run(_serve(args, kv_config, cost_model, block_size))
    except OSError as exc:
        raise CLIError(f"cannot start workers: {exc.strerror or exc}") from None
    return 0
