"""``bench_clickhouse.py --insert-batches 10000 100000``: what kvtrace's materialized views cost the
writer per span at the sizes the exporter inserts (issue #40).

The OTel Collector's ClickHouse exporter inserts each batch its batch processor hands it as one
``INSERT`` (``collectors/clickhouse.yaml``: up to 100,000 spans or 30 s; a fleet writing 10 M spans an
hour fills about 83,000 in 30 s).  Each materialized view runs once per insert: ClickHouse analyses
and plans its ``SELECT`` again for every block and writes a new part of its table, so part of what the
views cost is fixed per insert, and the bulk load of ``--history`` (a million spans a block) hides it.

``--insert-spans`` spans of a generated day (its own Parquet, ``parquet-insert`` in ``--dir``) are
staged in chDB once, then, per batch size, inserted ``N`` spans an ``INSERT`` (the exporter's
default settings, :func:`kvtrace.store.clickhouse.load.exporter_settings`) into a fresh exporter
table: plain (``raw``), with kvtrace's materialized tables (``shaped``, ``kvtrace clickhouse init``
on the empty table), and with ``--per-view`` each view alone, and ``floor``: the scan's table fed by a
view that writes the same spans' rows (kvtrace's agent, request and retention spans and every other
convention's, by name) without classifying them (times and ids, the other columns constants), so
``_kvtrace_scan`` less ``floor`` is what classifying costs and ``floor`` less ``raw`` what a second
table of those rows does.  The CPU counted (``getrusage``: chDB
runs in this process) runs until chDB has no merge left of the database, so the background merges
of the small parts are in it.  ``--repeat`` rounds alternate the variants; the median is printed:
CPU seconds per million spans, the ratio to ``raw``, and the CPU each insert adds over ``raw``.
"""

from __future__ import annotations

import resource
import statistics
import time
from pathlib import Path

from bench_clickhouse import generate

RAW, SHAPED, FLOOR = "raw", "shaped", "floor"
DB = "insert_cost"
SOURCE = f"{DB}.source"


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def stage(backend, parquet: Path, spans: int) -> tuple[int, str]:
    """The first ``spans`` spans of ``parquet`` in :data:`SOURCE`, numbered ``r`` (its sort key), so a
    batch is a range read; (how many there are, the exporter table's insertable columns, listed)."""
    from kvtrace.store.clickhouse import load
    from kvtrace.store.sql import CLICKHOUSE, literal

    backend.command(f"CREATE DATABASE IF NOT EXISTS {DB}")
    backend.command(f"DROP TABLE IF EXISTS {SOURCE}")
    backend.command(f"DROP TABLE IF EXISTS {DB}.shape")
    load.create_table(backend, f"{DB}.shape")
    cols = backend.query(
        f"SELECT name, type FROM system.columns WHERE database = '{DB}' AND table = 'shape' AND default_kind = ''"
    ).to_pylist()
    listed = ", ".join(f"`{r['name']}` {r['type']}" for r in cols)
    names = ", ".join(f"`{r['name']}`" for r in cols)
    backend.command(f"CREATE TABLE {SOURCE} (r UInt64, {listed}) ENGINE = MergeTree ORDER BY r")
    glob = literal(str(parquet / "**" / "*.parquet"), CLICKHOUSE)
    backend.command(
        f"INSERT INTO {SOURCE} (r, {names}) SELECT rowNumberInAllBlocks(), {names} "
        f"FROM (SELECT {names} FROM file({glob}, Parquet) ORDER BY Timestamp LIMIT {int(spans)})"
    )
    return backend.query(f"SELECT count() AS n FROM {SOURCE}").column("n")[0].as_py(), names


def floor_view(table: str) -> str:
    """A view into the scan's table writing a row per span the scan keeps by name (a superset: the
    scan also drops other conventions' spans without a classifying attribute), with no attribute read."""
    from kvtrace import semconv as sc
    from kvtrace.store.clickhouse import mviews_sql
    from kvtrace.store.sql import CLICKHOUSE, ident, literal
    from kvtrace.store.views.agents import OWN_NAMES

    names = ", ".join(literal(n, CLICKHOUSE) for n in OWN_NAMES)
    start, own = "toUnixTimestamp64Nano(Timestamp)", literal(sc.KVTRACE_SPAN_PREFIX, CLICKHOUSE)
    times = {"start_ns": start, "end_ns": f"{start} + toInt64(Duration)"}
    cols = ", ".join(
        f"{times.get(n, f'defaultValueOfTypeName({literal(ty, CLICKHOUSE)})')} AS {n}"
        for n, ty in mviews_sql.SCAN_STORED.items()
    )
    scan = mviews_sql.target(table, mviews_sql.SCAN_T)
    return (
        f"CREATE MATERIALIZED VIEW {ident(scan + mviews_sql.MV)} TO {ident(scan)} AS SELECT {cols}, TraceId, SpanId "
        f"FROM {ident(table)} WHERE SpanName IN ({names}) OR NOT startsWith(SpanName, {own})"
    )


def variant_statements(table: str, name: str) -> list[str]:
    """What makes ``table`` the variant ``name``: nothing (``raw``), ``kvtrace clickhouse init``'s
    statements (``shaped``), the tables and one view (a view's target suffix), or the tables and
    :func:`floor_view` (``floor``)."""
    from kvtrace.store.clickhouse import mviews_sql

    if name == RAW:
        return []
    statements = mviews_sql.ddl_statements(table, "bench", "bench")
    if name == SHAPED:
        return statements
    n = len(mviews_sql.TARGETS)
    if name == FLOOR:
        return statements[:n] + [floor_view(table)]
    return statements[:n] + [statements[n + mviews_sql.TARGETS.index(name)]]


def _quiet(backend, limit_s: float = 60.0) -> None:
    """Until no merge of :data:`DB` runs (polled: chDB's merges are its background threads')."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        n = backend.query(f"SELECT count() AS n FROM system.merges WHERE database = '{DB}'").column("n")[0].as_py()
        if not n:
            return
        time.sleep(0.05)


def insert_batches(backend, table: str, name: str, n: int, columns: str, batch: int, settings: str) -> float:
    """A fresh ``table`` made variant ``name``, then ``n`` staged spans (``columns``) ``batch`` an insert;
    CPU s."""
    from kvtrace.store.clickhouse import load, mviews

    backend.command(f"DROP TABLE IF EXISTS {table}")
    for sql in mviews.drop_statements(table):
        backend.command(sql)
    load.create_table(backend, table)
    for sql in variant_statements(table, name):
        backend.command(sql)
    _quiet(backend)
    cpu = _cpu()
    for lo in range(0, n, batch):
        backend.command(
            f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {SOURCE} WHERE r >= {lo} AND r < {lo + batch} "
            f"SETTINGS {settings}"
        )
    _quiet(backend)
    cpu = _cpu() - cpu
    held = backend.query(f"SELECT count() AS n FROM {table}").column("n")[0].as_py()
    if held != n:
        raise SystemExit(f"{name}, {batch} spans an insert: the table holds {held:,} spans of the {n:,} inserted")
    return cpu


def run_insert_cost(
    root: Path, spans: int, batches: list[int], threads: int, repeat: int, per_view: bool
) -> dict[tuple[int, str], float]:
    """The module doc's run; (batch, variant) -> median CPU s."""
    from kvtrace.store.clickhouse import load, mviews_sql
    from kvtrace.store.clickhouse.backend import ChdbBackend
    from kvtrace.store.sql import CLICKHOUSE, literal

    parquet = root / "parquet-insert"
    if not parquet.exists():
        generate(parquet, spans, 1, root / "work-insert")
    backend = ChdbBackend(str(root / "chdb"))
    n, columns = stage(backend, parquet, spans)
    exporter = {**load.exporter_settings(backend), "max_insert_threads": str(threads), "max_threads": str(threads)}
    settings = ", ".join(f"{k} = {literal(v, CLICKHOUSE)}" for k, v in exporter.items())
    names = [RAW, SHAPED, *((*mviews_sql.TARGETS, FLOOR) if per_view else ())]
    runs: dict[tuple[int, str], list[float]] = {}
    for _ in range(repeat):
        for batch in batches:
            for name in names:
                cpu = insert_batches(backend, f"{DB}.t", name, n, columns, batch, settings)
                runs.setdefault((batch, name), []).append(cpu)
    got = {k: statistics.median(v) for k, v in runs.items()}
    report(got, n, batches, names)
    return got


def report(got: dict, n: int, batches: list[int], names: list[str]) -> None:
    m = n / 1e6
    print(f"\ninsert cost: {n:,} spans, median of the rounds, CPU until no merge is left\n")
    print("| spans per insert | inserts | variant | CPU s / M spans | / raw | ms CPU added per insert |")
    print("|---:|---:|---|---:|---:|---:|")
    for batch in batches:
        inserts = -(-n // batch)
        raw = got[batch, RAW]
        for name in names:
            cpu = got[batch, name]
            added = "" if name == RAW else f"{(cpu - raw) / inserts * 1e3:.1f}"
            print(f"| {batch:,} | {inserts:,} | {name} | {cpu / m:.2f} | {cpu / raw:.2f} | {added} |")
