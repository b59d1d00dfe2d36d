"""Get Mooncake's FAST'25 conversation trace and cut the subset kvtrace ships, or print a trace's stats.

    python scripts/mooncake_subset.py fetch FILE                 # the full trace (12,031 rows, 3.0 MB)
    python scripts/mooncake_subset.py subset FULL OUT [--every 20]
    python scripts/mooncake_subset.py stats FILE

The subset keeps whole rebuilt sessions (kvtrace.bench.mooncake's rule): every Nth session in order
of first arrival, all its rows, original timestamps; the README beside the shipped file records the
commit, the rule and the stats this prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request

import numpy as np

from kvtrace.bench import mooncake

COMMIT = "3b5a594133958449a1feaf1c9e0fc1b553e34a28"  # kvcache-ai/Mooncake main, 2026-08-22
URL = f"https://raw.githubusercontent.com/kvcache-ai/Mooncake/{COMMIT}/FAST25-release/traces/conversation_trace.jsonl"
TTL_S = 480.0  # vLLM's default decoder_kv_blocks_ttl


def fetch(out: str) -> None:
    with urllib.request.urlopen(URL, timeout=120) as resp, open(out, "wb") as f:
        f.write(resp.read())


def subset(full: str, out: str, every: int) -> None:
    groups = mooncake.sessions(mooncake.read_rows(full))
    keep = sorted((r for i, g in enumerate(groups) if i % every == 0 for r in g), key=lambda r: r.line)
    with open(out, "w") as f:
        for r in keep:
            row = {
                "timestamp": r.timestamp_ms,
                "input_length": r.input_length,
                "output_length": r.output_length,
                "hash_ids": list(r.hash_ids),
            }
            f.write(json.dumps(row, separators=(", ", ": ")) + "\n")


def stats(path: str) -> dict:
    """Rows, rebuilt sessions, turns, gap percentiles (s) and the share of gaps over D's default TTL."""
    rows = mooncake.read_rows(path)
    groups = mooncake.sessions(rows)
    gaps = np.array(mooncake.gaps_s(groups))
    p50, p90, p99 = np.percentile(gaps, [50, 90, 99]) if len(gaps) else (np.nan,) * 3
    return {
        "rows": len(rows),
        "sessions": len(groups),
        "multi_turn_sessions": sum(len(g) > 1 for g in groups),
        "max_turns": max(len(g) for g in groups),
        "span_s": (rows[-1].timestamp_ms - rows[0].timestamp_ms) / 1000,
        "mean_input_tokens": round(float(np.mean([r.input_length for r in rows])), 1),
        "mean_output_tokens": round(float(np.mean([r.output_length for r in rows])), 1),
        "gaps": len(gaps),
        "gap_p50_s": round(float(p50), 1),
        "gap_p90_s": round(float(p90), 1),
        "gap_p99_s": round(float(p99), 1),
        "gaps_over_ttl": round(float((gaps > TTL_S).mean()), 3) if len(gaps) else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch").add_argument("out")
    cut = sub.add_parser("subset")
    cut.add_argument("full")
    cut.add_argument("out")
    cut.add_argument("--every", type=int, default=20)
    sub.add_parser("stats").add_argument("path")
    args = p.parse_args(argv)
    try:
        if args.cmd == "fetch":
            fetch(args.out)
        elif args.cmd == "subset":
            subset(args.full, args.out, args.every)
        else:
            print(json.dumps(stats(args.path), indent=1))
    except (OSError, mooncake.TraceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
