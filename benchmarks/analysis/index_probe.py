"""A design probe for issue #27's 10M-span target: the breakdown over a pre-classified index.

The current views classify every span by convention in the breakdown's scan (``b0``:
:data:`kvtrace.store.views.agents.SCAN_SQL`), which reads the three attribute maps, ``TraceId`` and
``SpanId`` of every row on every query.  A store that kept that scan's output beside its immutable
Parquet files (an index written once per file: a role code, the session, turn, times and only the
ids the joins need, for the 43 % of rows that have a role) would let the breakdown read those narrow
rows instead.  This probe writes the scan of the whole store to one Parquet file (timed: the cost an
index build would pay once per file) and times ``session_breakdown`` with ``b0`` read from it,
interleaved with the pre-#27 SQL and the view as it is; the sums must equal the pre-#27 SQL's.
Nothing in kvtrace reads such an index yet: this measures what building one would buy.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


def bench_index(con, sum_sql: str, old_sql: str, repeat: int, samples, pct) -> None:
    """Print the probe's lines: the index's build time, size and rows, then p50 / p99 of the
    three breakdowns (``samples`` / ``pct``: the bench's interleaved sampler and percentile)."""
    from kvtrace.store.sql import literal
    from kvtrace.store.views import agents, breakdown

    path = Path(tempfile.mkdtemp(prefix="kvtrace-index-probe-")) / "b0.parquet"
    t = time.perf_counter()
    con.execute(f"COPY ({agents.SCAN_SQL}) TO {literal(str(path))} (FORMAT parquet)")
    built = time.perf_counter() - t
    rows = con.sql(f"SELECT count(*) FROM read_parquet({literal(str(path))})").fetchall()[0][0]
    scan = f"b0 AS MATERIALIZED ({agents.SCAN_SQL})"
    if scan not in breakdown.SESSION_BREAKDOWN_SQL:
        raise SystemExit("index probe: the breakdown's scan is no longer `b0 AS MATERIALIZED (SCAN_SQL)`")
    indexed = breakdown.SESSION_BREAKDOWN_SQL.replace(scan, f"b0 AS (SELECT * FROM read_parquet({literal(str(path))}))")
    queries = {
        "old": sum_sql.format(f"({old_sql})"),
        "view": sum_sql.format("session_breakdown"),
        "index": sum_sql.format(f"({indexed})"),
    }
    got = con.sql(queries["index"]).fetchall()[0]
    want = con.sql(queries["old"]).fetchall()[0]
    assert got == want, f"the breakdown over the index disagrees with the pre-#27 SQL: {got} != {want}"
    t = samples({k: (lambda q=q: con.sql(q).fetchall()) for k, q in queries.items()}, repeat)
    print(
        f"index probe (#27): the breakdown's scan written once in {built:.2f} s, {rows:,} rows, "
        f"{path.stat().st_size / 1e6:.1f} MB"
    )
    for key, label in (("old", "before #27"), ("view", "the view as it is"), ("index", "b0 from the index")):
        p50, p99, ratio = pct(t[key], 50), pct(t[key], 99), pct(t[key], 50) / pct(t["old"], 50)
        print(f"  session_breakdown, {label:<20}{p50:7.3f} / {p99:7.3f} s   {ratio:.2f}x before #27")
    path.unlink()
    path.parent.rmdir()
