"""Retention analysis: bytes held on D over time, byte·seconds, expiries, blocks never read."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import retention
from kvtrace.analysis.filters import Filters
from kvtrace.store import connect
from kvtrace.testing.synth import SpanBuilder

MIB4 = 16 * 262_144  # one 16-token block of Qwen3-32B KV


@pytest.fixture
def builder():
    return SpanBuilder()


@pytest.fixture
def store(tmp_path, builder):
    b = builder
    for sid, engine, start, end, tokens, outcome in (
        ("a", "d0", 1000, 5000, 160, sc.RETENTION_READ),  # 10 blocks
        ("b", "d0", 3000, 9000, 320, sc.RETENTION_EXPIRED),  # 20 blocks, expired unread
        ("c", "d1", 2000, 4000, 48, sc.RETENTION_RELEASED),  # 3 blocks, freed unread
    ):
        ident = {sc.GEN_AI_REQUEST_ID: f"req-{sid}", sc.SESSION_ID: sid, sc.TURN_INDEX: 0}
        eng = b.engine(
            sc.ROLE_DECODE,
            engine,
            ident,
            start - 500,
            start,
            parent=None,
            prompt_tokens=tokens,
            cached_tokens=tokens,
            output_tokens=1,
        )
        b.retention(engine, ident, start, end, parent=eng, tokens=tokens, outcome=outcome)
    b.write(tmp_path)
    return connect(tmp_path)


def test_series_is_a_step_function_per_engine(store, builder):
    got = [(r["engine_id"], r["t"], r["bytes_held"], r["blocks_held"]) for r in retention.series(store).to_pylist()]
    ns = builder.ns
    assert got == [
        ("d0", ns(1000), 10 * MIB4, 10),
        ("d0", ns(3000), 30 * MIB4, 30),
        ("d0", ns(5000), 20 * MIB4, 20),
        ("d0", ns(9000), 0, 0),
        ("d1", ns(2000), 3 * MIB4, 3),
        ("d1", ns(4000), 0, 0),
    ]


def test_series_downsampling_keeps_peaks(store, builder):
    got = [(r["engine_id"], r["bytes_held"]) for r in retention.series(store, max_points=3).to_pylist()]
    # d0 buckets of 4 s from 1 s: [1,5) peak 30, [5,9) 20, [9,..) 0
    assert got == [("d0", 30 * MIB4), ("d0", 20 * MIB4), ("d0", 0), ("d1", 3 * MIB4), ("d1", 0)]


def test_summary_per_engine(store):
    rows = {r["engine_id"]: r for r in retention.summary(store)}
    d0 = rows["d0"]
    assert {
        k: d0[k]
        for k in (
            "retained",
            "read",
            "expired",
            "released",
            "blocks",
            "bytes",
            "blocks_never_read",
            "bytes_never_read",
            "peak_bytes",
        )
    } == {
        "retained": 2,
        "read": 1,
        "expired": 1,
        "released": 0,
        "blocks": 30,
        "bytes": 30 * MIB4,
        "blocks_never_read": 20,
        "bytes_never_read": 20 * MIB4,
        "peak_bytes": 30 * MIB4,
    }
    assert d0["byte_seconds"] == pytest.approx(10 * MIB4 * 4 + 20 * MIB4 * 6)
    assert d0["max_held_s"] == pytest.approx(6.0)
    assert rows["d1"]["released"] == 1 and rows["d1"]["blocks_never_read"] == 3
    tot = retention.totals(store)
    assert (tot["retained"], tot["expired"], tot["blocks_never_read"], tot["peak_bytes_sum"]) == (3, 1, 23, 33 * MIB4)


def test_expiries_and_filters(store, builder):
    exp = retention.expiries(store).to_pylist()
    assert [(r["session_id"], r["engine_id"], r["blocks"], r["held_s"]) for r in exp] == [("b", "d0", 20, 6.0)]
    assert retention.expiries(store, Filters(session_id="a")).num_rows == 0
    late = Filters(start_ns=builder.ns(6000))  # only b still held after 6 s
    assert [r["engine_id"] for r in retention.summary(store, late)] == ["d0"]
    assert retention.totals(store, late)["retained"] == 1


def test_empty(tmp_path):
    con = connect(tmp_path, allow_empty=True)
    assert retention.series(con).num_rows == 0
    assert retention.summary(con) == []
    assert retention.totals(con)["retained"] == 0
