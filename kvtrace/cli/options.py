"""Options shared by several commands: what a reading command reads (``--traces`` or
``--clickhouse`` / ``--table``, resolved by :mod:`kvtrace.store.source`) and where a command writes
its output (``--output``)."""

from __future__ import annotations

import argparse
import sys

from kvtrace import settings
from kvtrace.routing import POLICIES
from kvtrace.store.runs import DEFAULT_TRACES_DIR


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """``--traces``, ``--clickhouse``, ``--table``."""
    parser.add_argument(
        "--traces",
        metavar="DIR",
        help=f"trace directory, one run (default: KVTRACE_TRACES_DIR or ./{DEFAULT_TRACES_DIR})",
    )
    parser.add_argument(
        "--clickhouse",
        metavar="URL",
        help="read an otel_traces table instead: http(s)://[user[:password]@]host[:port][/database] "
        "(a ClickHouse server) or chdb:PATH (chDB in process); default KVTRACE_CLICKHOUSE",
    )
    parser.add_argument(
        "--table",
        metavar="NAME",
        help="with --clickhouse: the table, name or database.name (default KVTRACE_CLICKHOUSE_TABLE "
        f"or {settings.CLICKHOUSE_TABLE.default})",
    )


def write_output(path: str | None, content: str, command: str = "report") -> None:
    """``content`` to ``path`` (a one-line CLIError when it cannot be written), else to stdout."""
    if not path:
        sys.stdout.write(content)
        return
    from kvtrace.errors import CLIError

    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc.strerror}") from None
    print(f"kvtrace {command}: wrote {path}", file=sys.stderr)


# the --arms group's flags besides --arms itself (dest, flag): bench refuses them without --arms
_ARMS_ONLY = (
    ("presets", "--presets"),
    ("sim_time_scale", "--sim-time-scale"),
    ("clock", "--clock"),
    ("prefillers", "--prefillers"),
    ("decoders", "--decoders"),
    ("routing", "--routing"),
    ("sweep", "--sweep"),
    ("calibrate_from", "--calibrate-from"),
)


def arms_only_flags(args: argparse.Namespace) -> list[str]:
    """The --arms group's flags given (``kvtrace bench`` without --arms refuses them)."""
    return [flag for dest, flag in _ARMS_ONLY if getattr(args, dest) not in (None, False)]


def add_arms_arguments(p: argparse.ArgumentParser) -> None:
    """``kvtrace bench``'s --arms group: the simulated clusters, their fleet and clock, the sweep."""
    arms = p.add_argument_group("published vs production (--arms)")
    arms.add_argument(
        "--arms",
        action="store_true",
        help="run the workload on simulated 1P+1D clusters in four arms, P prefix cache off/on x "
        "bidirectional off/on, per preset, over the EFA link; each run's traces go to "
        "--traces DIR/<preset>/<arm>/r<k> (--repeat N: N runs per arm, interleaved); prints each "
        "preset's table with the published gain (cache off) beside the incremental gain (cache on)",
    )
    arms.add_argument(
        "--presets",
        nargs="+",
        default=None,
        metavar="PRESET",
        help="cost presets for --arms (default: qwen3-32b glm5-fp8)",
    )
    arms.add_argument(
        "--sim-time-scale",
        type=float,
        default=None,
        help="--arms: simulated time compression (default per preset: qwen3-32b 5, glm5-fp8 4, "
        "llama-3.3-70b 8); times are reported in simulated ms",
    )
    arms.add_argument(
        "--clock",
        choices=("virtual", "wall"),
        default=None,
        help="--arms: virtual (default): the clusters, proxy and client in this process on a virtual-time "
        "loop, no sockets, no sleeps: the same seed gives the same tables whatever the host's load; wall: "
        "served subprocesses sleeping in wall time (the default when --sim-time-scale is given)",
    )
    arms.add_argument(
        "--prefillers", type=int, default=None, metavar="N", help="--arms: prefill workers per cluster (default 1)"
    )
    arms.add_argument(
        "--decoders", type=int, default=None, metavar="M", help="--arms: decode workers per cluster (default 1)"
    )
    arms.add_argument(
        "--routing",
        choices=POLICIES,
        default=None,
        help="--arms: the proxy's routing policy over the fleet (kvtrace proxy --routing; default round-robin)",
    )
    arms.add_argument(
        "--sweep",
        metavar="prefix=N,N,...",
        help="--arms once per first-turn prefix length (--workload or a generate_conversations --input), "
        "runs in --traces DIR/prefix-N; prints mean TTFT, P prefill and transfer per arm per point and the gains",
    )
    arms.add_argument(
        "--calibrate-from",
        metavar="DIR",
        help="--arms: run every arm at the costs fitted to the trace directory DIR (kvtrace sim "
        "--calibrate-from: real vLLM or another sim run) instead of the presets",
    )
