"""Per-file partials of the KV views (kvtrace.store.partials): the views read them where a file has
them and give the same rows as from the raw spans, whole or bounded, with part of the store
indexed, and when a trace's engine spans (its substrate) are in another file than its proxy span."""

from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from kvtrace import semconv as sc
from kvtrace.store import bounds, connect, partials, scan_index
from kvtrace.store.reader import build_indexes, trace_files
from kvtrace.testing.stores import sample_store

from support import sidecars


def _rows(con) -> dict[str, list[str]]:
    return {v: sorted(map(repr, con.execute(f"SELECT * FROM {v}").fetchall())) for v in partials.VIEWS}


def _partials(root, suffix: str) -> list[str]:
    return sorted(glob.glob(os.path.join(root, "**", scan_index.INDEX_DIR, "*" + suffix), recursive=True))


def _by_name(root, names_per_file: list[set[str] | None]) -> list[str]:
    """A store of the sample's spans split into files by span name (None: every name not listed)."""
    sample_store(root / "one", sessions=3, turns=3)
    [path] = trace_files(root / "one")
    table = pq.read_table(path)
    listed = set().union(*(n for n in names_per_file if n))
    part = root / "store" / "date=2026-01-01" / "hour=00"
    os.makedirs(part)
    for i, names in enumerate(names_per_file):
        keep = (
            pc.is_in(table["SpanName"], pa.array(sorted(names)))
            if names
            else pc.invert(pc.is_in(table["SpanName"], pa.array(sorted(listed))))
        )
        pq.write_table(table.filter(keep), str(part / f"synth-b0000000{i + 1}.parquet"))
    return trace_files(root / "store")


ENGINE = {sc.SPAN_ENGINE_PREFILL, sc.SPAN_ENGINE_DECODE, sc.SPAN_KV_DECISION, sc.SPAN_KV_TRANSFER}


@pytest.fixture
def split(tmp_path):
    """The proxy's and agent's spans in one file, the engines' (which carry the substrate) in
    another, retention in a third: every trace crosses files."""
    files = _by_name(tmp_path, [None, ENGINE, {sc.SPAN_KV_RETENTION}])
    return tmp_path / "store", files


def test_the_views_read_the_partials_and_give_the_raw_rows(split):
    root, files = split
    want = _rows(connect(root, scan_index=False))
    assert all(want[v] for v in partials.VIEWS)
    build_indexes(root, min_bytes=0)
    for p in partials.PARTIALS:  # one per file, under the index's key
        stems = [x[: -len(p.suffix)] for x in _partials(root, p.suffix)]
        assert stems == [scan_index.index_path(f)[: -len(scan_index.SUFFIX)] for f in sorted(files)]
    con = connect(root, read_only=True)
    for view in partials.VIEWS:
        [(sql,)] = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = $v", {"v": view}).fetchall()
        assert "kvtrace_part_" in sql and "SpanAttributes" not in sql, view
    assert _rows(con) == want


def test_requests_name_the_substrate_of_engine_spans_in_another_file(split):
    root, _ = split
    build_indexes(root, min_bytes=0)
    rows = connect(root).execute("SELECT substrate, count(*) FROM requests GROUP BY ALL").fetchall()
    assert rows == [(sc.SUBSTRATE_SIM, 9)]  # no proxy span carries one: each came from the other file


def test_a_file_without_its_partials_is_read_raw(split):
    root, files = split
    want = _rows(connect(root, scan_index=False))
    build_indexes(root, min_bytes=0)
    engine_file = sorted(files)[1]
    [dropped] = [p for p in _partials(root, ".kvp_dec") if os.path.basename(engine_file) in p]
    os.unlink(dropped)  # one partial gone: that file is read whole, the others through theirs
    con = connect(root, read_only=True)
    [(sql,)] = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'kv_decisions'").fetchall()
    assert "kvtrace_part_dec" in sql and "SpanAttributes" in sql
    assert _rows(con) == want


def test_what_the_partials_hold_is_what_the_views_show(split):
    root, _ = split
    build_indexes(root, min_bytes=0)
    for path in _partials(root, ".kvp_dec"):
        sidecars.set_column(path, "outcome", "from-the-partial")
    outcomes = connect(root, read_only=True).execute("SELECT DISTINCT outcome FROM kv_decisions").fetchall()
    assert outcomes == [("from-the-partial",)]


@pytest.mark.parametrize("indexed", ["all", "some"])
def test_a_bounded_cursor_reads_the_same_rows(split, indexed):
    root, files = split
    raw = connect(root, scan_index=False)
    [(lo, hi)] = raw.execute("SELECT min(start_ns), max(start_ns) FROM spans").fetchall()
    middle = (lo + (hi - lo) // 3, lo + 2 * (hi - lo) // 3)  # cuts traces: the bounds filter rows
    want = _rows(bounds.bounded(raw, *middle))
    assert 0 < len(want["kv_decisions"]) < len(_rows(raw)["kv_decisions"])
    scan_index.build(files if indexed == "all" else sorted(files)[1:], min_bytes=0)
    assert _rows(bounds.bounded(connect(root, read_only=True), *middle)) == want
