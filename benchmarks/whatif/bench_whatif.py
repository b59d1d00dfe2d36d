"""What-if benchmark: ``kvtrace whatif``'s default 48-setting grid over a store of >= 1M recorded
d2p decisions, target <= 10 s on 2 cores (load + replay).

    python benchmarks/whatif/bench_whatif.py [--decisions 1000000] [--dir DIR] [--threads 2]

The store is written directly with pyarrow in :data:`kvtrace.store.schema.SCHEMA` (vectorised):
sessions of 8 turns through 4 P and 4 D engines, each turn with the spans the replay reads (the
proxy's request span, P's engine span, the d2p decision, the transfer when pulled, D's retention),
about 4.5 spans per decision.  Gaps between turns: 70 % 1-20 s, 20 % 20-300 s, 10 % 300-3000 s;
the recorded setting is vLLM's default (TTL 480 s, threshold 64, proxy TTL 450 s); outcomes are
those vLLM's rules give at that setting.  Printed: a baseline scan of the decision spans (one
Parquet read of the typed attribute map), the load (the replay's queries into numpy) as a ratio of
it, the time per setting (mean, p99, max) and the total against the target.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from kvtrace import kvrules
from kvtrace import semconv as sc
from kvtrace.store.schema import SCHEMA, TS
from kvtrace.testing.synth import BASE_NS, write_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from bench_analysis import _maps, empty_lists  # noqa: E402  (map columns with the same keys on every row)

TURNS = 8
P_ENGINES, D_ENGINES = 4, 4
BPT, BS = 262_144, 16
RATE = 8.0  # prefill tokens per ms
TTL, PROXY_TTL, THRESHOLD = 480.0, 450.0, 64
SESSION_STAGGER_NS = 200_000_000
TARGET_S = 10.0


def _table(
    name: str,
    service: str,
    trace: np.ndarray,
    span: np.ndarray,
    parent: np.ndarray | None,
    start_ns: np.ndarray,
    dur_ns: np.ndarray,
    resource: tuple,
    strs: dict,
    ints: dict,
    floats: dict,
) -> pa.Table:
    n = len(start_ns)
    empty_ts, empty_str, empty_maps = empty_lists(n)
    const = lambda v: pa.array(np.full(n, v, dtype=object), pa.string())  # noqa: E731
    hexs = lambda a, w: pa.array(np.char.mod(f"%0{w}x", a).astype(object), pa.string())  # noqa: E731
    columns = [
        pa.array(start_ns).cast(TS),
        hexs(trace, 32),
        hexs(span, 16),
        hexs(parent, 16) if parent is not None else const(""),
        const(""),
        const(name),
        const("SPAN_KIND_INTERNAL"),
        const(service),
        _maps(list(resource[0]), list(resource[1]), n, pa.string()),
        const(""),
        const(""),
        _maps(list(strs), list(strs.values()), n, pa.string()),
        pa.array(dur_ns),
        const("STATUS_CODE_UNSET"),
        const(""),
        empty_ts,
        empty_str,
        empty_maps,
        empty_str,
        empty_str,
        empty_str,
        empty_maps,
        _maps(list(ints), list(ints.values()), n, pa.int64()),
        _maps(list(floats), list(floats.values()), n, pa.float64()),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def _engines(role: str, idx: np.ndarray, count: int) -> tuple:
    names = np.array([f"{role}-{i}" for i in range(count)], dtype=object)[idx]
    keys = (sc.ENGINE_ID, sc.ENGINE_ROLE, sc.SUBSTRATE, sc.SIM_TIME_SCALE, sc.ENGINE_KV_POOL_BYTES)
    n = len(idx)
    vals = (
        names,
        np.full(n, role, dtype=object),
        np.full(n, sc.SUBSTRATE_SIM, dtype=object),
        np.full(n, "1.0", dtype=object),
        np.full(n, str(65536 * BS * BPT), dtype=object),
    )
    return keys, vals


def sessions_batch(first: int, count: int, seed: int = 7) -> list[pa.Table]:
    """The spans of sessions ``first .. first+count-1``, one table per span kind."""
    rng = np.random.default_rng(seed + first)
    shape = (count, TURNS)
    sess = np.repeat(np.arange(first, first + count), TURNS)
    turn = np.tile(np.arange(TURNS), count)
    kind = rng.random(shape)
    gap_s = np.where(
        kind < 0.7,
        rng.uniform(1, 20, shape),
        np.where(kind < 0.9, rng.uniform(20, 300, shape), rng.uniform(300, 3000, shape)),
    )
    gap_s[:, 0] = 0.0
    output = rng.integers(50, 400, shape)
    user = rng.integers(20, 500, shape)
    prompt = np.cumsum(user + np.concatenate([rng.integers(500, 3000, (count, 1)), output[:, :-1]], axis=1), axis=1)
    p_eng = rng.integers(0, P_ENGINES, shape)
    d_eng = rng.integers(0, D_ENGINES, shape)
    remote = np.concatenate([np.zeros((count, 1), np.int64), (prompt + output - 1)[:, :-1]], axis=1)
    same_p = np.concatenate([np.zeros((count, 1), bool), p_eng[:, 1:] == p_eng[:, :-1]], axis=1)
    prev_prompt = np.concatenate([np.zeros((count, 1), np.int64), prompt[:, :-1]], axis=1)
    local = np.where(same_p, (prev_prompt - 1) // BS * BS, 0)
    offered = (turn.reshape(shape) > 0) & kvrules.entry_offered(gap_s - 0.05, PROXY_TTL)
    count_ = kvrules.pull_count(remote, prompt, local)
    code = kvrules.d2p_outcome(offered, count_, local, THRESHOLD)
    pulled = np.where(code == kvrules.PULLED, count_, 0)
    recomputed = prompt - local - pulled
    xfer_ms = np.where(pulled > 0, 2.0 + pulled * 0.0007, 0.0)
    ttft_ms = 30.0 + xfer_ms + recomputed / RATE
    # times: turn k's decision at t_k; D retains at t_k + 1.5 s (decode end); turn k+1 decides gap later
    r_off = 1_500_000_000
    t0 = BASE_NS + np.arange(first, first + count) * SESSION_STAGGER_NS
    steps = (gap_s * 1e9).astype(np.int64) + np.concatenate(
        [np.zeros((count, 1), np.int64), np.full((count, TURNS - 1), r_off)], axis=1
    )
    t = t0[:, None] + np.cumsum(steps, axis=1)
    nxt_t = np.concatenate([t[:, 1:], np.full((count, 1), np.iinfo(np.int64).max // 2)], axis=1)
    nxt_code = np.concatenate([code[:, 1:], np.full((count, 1), kvrules.NO_REMOTE, np.int8)], axis=1)
    nxt_off = np.concatenate([offered[:, 1:], np.zeros((count, 1), bool)], axis=1)
    nxt_xfer = np.concatenate([xfer_ms[:, 1:], np.zeros((count, 1))], axis=1)
    r_start = t + r_off
    ttl_end = r_start + int(TTL * 1e9)
    r_end = np.where(nxt_off, np.minimum(nxt_t + (nxt_xfer * 1e6).astype(np.int64), ttl_end), ttl_end)
    r_out = np.where(
        nxt_off & (nxt_code == kvrules.PULLED),
        sc.RETENTION_READ,
        np.where(nxt_off, sc.RETENTION_RELEASED, sc.RETENTION_EXPIRED),
    ).astype(object)
    f = lambda a: a.ravel()  # noqa: E731
    n = count * TURNS
    trace = sess * TURNS + turn + 1
    span0 = (sess * TURNS + turn) * 8 + 1
    sid = np.char.add("s", sess.astype(str)).astype(object)
    rid = np.char.add(np.char.add(sid.astype(str), "-"), turn.astype(str)).astype(object)
    ident_s = {sc.SESSION_ID: sid, sc.GEN_AI_REQUEST_ID: rid}
    p_res, d_res = _engines(sc.ROLE_PREFILL, f(p_eng), P_ENGINES), _engines(sc.ROLE_DECODE, f(d_eng), D_ENGINES)
    outcome = np.array(sc.OUTCOMES, dtype=object)[f(code)]
    tables = [
        _table(
            sc.SPAN_PROXY_REQUEST,
            "kvtrace-proxy",
            trace,
            span0,
            None,
            f(t) - 1_000_000,
            (f(ttft_ms) * 1e6).astype(np.int64) + 50_000_000,
            ((), ()),
            {**ident_s, sc.PROXY_OFFER: np.where(f(offered), "true", "false").astype(object)},
            {sc.TURN_INDEX: turn},
            {
                sc.REQUEST_TTFT_MS: f(ttft_ms),
                sc.PROXY_ENTRY_AGE_S: np.maximum(f(gap_s) - 0.05, 0.0),
                sc.PROXY_CONVERSATION_TTL_S: np.full(n, PROXY_TTL),
            },
        ),
        _table(
            sc.SPAN_ENGINE_PREFILL,
            "kvtrace-sim-prefill",
            trace,
            span0 + 1,
            span0,
            f(t) - 500_000,
            ((f(xfer_ms) + f(recomputed) / RATE) * 1e6).astype(np.int64),
            p_res,
            ident_s,
            {sc.TURN_INDEX: turn, sc.KV_PROMPT_TOKENS: f(prompt), sc.REQUEST_CACHED_TOKENS: f(local + pulled)},
            {},
        ),
        _table(
            sc.SPAN_KV_RETENTION,
            "kvtrace-sim-decode",
            trace,
            span0 + 4,
            span0,
            f(r_start),
            f(r_end - r_start),
            d_res,
            {**ident_s, sc.KV_RETENTION_OUTCOME: f(r_out)},
            {
                sc.TURN_INDEX: turn,
                sc.KV_RETENTION_TOKENS: f(prompt + output - 1),
                sc.KV_RETENTION_BLOCKS: f(-(-(prompt + output - 1) // BS)),
                sc.KV_RETENTION_BYTES: f(-(-(prompt + output - 1) // BS)) * BS * BPT,
            },
            {sc.KV_RETENTION_TTL_S: np.full(n, TTL)},
        ),
    ]
    # d2p decisions; offered ones also carry D as peer and the expiry time left P saw
    prev_d = np.concatenate([np.zeros((count, 1), np.int64), d_eng[:, :-1]], axis=1).ravel()
    peer_names = np.array([f"{sc.ROLE_DECODE}-{i}" for i in range(D_ENGINES)], dtype=object)
    for with_peer, sel in ((True, f(offered)), (False, ~f(offered))):
        k = int(sel.sum())
        strs = {
            sc.SESSION_ID: sid[sel],
            sc.GEN_AI_REQUEST_ID: rid[sel],
            sc.KV_DIRECTION: np.full(k, sc.DIRECTION_D2P, dtype=object),
            sc.KV_OUTCOME: outcome[sel],
            sc.KV_LOAD_FAILURE_POLICY: np.full(k, "fail", dtype=object),
        }
        floats = {}
        if with_peer:
            strs[sc.KV_PEER_ENGINE_ID] = peer_names[prev_d[sel]]
            floats[sc.KV_EXPIRY_REMAINING_S] = TTL - f(gap_s)[sel]
        tables.append(
            _table(
                sc.SPAN_KV_DECISION,
                "kvtrace-sim-prefill",
                trace[sel],
                span0[sel] + 2,
                span0[sel] + 1,
                f(t)[sel],
                (f(xfer_ms)[sel] * 1e6).astype(np.int64),
                (p_res[0], tuple(v[sel] for v in p_res[1])),
                strs,
                {
                    sc.TURN_INDEX: turn[sel],
                    sc.KV_PROMPT_TOKENS: f(prompt)[sel],
                    sc.KV_LOCAL_HIT_TOKENS: f(local)[sel],
                    sc.KV_REMOTE_TOKENS: np.where(f(offered), f(remote), 0)[sel],
                    sc.KV_PULLED_TOKENS: f(pulled)[sel],
                    sc.KV_RECOMPUTED_TOKENS: f(recomputed)[sel],
                    sc.KV_THRESHOLD: np.full(k, THRESHOLD),
                },
                floats,
            )
        )
    pl = f(pulled) > 0
    m = int(pl.sum())
    tables.append(
        _table(
            sc.SPAN_KV_TRANSFER,
            "kvtrace-sim-prefill",
            trace[pl],
            span0[pl] + 3,
            span0[pl] + 2,
            f(t)[pl],
            (f(xfer_ms)[pl] * 1e6).astype(np.int64),
            (p_res[0], tuple(v[pl] for v in p_res[1])),
            {
                sc.SESSION_ID: sid[pl],
                sc.GEN_AI_REQUEST_ID: rid[pl],
                sc.KV_DIRECTION: np.full(m, sc.DIRECTION_D2P, dtype=object),
                sc.KV_TRANSFER_STATUS: np.full(m, sc.TRANSFER_OK, dtype=object),
            },
            {
                sc.TURN_INDEX: turn[pl],
                sc.KV_TRANSFER_TOKENS: f(pulled)[pl],
                sc.KV_TRANSFER_BLOCKS: -(-f(pulled)[pl] // BS),
                sc.KV_TRANSFER_BYTES: -(-f(pulled)[pl] // BS) * BS * BPT,
            },
            {},
        )
    )
    return tables


def build_store(directory: Path, decisions: int, per_batch: int = 250_000) -> int:
    sessions = -(-decisions // TURNS)
    step = max(1, per_batch // TURNS)
    seq = 1
    for first in range(0, sessions, step):
        tbl = pa.concat_tables(sessions_batch(first, min(step, sessions - first)))
        seq += len(write_table(tbl, directory, writer="whatif", seq=seq))
    return sessions * TURNS


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--decisions", type=int, default=1_000_000)
    p.add_argument("--dir", help="store directory (default: a temp dir, removed afterwards; kept when given)")
    p.add_argument("--threads", type=int, default=2, help="DuckDB threads and replay workers (default 2)")
    args = p.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="kvtrace-bench-whatif-"))
    try:
        if not any(root.rglob("*.parquet")):
            t = time.perf_counter()
            n = build_store(root, args.decisions)
            print(f"wrote {n:,} decisions to {root} in {time.perf_counter() - t:.1f} s", flush=True)
        bench(root, args.threads)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def bench(directory: Path, threads: int) -> None:
    import os
    from concurrent.futures import ThreadPoolExecutor

    from kvtrace.analysis.whatif.data import Phases, load
    from kvtrace.analysis.whatif.replay import prepare, recommend, replay, settings_grid
    from kvtrace.store import connect as open_store

    con = open_store(directory)
    con.execute(f"SET threads = {threads}")
    clock = _Clock()
    base = con.sql(
        f"SELECT count(*), sum(SpanAttributesInt['{sc.KV_PROMPT_TOKENS}']) FROM spans "
        f"WHERE name = '{sc.SPAN_KV_DECISION}'"
    ).fetchall()[0]
    baseline = clock.lap()
    phases = Phases()
    rec = load(con, phases)
    loaded = clock.lap()
    grid = sorted(settings_grid(rec))
    prepare(rec, grid)
    prepared = clock.lap()

    def timed(setting):
        t0 = time.perf_counter()
        r = replay(rec, *setting)
        return r, time.perf_counter() - t0

    with ThreadPoolExecutor(threads) as pool:
        out = list(pool.map(timed, grid))
    replayed = clock.lap()
    per = np.array([d for _, d in out])
    total = (loaded[0] + prepared[0] + replayed[0], loaded[1] + prepared[1] + replayed[1])
    rc = recommend(rec, [r for r, _ in out])
    recorded = next(r.row for r, _ in out if r.row["recorded"])
    print(
        f"store: {rec.decisions:,} d2p decisions ({base[0]:,} decision spans), {rec.retentions:,} retentions, "
        f"threads={threads}; load average {os.getloadavg()[0]:.1f} (wall s / CPU s of this process)"
    )
    print(f"  baseline: scan of the decision spans' int map  {_ws(baseline)}")
    print(
        f"  load (one pass over the spans -> numpy)        {_ws(loaded)}  ({loaded[0] / baseline[0]:.1f}x the "
        "baseline's wall time)"
    )
    for name, took in phases.items():
        print(f"    {name:44s} {_ws(took)}")
    print(f"  shared per-TTL / per-threshold arrays          {_ws(prepared)}")
    print(
        f"  replay, {len(grid)} settings on {threads} workers         {_ws(replayed)}  (per setting, one worker: "
        f"mean {per.mean() * 1e3:.0f} ms, p99 {np.percentile(per, 99) * 1e3:.0f} ms, max {per.max() * 1e3:.0f} ms)"
    )
    print(
        f"  total                                          {_ws(total)}  target <= {TARGET_S:g} s: "
        f"{'OK' if total[0] <= TARGET_S else 'MISSED'} (wall); replay alone "
        f"{'OK' if replayed[0] <= TARGET_S else 'MISSED'}"
    )
    print(
        f"  recorded row: {recorded['pulled']:,} pulled, {recorded['below_threshold']:,} below threshold, "
        f"{recorded['no_remote']:,} no remote, {recorded['gib_s_held']:,.0f} GiB·s; recommendation TTL "
        f"{rc['ttl_s']:g} s, threshold {rc['threshold']}"
    )


class _Clock:
    """Wall and process CPU time since the last lap (the machine may be shared: CPU time shows
    the work, wall time what it took)."""

    def __init__(self) -> None:
        self.t, self.c = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        out = (t - self.t, c - self.c)
        self.t, self.c = t, c
        return out


def _ws(pair: tuple[float, float]) -> str:
    return f"{pair[0]:6.2f} s / {pair[1]:6.2f} s"


if __name__ == "__main__":
    sys.exit(main())
