"""``bench_clickhouse.py --history 7 14``: what a question costs on ClickHouse as the history grows,
with and without kvtrace's materialized tables (issue #40).

For each history length (days, the same ``--spans-per-day``) the generated Parquet directory is
inserted twice into chDB, as the exporter's inserts run (ClickHouse's default settings): into a plain
exporter table (``raw``) and into one with kvtrace's materialized tables (``shaped``: ``kvtrace
clickhouse init`` on the empty table, so the views shape the inserts).  Printed:

- **insert**: wall seconds and process CPU seconds per million spans, each table (chDB runs in this
  process, so ``getrusage`` counts its threads), and the shaped/raw ratio: what the writers pay;
- per query, **cold** (first run) and **warm** (best of the rest) seconds and the rows chDB read per
  run, on both tables, and whether their answers are equal: ``one day`` (the middle day's
  ``session_breakdown`` totals), ``one session`` (one session's row), ``first page`` (what the
  dashboard's sessions page runs on opening: the time span, then the last day's facets, totals and top
  500 sessions), ``KV reuse page`` and ``retention page`` (what the dashboard's KV reuse and retention
  pages run for the last day: ``bench_history.reuse_page`` / ``retention_page``, not among the issue's
  targets; the shaped table bounds them by its requests table and prices recompute from its prefill
  tables), then the ratio of each at the longest history to the shortest (flatness).

``--small DIR`` (default: a ``kvtrace demo --sessions 2`` run made here) adds ``session_breakdown`` and
``turn_breakdown`` of a small store, the cost of analysing the query.

``--tile DAYS``: a longer history is that history's Parquet inserted again and again
(:func:`_copy`: shifted by ``DAYS`` days per copy, ids made distinct) instead of generated, so 100 M
spans load in minutes (``--history 7 70 --tile 7``).

Each shaped question runs a third time as one statement (``shaped 1st``: :mod:`kvtrace.store.clickhouse.staged`
off, every CTE inlined at each reference, as before staging): the baseline of staging, same run.
"""

from __future__ import annotations

import contextlib
import resource
import time
from pathlib import Path

from bench_clickhouse import DAY_NS, first_page, generate, timed
from bench_history import last_day, retention_page, reuse_page, same  # bench_clickhouse put it on the path

RAW, SHAPED, SINGLE = "raw", "shaped", "shaped 1st"
QUESTIONS = ("one day", "one session", "first page", "KV reuse page", "retention page")


@contextlib.contextmanager
def one_statement():
    """Queries run unstaged (the module doc's baseline)."""
    from kvtrace.store.clickhouse import store

    staged = store.stage
    store.stage = lambda text, inline=frozenset(): None
    try:
        yield
    finally:
        store.stage = staged


def measure_all(stores: dict, fns: dict, repeat: int) -> dict:
    """:func:`measure` on ``stores``, then on the shaped store unstaged (key ``SINGLE``)."""
    out = measure(stores, fns, repeat)
    with one_statement():
        single = measure({SINGLE: stores[SHAPED]}, fns, repeat)
    return {**out, **single}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _copy(k: int, days: int) -> str:
    """The select list of copy ``k`` of a ``days``-day Parquet set (``k`` > 0: ``k * days`` days later,
    trace ids' first two hex digits ``k``, the tiled session / request ids suffixed ``-t<k>``).  The
    generator's trace ids start with their template copy's number in eight hex digits, below 16**6
    (16.7 M copies), so those two digits are ``00`` in the set and ``k`` makes them distinct."""
    from kvtrace.store.sql import CLICKHOUSE, literal
    from kvtrace.testing.stores import TILED_IDS

    if k == 0:
        return "* EXCEPT (SpanAttributesInt, SpanAttributesFloat)"
    shift, prefix = f"toIntervalDay({k * days})", literal(f"{k:02x}", CLICKHOUSE)
    ids = ", ".join(literal(a, CLICKHOUSE) for a in TILED_IDS)

    def trace(col: str) -> str:
        return f"if({col} = '', {col}, concat({prefix}, substring({col}, 3)))"

    return (
        "* EXCEPT (SpanAttributesInt, SpanAttributesFloat) REPLACE ("
        f"Timestamp + {shift} AS Timestamp, {trace('TraceId')} AS TraceId, "
        f"arrayMap(t -> t + {shift}, `Events.Timestamp`) AS `Events.Timestamp`, "
        f"arrayMap(x -> {trace('x')}, `Links.TraceId`) AS `Links.TraceId`, "
        f"mapApply((a, v) -> (a, if(a IN ({ids}), concat(v, '-t{k}'), v)), SpanAttributes) AS SpanAttributes)"
    )


def insert(
    backend, parquet: Path, table: str, shaped: bool, threads: int, copies: tuple[int, int] = (1, 0)
) -> tuple[float, float]:
    """``parquet`` into a new exporter table (``shaped``: with the materialized tables first), as the
    exporter inserts; ``copies``: (n, days) inserts it ``n`` times (:func:`_copy`); (wall s, CPU s)."""
    from kvtrace.store.clickhouse import ddl, load, mviews
    from kvtrace.store.sql import CLICKHOUSE, literal

    backend.command(f"DROP TABLE IF EXISTS {table}")
    for sql in mviews.drop_statements(table):
        backend.command(sql)
    load.create_table(backend, table)
    if shaped:
        mviews.init(backend, table)
    settings = {**load.exporter_settings(backend), "max_insert_threads": str(threads), "max_threads": str(threads)}
    listed = ", ".join(f"{k} = {literal(v, CLICKHOUSE)}" for k, v in settings.items())
    glob = literal(str(parquet / "**" / "*.parquet"), CLICKHOUSE)
    w, c = time.perf_counter(), _cpu()
    for k in range(copies[0]):
        select = _copy(k, copies[1]).replace("{", "{{").replace("}", "}}")
        backend.command(
            ddl.render(f"INSERT INTO {{table}} SELECT {select} FROM file({glob}, Parquet) SETTINGS {listed}", table)
        )
    return time.perf_counter() - w, _cpu() - c


def cases(store, days: int) -> dict:
    """name -> fn(store): the queries of the module doc."""
    from kvtrace.analysis import sessions
    from kvtrace.analysis.filters import Filters

    t0 = sessions.time_span(store)["start_ns"]
    day = Filters(start_ns=t0 + days // 2 * DAY_NS, end_ns=t0 + (days // 2 + 1) * DAY_NS)
    one = sessions.list_sessions(store, day, limit=1)[0]
    return {
        "one day": (lambda c: sessions.totals(c, day), day),
        "one session": (lambda c: sessions.breakdown(c, Filters(session_id=one)).to_pylist(), Filters(session_id=one)),
        "first page": (lambda c: first_page(c, True), None),
        "KV reuse page": (lambda c: reuse_page(c, last_day(c)), None),
        "retention page": (lambda c: retention_page(c, last_day(c)), None),
    }


def storage_rows(store, filters) -> int:
    """Rows read from the tables by a question's bounds and one read of its scan (the breakdown
    reads it once; chDB counts each read of its MATERIALIZED copy as rows read too)."""
    from kvtrace.analysis.pushdown import narrowed
    from kvtrace.store.views.agents import SCAN

    before = store.backend.rows_read
    narrowed(store, filters).query(f"SELECT count(*) AS n FROM {SCAN}")
    return store.backend.rows_read - before


def measure(stores: dict, fns: dict, repeat: int) -> dict:
    """(query, kind) -> (cold s, warm s, rows read per run, answer, CPU s per run: on a shared
    machine the steadier number, rows read by the bounds and one scan read or None)."""
    out = {}
    for name, (fn, filters) in fns.items():
        for kind, store in stores.items():
            before, cpu = store.backend.rows_read, _cpu()
            cold, warm, answer = timed(lambda fn=fn, store=store: fn(store), repeat)
            cpu = (_cpu() - cpu) / repeat
            read = (store.backend.rows_read - before) / repeat
            scan = storage_rows(store, filters) if filters is not None else None
            out[name, kind] = (cold, warm, read, answer, cpu, scan)
    return out


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return same(a, b, rel_tol=1e-6)
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def run_history(
    root: Path, lengths: list[int], per_day: int, threads: int, repeat: int, small: Path | None, tile: int = 0
) -> None:
    """The module doc's runs; ``tile``: a history length whose Parquet longer ones repeat (:func:`_copy`)
    instead of generating their own."""
    from kvtrace.store.clickhouse.backend import ChdbBackend
    from kvtrace.store.clickhouse.store import ClickHouseStore

    backend = ChdbBackend(str(root / "chdb"))
    backend.command(f"SET max_threads = {threads}")
    results, spans = {}, {}
    for days in lengths:
        copies = (days // tile, tile) if tile and days > tile else (1, 0)
        parquet = root / f"parquet-{copies[1] or days}d"
        if not parquet.exists():
            generate(parquet, per_day * (copies[1] or days), copies[1] or days, root / f"work-{days}d")
        backend.command(f"CREATE DATABASE IF NOT EXISTS h{days}")
        stores = {}
        for kind in (RAW, SHAPED):
            table = f"h{days}.{kind}"
            wall, cpu = insert(backend, parquet, table, kind == SHAPED, threads, copies)
            stores[kind] = ClickHouseStore(backend, table)
            n = stores[kind].query("SELECT count(*) AS n FROM spans").column("n")[0].as_py()
            spans[days] = n
            results[days, "insert", kind] = (wall, cpu)
            print(f"{days} d, {kind}: {n:,} spans inserted in {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
        fns = cases(stores[RAW], days)
        for key, value in measure_all(stores, fns, repeat).items():
            results[(days, *key)] = value
            print(
                f"  {days} d {key[0]:12s} {key[1]:6s} cold {value[0]:7.2f} s warm {value[1]:7.2f} s "
                f"rows read {value[2] / n:7.2%}",
                flush=True,
            )
    report(results, lengths, spans)
    staging(results, lengths, ["one day", "one session", "first page"])
    if small is not None:
        small_store(backend, small, threads, repeat)


def report(results: dict, lengths: list[int], spans: dict) -> None:
    print(
        "\n| history | spans | query | raw cold s | raw warm s | raw CPU s/run | raw rows read / spans "
        "| shaped cold s | shaped warm s | shaped CPU s/run | shaped rows read / spans | answers |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for days in lengths:
        n = spans[days]
        for q in QUESTIONS:
            r, s = results[days, q, RAW], results[days, q, SHAPED]
            eq = "same" if _equal(r[3], s[3]) else "DIFFERENT"
            print(
                f"| {days} d | {n:,} | {q} | {r[0]:.2f} | {r[1]:.3f} | {r[4]:.2f} | {r[2] / n:.4f} | {s[0]:.2f} "
                f"| {s[1]:.3f} | {s[4]:.2f} | {s[2] / n:.4f} | {eq} |"
            )
    lo, hi = lengths[0], lengths[-1]
    print(
        f"\n| query | raw warm {hi} d / {lo} d | shaped warm | raw CPU | shaped CPU | raw rows read "
        "| shaped rows read |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for q in QUESTIONS:
        ratios = [results[hi, q, k][i] / max(results[lo, q, k][i], 1e-9) for i in (1, 4, 2) for k in (RAW, SHAPED)]
        print(f"| {q} | " + " | ".join(f"{x:.2f}" for x in ratios) + " |")
    print("\n| history | query | raw: bounds + one scan, rows / spans | shaped: bounds + one scan, rows / spans |")
    print("|---|---|---:|---:|")
    for days in lengths:
        for q in ("one day", "one session"):
            r, s = results[days, q, RAW][5], results[days, q, SHAPED][5]
            print(f"| {days} d | {q} | {r / spans[days]:.4f} | {s / spans[days]:.4f} |")
    print(
        "\n| history | insert raw: wall s / M spans | CPU s / M spans | shaped: wall s / M spans | CPU s / M spans "
        "| CPU shaped / raw |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for days in lengths:
        m = spans[days] / 1e6
        (rw, rc), (sw, sc) = results[days, "insert", RAW], results[days, "insert", SHAPED]
        print(f"| {days} d | {rw / m:.1f} | {rc / m:.1f} | {sw / m:.1f} | {sc / m:.1f} | {sc / rc:.2f} |")


def small_store(backend, directory: Path, threads: int, repeat: int) -> None:
    """The small store's two breakdowns, raw and shaped."""
    from kvtrace.store.clickhouse import load, mviews
    from kvtrace.store.clickhouse.store import ClickHouseStore

    backend.command("CREATE DATABASE IF NOT EXISTS small")
    stores = {}
    for kind in (RAW, SHAPED):
        table = f"small.{kind}"
        backend.command(f"DROP TABLE IF EXISTS {table}")
        for sql in mviews.drop_statements(table):
            backend.command(sql)
        load.load(directory, backend, table)
        if kind == SHAPED:
            mviews.init(backend, table)
        stores[kind] = ClickHouseStore(backend, table)
    n = stores[RAW].query("SELECT count(*) AS n FROM spans").column("n")[0].as_py()
    views = ("session_breakdown", "turn_breakdown")
    fns = {v: ((lambda c, v=v: c.query(f"SELECT * FROM {v}").to_pylist()), None) for v in views}
    got = measure_all(stores, fns, max(repeat, 3))
    print(f"\nsmall store ({n:,} spans)\n")
    print(
        "| view | raw cold s | raw warm s | raw CPU s/run | shaped cold s | shaped warm s | shaped CPU s/run "
        "| answers |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for v in fns:
        r, s = got[v, RAW], got[v, SHAPED]
        eq = "same" if _equal(sorted(r[3], key=repr), sorted(s[3], key=repr)) else "DIFFERENT"
        print(f"| {v} | {r[0]:.2f} | {r[1]:.3f} | {r[4]:.2f} | {s[0]:.2f} | {s[1]:.3f} | {s[4]:.2f} | {eq} |")
    staging({(0, *k): v for k, v in got.items()}, [0], list(fns))


def staging(results: dict, lengths: list[int], queries: list[str]) -> None:
    """Shaped, staged against one statement (the baseline, same run)."""
    print(
        "\n| history | query | 1 statement warm s | CPU s/run | staged warm s | CPU s/run | warm 1st / staged "
        "| answers |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for days in lengths:
        for q in queries:
            one, st = results[days, q, SINGLE], results[days, q, SHAPED]
            a, b = (sorted(x[3], key=repr) if isinstance(x[3], list) else x[3] for x in (one, st))
            eq = "same" if _equal(a, b) else "DIFFERENT"
            label = f"{days} d" if days else "small"
            print(
                f"| {label} | {q} | {one[1]:.3f} | {one[4]:.2f} | {st[1]:.3f} | {st[4]:.2f} "
                f"| {one[1] / max(st[1], 1e-9):.2f} | {eq} |"
            )


def demo_store(root: Path) -> Path:
    """``kvtrace demo --sessions 2``'s bidir run (made once under ``root``)."""
    import contextlib
    import io

    from kvtrace.cli import main

    traces = root / "demo"
    if not traces.exists():
        with contextlib.redirect_stdout(io.StringIO()):
            main(["demo", "--traces", str(traces), "--sessions", "2"])
    return traces / "bidir"
