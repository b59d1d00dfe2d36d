"""Per-file scan indexes (kvtrace.store.scan_index): every view reads the same through them as
without them, on stores of kvtrace's own spans and of other conventions, whole or bounded; a
stale index is never read; read-only connections build none; a failed build falls back to the
file itself; indexes whose file is gone are swept; a keeper (what ``kvtrace dashboard`` runs
while it serves) indexes the files written since."""

from __future__ import annotations

import glob
import logging
import os
import time

import pyarrow.parquet as pq
import pytest

from kvtrace.analysis import sessions
from kvtrace.analysis.filters import Filters
from kvtrace.cli import main as kvtrace_main
from kvtrace.store import connect, files, lookup, scan_index
from kvtrace.store.reader import build_indexes, index_keeper, refresh, trace_files
from kvtrace.store.views import VIEWS
from kvtrace.store.views.agents import SCAN
from kvtrace.testing.stores import sample_store

from support import agent_conventions, sidecars


def _own(root) -> None:
    sample_store(root, sessions=3, turns=3)


def _foreign(root) -> None:
    agent_conventions.build(root)


STORES = {"kvtrace's own spans": _own, "other conventions' spans": _foreign}


def _every_view(con, *, scan_ids: bool = False) -> dict[str, list]:
    """Every view's rows; the scan's without its ids unless ``scan_ids`` (a store indexed whole whose
    joins change nothing reads the scan without them: the views built on it are the same)."""

    def select(name: str) -> str:
        return (
            f"SELECT * EXCLUDE (trace_id, span_id, request_id) FROM {name}"
            if name == SCAN and not scan_ids
            else (f"SELECT * FROM {name}")
        )

    return {v.name: sorted(map(repr, con.execute(select(v.name)).fetchall())) for v in VIEWS}


def _indexes(root, suffix: str = scan_index.SUFFIX) -> list[str]:
    return sorted(glob.glob(os.path.join(root, "**", scan_index.INDEX_DIR, "*" + suffix), recursive=True))


def _tamper(index: str, session_id: str) -> None:
    """Rewrite an index with every session id replaced (what only a read of the index can show)."""
    sidecars.set_column(index, "session_id", session_id)


def _split_store(tmp_path, parts: int):
    """A store directory and ``parts`` tables: one foreign-convention file split, traces across them."""
    _foreign(tmp_path / "one")
    [path] = trace_files(tmp_path / "one")
    t = pq.read_table(path)
    size = -(-t.num_rows // parts)
    return tmp_path / "store", [t.slice(i * size, size) for i in range(parts)]


def _write(root, i: int, table) -> str:
    part = root / "date=2026-01-01" / "hour=00"
    os.makedirs(part, exist_ok=True)
    path = str(part / f"synth-b0000000{i + 1}.parquet")
    pq.write_table(table, path)
    return path


@pytest.fixture(params=sorted(STORES))
def store(request, tmp_path):
    STORES[request.param](tmp_path)
    return tmp_path


def test_every_view_reads_the_same_through_the_indexes(store):
    want = _every_view(connect(store, scan_index=False))
    assert _indexes(store) == []  # scan_index=False built none
    built = build_indexes(store, min_bytes=0)
    assert len(built) == len(trace_files(store)) and _indexes(store) == sorted(built)
    for suffix in lookup.SUFFIXES:  # each index has its lookups, under the same key
        assert [p[: -len(suffix)] for p in _indexes(store, suffix)] == [p[: -len(scan_index.SUFFIX)] for p in built]
    assert _every_view(connect(store)) == want


def test_the_scan_keeps_its_ids_where_the_joins_need_them(tmp_path):
    _foreign(tmp_path / "foreign")
    _own(tmp_path / "own")
    for root in (tmp_path / "foreign", tmp_path / "own"):
        build_indexes(root, min_bytes=0)
    foreign = tmp_path / "foreign"
    assert _every_view(connect(foreign), scan_ids=True) == _every_view(
        connect(foreign, scan_index=False), scan_ids=True
    )
    ids = f"SELECT count(trace_id), count(request_id), count(*) FROM {SCAN}"
    [(traces, requests, rows)] = connect(tmp_path / "own", scan_index=False).execute(ids).fetchall()
    assert traces > 0 and requests > 0 and rows > traces
    # kvtrace's own spans, every call with its TTFT: no join changes a row, so no id is read
    assert connect(tmp_path / "own").execute(ids).fetchall() == [(0, 0, rows)]


def test_the_indexes_are_what_the_breakdown_reads(store):
    build_indexes(store, min_bytes=0)
    for index in _indexes(store):
        _tamper(index, "from-the-index")
    got = {r["session_id"] for r in sessions.breakdown(connect(store), limit=100).to_pylist()}
    assert got == {"from-the-index"}
    assert "from-the-index" not in str(_every_view(connect(store, scan_index=False)))


def test_a_store_partly_indexed_reads_the_rest_raw(tmp_path):
    root, tables = _split_store(tmp_path, 3)
    for i, table in enumerate(tables):
        _write(root, i, table)
    want = _every_view(connect(root, scan_index=False))
    [first, *_] = trace_files(root)
    assert scan_index.build([first], min_bytes=0) == [scan_index.index_path(first)]
    assert len(_indexes(root)) == 1
    assert _every_view(connect(root, read_only=True)) == want


def test_a_bounded_drill_down_reads_the_same(store):
    raw = connect(store, scan_index=False)
    build_indexes(store, min_bytes=0)
    con = connect(store)
    ids = [r["session_id"] for r in sessions.breakdown(raw, limit=100).to_pylist()]
    assert ids
    for sid in ids:
        want = sessions.turns(raw, Filters(session_id=sid)).to_pylist()
        assert want and sessions.turns(con, Filters(session_id=sid)).to_pylist() == want


def test_a_stale_index_is_ignored_then_swept(tmp_path):
    _own(tmp_path)
    want = _every_view(connect(tmp_path, scan_index=False))
    [old] = build_indexes(tmp_path, min_bytes=0)
    _tamper(old, "stale")
    [path] = trace_files(tmp_path)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the file "changed"
    assert scan_index.current(path) is None
    assert _every_view(connect(tmp_path, read_only=True)) == want  # read-only: the stale one stays, unread
    assert os.path.exists(old)
    build_indexes(tmp_path, min_bytes=0)  # builds the current index, sweeps the stale one
    assert _indexes(tmp_path) == [scan_index.index_path(path)] != [old]


def test_read_only_connections_build_no_index(tmp_path):
    _own(tmp_path)
    connect(tmp_path, read_only=True)
    assert _indexes(tmp_path) == []
    connect(tmp_path)  # the sample store is small: under the default size limit
    assert _indexes(tmp_path) == []


def test_the_size_limit_comes_from_the_environment(tmp_path, monkeypatch):
    _own(tmp_path)
    [path] = trace_files(tmp_path)
    monkeypatch.setenv("KVTRACE_SCAN_INDEX_MIN_BYTES", str(os.path.getsize(path) + 1))
    connect(tmp_path)
    assert _indexes(tmp_path) == []
    monkeypatch.setenv("KVTRACE_SCAN_INDEX_MIN_BYTES", str(os.path.getsize(path)))
    connect(tmp_path)
    assert _indexes(tmp_path) == [scan_index.index_path(path)]
    assert build_indexes(tmp_path, min_bytes=-1) == []


def test_a_failed_build_is_logged_once_and_the_file_read_whole(tmp_path, caplog):
    _own(tmp_path)
    want = _every_view(connect(tmp_path, scan_index=False))
    [path] = trace_files(tmp_path)
    with open(os.path.join(os.path.dirname(path), scan_index.INDEX_DIR), "w"):  # a file where the dir goes
        pass
    with caplog.at_level(logging.WARNING, logger="kvtrace.store.scan_index"):
        assert build_indexes(tmp_path, min_bytes=0) == []
        assert build_indexes(tmp_path, min_bytes=0) == []
    [record] = caplog.records
    assert record.getMessage().startswith(f"kvtrace: no scan index for 1 trace file (read whole instead): {path}: ")
    assert _every_view(connect(tmp_path)) == want
    assert [os.path.basename(p) for p in files.list_files(tmp_path)] == [os.path.basename(path)]


def test_files_that_cannot_be_indexed_are_reported_in_one_line(tmp_path, caplog):
    root, tables = _split_store(tmp_path, 3)
    paths = [_write(root, i, table) for i, table in enumerate(tables)]
    with open(os.path.join(os.path.dirname(paths[0]), scan_index.INDEX_DIR), "w"):  # as a read-only mount fails
        pass
    with caplog.at_level(logging.WARNING, logger="kvtrace.store.scan_index"):
        assert build_indexes(root, min_bytes=0) == []
    [record] = caplog.records
    first = trace_files(root)[0]
    assert record.getMessage().startswith(f"kvtrace: no scan index for 3 trace files (read whole instead): {first}: ")


def test_indexes_of_files_gone_and_abandoned_writes_are_swept(tmp_path):
    _own(tmp_path)
    [index] = build_indexes(tmp_path, min_bytes=0)
    index_dir = os.path.dirname(index)
    abandoned = os.path.join(index_dir, ".x.kvscan.123.abcd.tmp")
    recent = os.path.join(index_dir, ".y.kvscan.124.abcd.tmp")
    for p in (abandoned, recent):
        open(p, "w").close()
    hour_ago = time.time() - scan_index.TMP_MAX_AGE_S - 1
    os.utime(abandoned, (hour_ago, hour_ago))
    [path] = trace_files(tmp_path)
    os.unlink(path)
    assert scan_index.sweep(os.path.dirname(path)) == len(scan_index.SIDECARS) + 1  # the index, its lookups
    assert sorted(os.listdir(index_dir)) == [os.path.basename(recent)]  # one being written now stays


def test_plain_globs_and_listings_never_see_an_index(tmp_path):
    _own(tmp_path)
    [index] = build_indexes(tmp_path, min_bytes=0)
    [path] = files.list_files(tmp_path)
    assert glob.glob(os.path.join(tmp_path, "**", "*.parquet"), recursive=True) == [path]
    assert not index.endswith(".parquet") and os.path.basename(os.path.dirname(index)).startswith(".")


def test_kvtrace_compact_builds_the_indexes(tmp_path, capsys, monkeypatch):
    _own(tmp_path)
    monkeypatch.setenv("KVTRACE_SCAN_INDEX_MIN_BYTES", "0")
    assert kvtrace_main(["compact", "--traces", str(tmp_path)]) == 0
    assert capsys.readouterr().out == (
        f"kvtrace compact: {tmp_path}: deleted 0 superseded or abandoned files; 1 Parquet files remain; "
        "1 scan index built\n"
    )
    [path] = trace_files(tmp_path)
    assert _indexes(tmp_path) == [scan_index.index_path(path)]


def test_a_keeper_indexes_the_files_written_while_it_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTRACE_SCAN_INDEX_MIN_BYTES", "0")
    root, (first, second) = _split_store(tmp_path, 2)
    one = _write(root, 0, first)
    con = connect(root, read_only=True)  # the dashboard's: builds nothing
    keeper = index_keeper([str(root)], interval=0.01)
    keeper.start()
    try:
        assert keeper.wait_passes(1, timeout=60)
        assert _indexes(root) == [scan_index.index_path(one)]
        two = _write(root, 1, second)
        # a pass that began before the write may have listed the directory without it
        assert keeper.wait_passes(keeper.passes + 2, timeout=60)
        assert _indexes(root) == sorted([scan_index.index_path(one), scan_index.index_path(two)])
    finally:
        keeper.stop()
        keeper.join(60)
    assert not keeper.is_alive()
    for index in _indexes(root):
        _tamper(index, "from-the-index")
    refresh(con)  # the dashboard's Refresh
    assert {r["session_id"] for r in sessions.breakdown(con, limit=100).to_pylist()} == {"from-the-index"}


def test_a_keeper_pass_that_fails_is_logged_once_and_retried(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("KVTRACE_SCAN_INDEX_MIN_BYTES", "0")
    _own(tmp_path)
    [path] = trace_files(tmp_path)
    calls = []

    def listing(directory: str) -> list[str]:
        calls.append(directory)
        if len(calls) < 3:
            raise OSError(f"{directory}: the store is being rewritten")
        return trace_files(directory)

    keeper = scan_index.Keeper([str(tmp_path)], listing, interval=60)
    with caplog.at_level(logging.WARNING, logger="kvtrace.store.scan_index"):
        for _ in range(3):
            keeper.run_once()
    [record] = caplog.records
    assert record.getMessage() == (
        f"kvtrace: building scan indexes failed (retried every 60.0 s): {tmp_path}: the store is being rewritten"
    )
    assert keeper.passes == 3 and calls == [str(tmp_path)] * 3
    assert _indexes(tmp_path) == [scan_index.index_path(path)]


def test_a_keeper_with_no_interval_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTRACE_SCAN_INDEX_MIN_BYTES", "0")
    monkeypatch.setenv("KVTRACE_SCAN_INDEX_SECONDS", "0")
    _own(tmp_path)
    keeper = index_keeper([str(tmp_path)])
    assert keeper.interval == 0.0
    keeper.start()
    keeper.join(60)
    assert not keeper.is_alive() and keeper.passes == 0 and _indexes(tmp_path) == []
