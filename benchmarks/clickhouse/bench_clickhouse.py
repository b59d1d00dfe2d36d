"""Fleet scale: kvtrace's views on an ``otel_traces`` table in chDB beside DuckDB on the same spans
as Parquet, in one run.

    python benchmarks/clickhouse/bench_clickhouse.py [--spans 100000000] [--days 7] [--threads 2]
                                                     [--dir DIR] [--keep]
    python benchmarks/clickhouse/bench_clickhouse.py --history 7 14 [--spans-per-day 143000] [--small DIR]

    python benchmarks/clickhouse/bench_clickhouse.py --insert-batches 10000 100000 [--insert-spans 200000]

``--history``: chDB alone, raw table against kvtrace's materialized tables, at each history length
with the same per-day volume, and the insert cost of both (``history.py`` says what it prints).
``--insert-batches``: what the materialized views cost per span when the exporter inserts that many
spans at a time (``insert_cost.py``).

Spans: :func:`kvtrace.testing.stores.sample_store` makes a template of agent sessions with the real
OTel SDK (agent -> proxy -> P/D engines -> KV decisions, transfers, retention; every attribute
kvtrace records), :func:`kvtrace.testing.stores.tile` copies it (new trace/span/session/request ids,
times spread evenly over ``--days``) into a Parquet trace directory, and chDB loads that directory
into the OTel Collector exporter's table (its DDL, string attribute maps; the archive path of
docs/otlp.md).  Both engines then answer, with ``--threads`` threads:

- **one day**: ``session_breakdown`` of every session overlapping the middle day, all columns summed
  (:func:`kvtrace.analysis.sessions.totals` with a time range);
- **one session**: that session's ``session_breakdown`` row (``sessions.breakdown`` with its id);
- **first page**: what the dashboard's sessions page runs on opening: on DuckDB the facets, then the
  totals and the top 500 sessions of the whole store (``sessions.overview``: one query); on ClickHouse
  the table's time span, then the facets, totals and top 500 of its last day (the dashboard opens there,
  :mod:`dashboards.common`);
- a plain ``count(*)`` of the spans (baseline).

Each is timed cold (first run) and warm (best of the next two); ClickHouse's answers are checked
against DuckDB's (sessions and turns exactly, milliseconds to 1e-6).  ``--dir`` keeps (and
reuses) the generated data; without it everything goes to a temporary directory, removed at the
end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from bench_history import same  # noqa: E402

DAY_NS = 86_400 * 10**9
TEMPLATE_SESSIONS, TEMPLATE_TURNS = 16, 6
TABLE = "otel.otel_traces"


def template(root: Path) -> pa.Table:
    """Spans of :data:`TEMPLATE_SESSIONS` sample sessions, made with the OTel SDK."""
    from kvtrace.store.files import list_files
    from kvtrace.store.schema import SCHEMA
    from kvtrace.testing.stores import sample_store

    sample_store(root, sessions=TEMPLATE_SESSIONS, turns=TEMPLATE_TURNS)
    return pa.concat_tables(pq.read_table(p, schema=SCHEMA) for p in list_files(root))


def generate(directory: Path, spans: int, days: int, work: Path) -> int:
    """Tile the template into ``directory`` (Hive date/hour partitions); returns the span count."""
    from kvtrace.testing.stores import tile, write_table

    tpl = template(work / "template")
    copies = max(1, math.ceil(spans / tpl.num_rows))
    spacing = days * DAY_NS // copies
    per_file = max(1, 2_000_000 // tpl.num_rows)
    total, seq = 0, 1
    for first in range(0, copies, per_file):
        ks = np.arange(first, min(copies, first + per_file))
        part = tile(tpl, ks, ks * spacing)
        seq += len(write_table(part, directory, writer=f"tile{first:08d}", seq=seq))
        total += part.num_rows
        if first // per_file % 10 == 0:
            print(f"  generated {total:,} spans", flush=True)
    return total


def load_chdb(parquet: Path, db: Path, threads: int):
    """chDB on ``db`` with the exporter's table filled from ``parquet``; (backend, seconds)."""
    from kvtrace.store.clickhouse import ddl, load
    from kvtrace.store.clickhouse.backend import ChdbBackend
    from kvtrace.store.sql import CLICKHOUSE, literal

    backend = ChdbBackend(str(db))
    backend.command(f"SET max_threads = {threads}")
    t = time.perf_counter()
    if not backend.query("SELECT count() AS n FROM system.tables WHERE database = 'otel'").column("n")[0].as_py():
        load.create_table(backend, TABLE)
        glob = literal(str(parquet / "**" / "*.parquet"), CLICKHOUSE)
        backend.command(
            ddl.render(
                f"INSERT INTO {{table}} SELECT * EXCEPT (SpanAttributesInt, SpanAttributesFloat) "
                f"FROM file({glob}, Parquet) SETTINGS max_insert_threads = {threads}",
                TABLE,
            )
        )
    return backend, time.perf_counter() - t


REPEAT = 3


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """(first run s, best of the next ``repeat - 1`` s, first result)."""
    t = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t
    best = math.inf
    for _ in range(repeat - 1):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return first, best, out


def first_page(con, clickhouse: bool) -> dict:
    """The sessions page's queries on opening (module doc)."""
    from kvtrace.analysis import sessions
    from kvtrace.analysis.filters import Filters

    if clickhouse:
        span = sessions.time_span(con)
        window = Filters(
            start_ns=span["end_ns"] // 10**9 * 10**9 - DAY_NS, end_ns=(span["end_ns"] // 10**9 + 1) * 10**9
        )
        sessions.facets(con, window)
    else:
        sessions.facets(con)
        window = None
    return sessions.overview(con, window, limit=500)["totals"]  # the totals and the top rows in one query


def bench(parquet: Path, db: Path, days: int, threads: int, repeat: int = REPEAT) -> None:
    from kvtrace.analysis import sessions
    from kvtrace.analysis.filters import Filters
    from kvtrace.store import connect
    from kvtrace.store.clickhouse.store import ClickHouseStore

    backend, load_s = load_chdb(parquet, db, threads)
    ch = ClickHouseStore(backend, TABLE)
    duck = connect(parquet)
    duck.execute(f"SET threads = {threads}")
    n = duck.sql("SELECT count(*) FROM spans").fetchall()[0][0]
    t0 = sessions.time_span(duck)["start_ns"]
    day = Filters(start_ns=t0 + days // 2 * DAY_NS, end_ns=t0 + (days // 2 + 1) * DAY_NS)
    one = sessions.list_sessions(duck, day, limit=1)[0]
    print(
        f"{n:,} spans over {days} days; chDB load {load_s:.1f} s ({n / load_s:,.0f} spans/s; 0 = loaded before); "
        f"threads {threads}"
    )
    print(f"parquet {_du(parquet) / 2**30:.2f} GiB, chDB {_du(db) / 2**30:.2f} GiB")
    rows = []
    cases = [
        (
            "count(*) of spans",
            lambda c: c.sql("SELECT count(*) FROM spans").fetchall()[0][0],
            lambda c: c.query("SELECT count(*) AS n FROM spans").column("n")[0].as_py(),
        ),
        ("session_breakdown, one day", lambda c: sessions.totals(c, day), lambda c: sessions.totals(c, day)),
        (
            "session_breakdown, one session",
            lambda c: sessions.breakdown(c, Filters(session_id=one)).to_pylist()[0],
            lambda c: sessions.breakdown(c, Filters(session_id=one)).to_pylist()[0],
        ),
        ("dashboard first page", lambda c: first_page(c, False), lambda c: first_page(c, True)),
    ]
    for label, on_duck, on_ch in cases:
        d = timed(lambda on_duck=on_duck: on_duck(duck), repeat)  # bound: loop variables
        before = backend.rows_read
        c = timed(lambda on_ch=on_ch: on_ch(ch), repeat)
        read = (backend.rows_read - before) / repeat
        check = "" if label == "dashboard first page" else ("same" if _equal(d[2], c[2]) else "DIFFERENT")
        rows.append((label, d, c, read, check))
        print(
            f"  {label:32s} DuckDB {d[0]:8.2f} / {d[1]:8.2f} s   chDB {c[0]:8.2f} / {c[1]:8.2f} s  "
            f"chDB read {read / n:6.1%} of the rows  {check}",
            flush=True,
        )
    print(
        "\n| query | DuckDB cold s | DuckDB warm s | chDB cold s | chDB warm s | chDB/DuckDB (warm) "
        "| chDB rows read / spans | answers |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for label, d, c, read, check in rows:
        print(
            f"| {label} | {d[0]:.2f} | {d[1]:.2f} | {c[0]:.2f} | {c[1]:.2f} | {c[1] / d[1]:.2f} | {read / n:.2f} "
            f"| {check or '–'} |"
        )
    day_rows = sessions.totals(duck, day)
    print(f"\none day: {day_rows['sessions']:,} sessions, {day_rows['turns']:,} turns; one session: {one}")


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return same(a, b, rel_tol=1e-6)
    return a == b


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spans", type=int, default=100_000_000)
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dir", help="work directory, kept and reused (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument(
        "--repeat", type=int, default=REPEAT, help=f"runs per query: cold + best of the rest (default {REPEAT})"
    )
    p.add_argument("--history", type=int, nargs="+", metavar="DAYS", help="history lengths (e.g. 7 14): history.py")
    p.add_argument("--spans-per-day", type=int, default=143_000, help="with --history (default 143000)")
    p.add_argument("--small", help="with --history: a small trace directory (default: a kvtrace demo run)")
    p.add_argument(
        "--tile",
        type=int,
        default=0,
        metavar="DAYS",
        help="with --history: longer histories repeat this one's Parquet, shifted and with distinct ids, "
        "instead of generating their own (far slower: docs/clickhouse.md, Scale)",
    )
    p.add_argument(
        "--insert-batches",
        type=int,
        nargs="+",
        metavar="N",
        help="spans per insert (insert_cost.py)",
    )
    p.add_argument("--insert-spans", type=int, default=200_000, help="with --insert-batches (default 200000)")
    p.add_argument("--per-view", action="store_true", help="with --insert-batches: each view alone too")
    args = p.parse_args()
    if args.tile and any(d % args.tile for d in args.history or ()):
        p.error(f"--tile {args.tile}: every --history length must be a multiple of it")
    root = Path(args.dir or tempfile.mkdtemp(prefix="kvtrace-bench-ch-"))
    parquet, db = root / "parquet", root / "chdb"
    try:
        if args.insert_batches:
            from insert_cost import run_insert_cost

            batches = sorted(set(args.insert_batches))
            run_insert_cost(root, args.insert_spans, batches, args.threads, max(1, args.repeat), args.per_view)
        elif args.history:
            from history import demo_store, run_history

            small = Path(args.small) if args.small else demo_store(root)
            lengths, repeat = sorted(args.history), max(2, args.repeat)
            run_history(root, lengths, args.spans_per_day, args.threads, repeat, small, args.tile)
        else:
            if not parquet.exists():
                t = time.perf_counter()
                written = generate(parquet, args.spans, args.days, root)
                print(f"generated {written:,} spans in {time.perf_counter() - t:.1f} s", flush=True)
            bench(parquet, db, args.days, args.threads, max(2, args.repeat))
    finally:
        if not args.dir and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("KVTRACE_LOG_LEVEL", "WARNING")
    sys.exit(main())
