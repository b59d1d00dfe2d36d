"""What a question costs as history grows (issue #40), on DuckDB: the same per-day volume kept for
7 and for 14 days, and per question the time and the rows it reads in each.

    python benchmarks/analysis/bench_history.py [--spans-per-day 1430000] [--days 7,14] [--threads 2]
                                                 [--repeat 5] [--dir DIR]

Each store is :mod:`bench_analysis`'s synthetic sessions (170 spans, 8 turns each) spread evenly over
the days, written a million spans at a time and split by hour as the exporter does, then indexed as
``kvtrace dashboard`` does (scan indexes, their lookups and the KV views' partials,
:mod:`kvtrace.store.lookup`, :mod:`kvtrace.store.partials`; timed).
The questions, each timed over ``--repeat`` interleaved rounds (p50 / p99):

- **one day**: ``sessions.totals`` of the sessions overlapping the middle day (every column summed);
- **one session**: ``sessions.breakdown`` of one session of that day;
- **first page**: what the dashboard's sessions page runs on opening: the time span and facets (from
  the lookups) and the totals and top 500 sessions of the last day (``sessions.overview``);
- **KV reuse page**: what the dashboard's KV reuse page runs for the last day (the digest check, the
  summary with its break-even, decision and offer mixes, tokens by source, the first 5,000 requests,
  the store's break-even per engine, continuity and the per-instance table), through the bounds of
  :func:`kvtrace.analysis.pushdown.request_scoped` and the store's prefill rates from the lookups.
  Not one of the issue's targets; its ratio says how far the page still grows with the history;
- **retention page**: what the dashboard's retention page runs for the last day (totals, the bytes-held
  series, the summary per engine, the expiries), through the same bounds (a retention overlaps the
  range); not a target either;
- on the first store only, **before #40**: the one-day totals over the whole store, the way DuckDB
  answered a time range before (no bounds pushed down), and **before: KV reuse page** / **before:
  retention page**, the pages as they read before their bounds (every span, the rates over the views),
  in the same run; their answers must equal the bounded ones.

Rows read: the index and raw rows within the bounds the question reads (of all the store's), and the
lookup rows a time range reads (all of them: a few narrow columns per trace part, and for the KV reuse
page per request, prefill and d2p transfer).  Printed: a table
per store, then the 14-day / 7-day ratio of each question's p50 (target <= 1.2) and the targets
(<= 1 s one day and first page, <= 0.1 s and <= 1 % of the rows one session).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analysis import PER_SESSION, _p, _samples, build_store  # noqa: E402

DAY_NS = 86_400 * 10**9
TARGETS = {"one day": 1.0, "one session": 0.1, "first page": 1.0}


def make(directory: Path, per_day: int, days: int) -> int:
    sessions = max(1, per_day * days // PER_SESSION)
    return build_store(directory, sessions * PER_SESSION, spacing_ns=days * DAY_NS // sessions)


def _in_bounds(cur) -> tuple[int, int]:
    """(index rows, raw rows) a cursor's bounds let its views read."""
    index = cur.sql("SELECT count(*) FROM kvtrace_scan").fetchall()[0][0]
    raw = cur.sql("SELECT count(*) FROM kvtrace_raw").fetchall()[0][0]
    return index, raw


def last_day(con):
    """The store's last day (the dashboard's window on opening a ClickHouse table)."""
    from kvtrace.analysis import sessions
    from kvtrace.analysis.filters import Filters

    span = sessions.time_span(con)
    return Filters(start_ns=span["end_ns"] - DAY_NS, end_ns=span["end_ns"])


def reuse_page(con, window) -> dict:
    """What the dashboard's KV reuse page runs for ``window`` (Filters); returns its summary."""
    from kvtrace.analysis import continuity, instances, reuse

    reuse.verification(con, window)
    out = reuse.summary(con, window)
    reuse.decision_mix(con, window)
    reuse.offer_mix(con, window)
    reuse.tokens_by_source(con, window)
    reuse.requests(con, window, limit=5000)
    reuse.break_even(con)
    continuity.summary(con, window)
    instances.per_instance(con, window)
    return out


def retention_page(con, window) -> dict:
    """What the dashboard's retention page runs for ``window`` (Filters); returns its totals."""
    from kvtrace.analysis import retention

    out = retention.totals(con, window)
    retention.series(con, window, max_points=1500)
    retention.summary(con, window)
    retention.expiries(con, window, limit=1000)
    return out


def before(page, con, window) -> dict:
    """``page`` (:func:`reuse_page`, :func:`retention_page`) as DuckDB answered it before its bounds:
    every span read, the rates over the views."""
    from unittest import mock

    from kvtrace.analysis import continuity, instances, retention, reuse

    def whole(con, filters, **_):
        return con

    with (
        mock.patch.object(reuse, "request_scoped", whole),
        mock.patch.object(instances, "request_scoped", whole),
        mock.patch.object(continuity, "request_scoped", whole),
        mock.patch.object(retention, "request_scoped", whole),
        mock.patch.object(reuse, "_over", lambda con: reuse._VIEWS),
    ):
        return page(con, window)


def same(a: dict, b: dict, rel_tol: float = 1e-9) -> bool:
    """Two summaries equal, floats to ``rel_tol`` relative (a sum's order)."""
    import math

    return a.keys() == b.keys() and all(
        math.isclose(a[k], b[k], rel_tol=rel_tol) if isinstance(a[k], float) and b[k] is not None else a[k] == b[k]
        for k in a
    )


def questions(con, days: int):
    """(name -> fn, the filters each reads with, the one-day filter) for a store of ``days`` days."""
    from kvtrace.analysis import sessions
    from kvtrace.analysis.filters import Filters

    t0 = sessions.time_span(con)["start_ns"]
    day = Filters(start_ns=t0 + days // 2 * DAY_NS, end_ns=t0 + (days // 2 + 1) * DAY_NS - 1)
    one = sessions.list_sessions(con, day, limit=1)[0]

    def first_page():
        span = sessions.time_span(con)
        sessions.facets(con)
        last = Filters(start_ns=span["end_ns"] - DAY_NS, end_ns=span["end_ns"])
        return sessions.overview(con, last, limit=500)["totals"]

    fns = {
        "one day": lambda: sessions.totals(con, day),
        "one session": lambda: sessions.breakdown(con, Filters(session_id=one)).to_pylist(),
        "first page": first_page,
        "KV reuse page": lambda: reuse_page(con, last_day(con)),
        "retention page": lambda: retention_page(con, last_day(con)),
    }
    span = sessions.time_span(con)
    reads = {
        "one day": day,
        "one session": Filters(session_id=one),
        "first page": Filters(start_ns=span["end_ns"] - DAY_NS, end_ns=span["end_ns"]),
        "KV reuse page": last_day(con),
        "retention page": last_day(con),
    }
    return fns, reads, day


def before_40(con, day):
    """The one-day totals as DuckDB answered a time range before #40: the whole store's breakdown, filtered."""
    from kvtrace.analysis import sessions
    from kvtrace.analysis.common import one
    from kvtrace.analysis.filters import SESSION_SCOPE, where

    clause, params = where(day, SESSION_SCOPE)
    return one(con, sessions.TOTALS_SQL.format(where=clause), params)


def bench(directory: Path, days: int, threads: int, repeat: int, baseline: bool) -> dict:
    from kvtrace.analysis.pushdown import narrowed, request_scoped
    from kvtrace.store import connect, lookup
    from kvtrace.store.reader import build_indexes

    t = time.perf_counter()
    built = build_indexes(directory, min_bytes=0)
    built_s = time.perf_counter() - t
    con = connect(directory)
    con.execute(f"SET threads = {threads}")
    spans = con.sql("SELECT count(*) FROM kvtrace_raw").fetchall()[0][0]
    index_rows = con.sql("SELECT count(*) FROM kvtrace_scan").fetchall()[0][0]
    lookup_rows = sum(con.sql(f"SELECT count(*) FROM {v}").fetchall()[0][0] for v in (lookup.SESSIONS, lookup.TRACES))
    reuse_lookups = (lookup.REQUESTS, lookup.PREFILLS, lookup.D2P)
    reuse_rows = sum(con.sql(f"SELECT count(*) FROM {v}").fetchall()[0][0] for v in reuse_lookups)
    fns, reads, day = questions(con, days)
    if baseline:
        fns["before #40: one day"] = lambda: before_40(con, day)
        got, want = fns["one day"](), before_40(con, day)
        assert same(got, want), f"the bounded day disagrees with the whole store's: {got} != {want}"
        window = reads["KV reuse page"]
        for name, page in (("KV reuse page", reuse_page), ("retention page", retention_page)):
            fns[f"before: {name}"] = lambda page=page: before(page, con, window)
            got, want = fns[name](), before(page, con, window)
            assert same(got, want), f"the bounded {name} disagrees with the whole store's: {got} != {want}"
    samples = _samples(fns, repeat)
    print(
        f"\n{days} days: {spans:,} spans ({spans // days:,} a day), {index_rows:,} index rows, "
        f"{len(built)} files indexed in {built_s:.1f} s, {lookup_rows:,} lookup rows; threads {threads}, "
        f"{repeat} rounds"
    )
    print("| question | p50 s | p99 s | index rows read | raw rows in bounds | lookup rows read |")
    print("|---|---:|---:|---:|---:|---:|")
    out = {}
    for k, xs in samples.items():
        if k in ("KV reuse page", "retention page"):
            idx, raw = _in_bounds(request_scoped(con, reads[k]))
            cells = f"{idx:,} ({idx / index_rows:.2%}) | {raw:,} ({raw / spans:.2%}) | {lookup_rows + reuse_rows:,}"
        elif k.startswith("before: "):
            cells = f"– | {spans:,} (100%) | –"
        elif k in reads:
            idx, raw = _in_bounds(narrowed(con, reads[k]))
            looked = lookup_rows if reads[k].session_id is None else 0
            cells = f"{idx:,} ({idx / index_rows:.2%}) | {raw:,} ({raw / spans:.2%}) | {looked:,}"
        else:
            cells = f"{index_rows:,} (100%) | – | –"
        print(f"| {k} | {_p(xs, 50):.3f} | {_p(xs, 99):.3f} | {cells} |")
        out[k] = _p(xs, 50)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spans-per-day", type=int, default=1_430_000)
    p.add_argument("--days", default="7,14", help="history lengths, comma-separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dir", help="work directory, kept and reused (default: a temp dir, removed afterwards)")
    args = p.parse_args()
    lengths = [int(d) for d in args.days.split(",")]
    root = Path(args.dir or tempfile.mkdtemp(prefix="kvtrace-bench-history-"))
    results = {}
    try:
        for i, days in enumerate(lengths):
            d = root / f"days{days}"
            if not d.exists():
                t = time.perf_counter()
                n = make(d, args.spans_per_day, days)
                print(f"wrote {n:,} spans over {days} days to {d} in {time.perf_counter() - t:.1f} s", flush=True)
            results[days] = bench(d, days, args.threads, args.repeat, baseline=i == 0)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    first, last = lengths[0], lengths[-1]
    print(f"\n| question | {first} days p50 s | {last} days p50 s | ratio (target <= 1.2) | target |")
    print("|---|---:|---:|---:|---|")
    for k in results[first]:
        if k not in results[last]:
            continue
        a, b = results[first][k], results[last][k]
        target = TARGETS.get(k)
        verdict = "not a target" if target is None else f"<= {target:g} s: {'HOLDS' if b <= target else 'MISSED'}"
        print(f"| {k} | {a:.3f} | {b:.3f} | {b / a:.2f} | {verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
