"""``kvtrace demo``: the whole pipeline on one machine (:mod:`kvtrace.demo.run` runs it)."""

from __future__ import annotations

import os
import sys
import time

from kvtrace.demo.run import DEFAULT_TIME_SCALE, RUNS
from kvtrace.store.runs import traces_dir


def add_arguments(parser) -> None:
    parser.add_argument(
        "--traces",
        help="trace directory (default: KVTRACE_TRACES_DIR or ./kvtrace-traces); runs go to DIR/bidir and DIR/baseline",
    )
    parser.add_argument("--dashboard", action="store_true", help="open the dashboard on the traces afterwards")
    parser.add_argument("--port", type=int, default=8501, help="dashboard port (with --dashboard; default 8501)")
    parser.add_argument("--sessions", type=int, default=3, help="sessions per scenario (default 3)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=DEFAULT_TIME_SCALE,
        help=f"replay compression factor S (default {DEFAULT_TIME_SCALE:g}; larger is quicker, but "
        "then the harness's own per-request overhead blurs the TTFT comparison)",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (same workload in both runs)")


def run(args) -> int:
    """Run a simulated P/D cluster + proxy + agent workload, with and without bidirectional KV reuse.

    Writes Parquet traces to DIR/bidir and DIR/baseline (DIR: --traces, else KVTRACE_TRACES_DIR,
    else ./kvtrace-traces), prints where agent time goes, how much KV was reused, and the per-turn
    TTFT of the two runs; --dashboard then opens the dashboard on them.  Scenarios, with agent-sized
    contexts (a ~2k-token system prompt, files, pages and logs of thousands of tokens): coding-agent,
    research-assistant, pause-resume (pauses past D's retention, which the demo shortens to 45 model
    seconds), short-followups (below the recompute threshold).  Both runs execute at once, each in
    its own local process, on 127.0.0.1; about 20 s on 2 cores with the defaults (more when other work
    shares them).  Ctrl-C or SIGTERM stops both runs.
    """
    from kvtrace.analysis.report.text import wrap
    from kvtrace.demo import run as demo
    from kvtrace.demo.processes import RunFailed, Stopped
    from kvtrace.errors import CLIError

    if args.sessions < 1 or not args.time_scale > 0:
        raise CLIError("--sessions must be >= 1 and --time-scale > 0")
    root = traces_dir(args.traces)
    dirs = {name: os.path.join(root, name) for name in RUNS}
    demo.writable(root, CLIError)  # first: an unwritable --traces costs nothing
    demo.require_extras(CLIError)
    for d in dirs.values():
        demo.clear_previous(d, CLIError)
        demo.writable(d, CLIError)
    started = time.monotonic()
    demo.quiet_http_logs()
    print(
        wrap(
            f"kvtrace demo: running the workload with bidirectional KV transfer on ({dirs['bidir']}) and off "
            f"({dirs['baseline']}), in parallel ..."
        ),
        flush=True,
    )
    try:
        demo.run_both(dirs, sessions=args.sessions, time_scale=args.time_scale, seed=args.seed)
    except Stopped as exc:
        print(f"kvtrace demo: interrupted ({exc}); both runs stopped, what they recorded is in {root}", file=sys.stderr)
        return 128 + exc.signum
    except RunFailed as exc:
        raise CLIError(str(exc)) from None
    print(wrap(f"kvtrace demo: both runs done in {time.monotonic() - started:.1f} s; traces in {root}") + "\n")
    from kvtrace.demo.summary import summarize

    print(summarize(dirs["bidir"], dirs["baseline"], args.time_scale, args.sessions))
    command = f"kvtrace dashboard --traces {dirs['bidir']} --compare {dirs['baseline']}"
    if not args.dashboard:
        print(f"\nOpen the dashboard:  {command}")
        return 0
    from kvtrace.dashboards.launch import launch

    print(f"\nOpening the dashboard ({command} --port {args.port}); Ctrl-C stops it.", flush=True)
    return launch(dirs["bidir"], port=args.port, compare=dirs["baseline"])
