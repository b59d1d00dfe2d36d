"""What the proxy's legs cost "Reuse per instance": ``kvtrace.analysis.instances.per_instance`` (each
worker's requests and reuse, and the legs the proxy sent it from ``proxy_legs``) against the same
query without the legs (its SQL before the legs were added, kept here as the baseline), in the same
run, on DuckDB over the Parquet directory and, with chDB installed, on ClickHouse.

    python benchmarks/analysis/bench_instances.py [--traces DIR] [--sessions 2000] [--repeat 7]

Without ``--traces`` it first replays ``--sessions`` of Mooncake's conversation subset, tiled 600 s
apart as ``benchmarks/sim/bench_fleet.py`` does, on a virtual 8P8D fleet (kv-aware routing) into a
temporary directory.
Prints per engine: spans and legs in the store, p50 / max of each query over ``--repeat``
interleaved rounds, and the ratio.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

from kvtrace import semconv as sc
from kvtrace.analysis.common import table
from kvtrace.analysis.instances import ROLES, per_instance
from kvtrace.store import connect
from kvtrace.store.sql import literal


def _baseline_role(role: str, column: str, direction: str) -> str:
    reasons = ", ".join(f"count(*) FILTER (WHERE r.{column}_route = {literal(x)}) AS {x}" for x in sc.ROUTE_REASONS)
    return f"""
    SELECT {literal(role)} AS role, r.{column}_endpoint AS endpoint, count(*) AS requests, {reasons},
           count(*) FILTER (WHERE d.outcome = {literal(sc.OUTCOME_PULLED)}) AS pulled,
           coalesce(sum(d.local_hit_tokens), 0)::BIGINT AS local_hit_tokens,
           coalesce(sum(d.pulled_tokens), 0)::BIGINT AS pulled_tokens,
           coalesce(sum(d.recomputed_tokens), 0)::BIGINT AS recomputed_tokens,
           avg(r.ttft_ms) AS mean_ttft_ms
    FROM requests r
    LEFT JOIN (SELECT * FROM kv_decisions WHERE direction = {literal(direction)}) d USING (request_id)
    WHERE r.{column}_endpoint IS NOT NULL
    GROUP BY r.{column}_endpoint
    """


BASELINE_SQL = (
    "SELECT * FROM ("
    + " UNION ALL ".join(_baseline_role(*r) for r in ROLES)
    + f") ORDER BY role = {literal(sc.ROLE_DECODE)}, endpoint"
)


def _fleet(directory: str, sessions: int) -> str:
    """``sessions`` of Mooncake's conversation subset, tiled 600 s apart, on a virtual 8P8D fleet."""
    from kvtrace.bench import inproc, mooncake
    from kvtrace.bench.fleet import Fleet
    from kvtrace.sim import virtual

    rows = mooncake.read_rows(mooncake.shipped("mooncake-conversation"))
    copies = max(1, math.ceil(sessions / len(mooncake.sessions(rows))))
    wl = mooncake.workload(rows, name=f"mooncake-x{copies}", nonce="instances", copies=copies, period_s=600.0)
    wl.sessions = wl.sessions[:sessions]
    fleet = Fleet(8, 8, sc.ROUTING_KV_AWARE)
    cfg = {"workload": wl, "nonce": "instances"}
    virtual.run(inproc.run_arm(directory, "qwen3-32b", True, True, "efa-3200", cfg, "bench", 450.0, None, fleet))
    return directory


def _time(con, repeat: int) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {"without legs (baseline)": [], "per_instance": []}
    for _ in range(repeat):  # interleaved, so drift hits both alike
        t = time.perf_counter()
        base = table(con, BASELINE_SQL).num_rows
        runs["without legs (baseline)"].append(time.perf_counter() - t)
        t = time.perf_counter()
        rows = per_instance(con).num_rows
        runs["per_instance"].append(time.perf_counter() - t)
        assert rows >= base, (rows, base)  # a worker only the legs name adds a row
    return runs


def _print(engine: str, runs: dict[str, list[float]]) -> None:
    p50 = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in runs.items():
        print(f"  {engine:10} {k:24} p50 {p50[k] * 1000:8.1f} ms  max {max(v) * 1000:8.1f} ms")
    print(f"  {engine:10} per_instance / baseline: {p50['per_instance'] / p50['without legs (baseline)']:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", help="a run directory with a fleet's proxy spans (default: replay one)")
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-instances-") as tmp:
        directory = args.traces or _fleet(str(Path(tmp) / "fleet"), args.sessions)
        con = connect(directory)
        spans = con.execute("SELECT count(*) FROM spans").fetchall()[0][0]
        legs = con.execute("SELECT count(*), count(endpoint) FROM proxy_legs").fetchall()[0]
        print(f"{directory}: {spans:,} spans, {legs[0]:,} proxy legs ({legs[1]:,} naming their worker)")
        _print("DuckDB", _time(con, args.repeat))
        try:
            from kvtrace.store.clickhouse import load
            from kvtrace.store.clickhouse.backend import ChdbBackend
            from kvtrace.store.clickhouse.store import ClickHouseStore

            backend = ChdbBackend(str(Path(tmp) / "chdb"))
            load.load(directory, backend, "kvtrace_bench.instances")
        except ImportError as exc:  # chDB or sqlglot (the clickhouse extra) missing
            print(f"  ClickHouse skipped: {exc}")
            return 0
        _print("chDB", _time(ClickHouseStore(backend, "kvtrace_bench.instances"), args.repeat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
