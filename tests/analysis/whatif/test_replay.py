"""The turn_gaps view and the what-if replay on a hand-built store with known answers.

Two sessions through one P and one D (times in s from the store's start, time scale 1; the
proxy ran with --conversation-ttl 450 s, D with decoder_kv_blocks_ttl 480 s, threshold 64; P
computes 10 tokens per ms):

- A: turn 0 at 0 (nothing to reuse); D retains 1104 tokens at 1; turn 1 at 11 pulls 112 of them
  (gap 10 s); D retains 1408 at 12; turn 2 at 112 pulls 112 (gap 100 s); D retains 1600 at 113,
  released at shutdown (200).
- B: turn 0 at 5; D retains 544 at 6; turn 1 at 8 has 48 to pull: below threshold, D releases at
  8; D retains 576 at 9, released at shutdown.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis.common import rows
from kvtrace.analysis.whatif.replay import COLUMNS, load, recommend, replay, run
from kvtrace.cli import main
from kvtrace.store import connect as open_store
from kvtrace.testing.synth import SpanBuilder

from support.whatif_check import check_recorded_row
from support.whatif_store import BPT, END_S, POOL, TURNS, build


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("whatif")
    build(d)
    return d


def _held(intervals: list[tuple[float, float, int]]) -> tuple[float, float]:
    """(GiB·s, peak GiB) of (start s, end s, tokens) intervals, by brute force over event points."""
    gib_s = sum((e - s) * n * BPT for s, e, n in intervals) / 2**30
    points = sorted({s for s, _, _ in intervals})
    peak = max(sum(n * BPT for s, e, n in intervals if s <= p < e) for p in points)
    return gib_s, peak / 2**30


RECORDED_INTERVALS = [(r0, r1, n) for *_, r0, n, r1, _ in TURNS]


def test_turn_gaps_view(store):
    con = open_store(store)
    got = rows(
        con,
        "SELECT session_id, turn, engine_id, tokens, bytes, ttl_s, retention_outcome, next_turn, "
        "next_engine_id, gap_s, expiry_gap_s, entry_age_s, offer_ttl_s, offered, offer_reason, outcome, "
        "pulled_tokens, round(held_s, 3) AS held_s, time_scale FROM turn_gaps ORDER BY session_id, turn",
    )
    base = dict(engine_id="d0", ttl_s=480.0, next_engine_id="p0", offer_ttl_s=450.0, time_scale=1.0)
    assert got == [
        dict(
            session_id="A",
            turn=0,
            tokens=1104,
            bytes=1104 * BPT,
            retention_outcome="read",
            next_turn=1,
            gap_s=10.0,
            expiry_gap_s=10.0,
            entry_age_s=9.9,
            offered=True,
            offer_reason="offered",
            outcome="pulled",
            pulled_tokens=112,
            held_s=10.005,
            **base,
        ),
        dict(
            session_id="A",
            turn=1,
            tokens=1408,
            bytes=1408 * BPT,
            retention_outcome="read",
            next_turn=2,
            gap_s=100.0,
            expiry_gap_s=100.0,
            entry_age_s=99.9,
            offered=True,
            offer_reason="offered",
            outcome="pulled",
            pulled_tokens=112,
            held_s=100.004,
            **base,
        ),
        dict(
            session_id="A",
            turn=2,
            tokens=1600,
            bytes=1600 * BPT,
            retention_outcome="released",
            next_turn=None,
            gap_s=None,
            expiry_gap_s=None,
            entry_age_s=None,
            offered=None,
            offer_reason=None,
            outcome=None,
            pulled_tokens=None,
            held_s=87.0,
            **{**base, "next_engine_id": None, "offer_ttl_s": None},
        ),
        dict(
            session_id="B",
            turn=0,
            tokens=544,
            bytes=544 * BPT,
            retention_outcome="released",
            next_turn=1,
            gap_s=2.0,
            expiry_gap_s=2.0,
            entry_age_s=1.9,
            offered=True,
            offer_reason="offered",
            outcome="below_threshold",
            pulled_tokens=0,
            held_s=2.0,
            **base,
        ),
        dict(
            session_id="B",
            turn=1,
            tokens=576,
            bytes=576 * BPT,
            retention_outcome="released",
            next_turn=None,
            gap_s=None,
            expiry_gap_s=None,
            entry_age_s=None,
            offered=None,
            offer_reason=None,
            outcome=None,
            pulled_tokens=None,
            held_s=191.0,
            **{**base, "next_engine_id": None, "offer_ttl_s": None},
        ),
    ]


def test_recorded_setting_gives_back_the_recorded_run(store):
    rec = load(open_store(store))
    assert (rec.ttl_s, rec.threshold, rec.offer_ttl_s, rec.offer_margin_s, rec.time_scale) == (
        480.0,
        64,
        450.0,
        30.0,
        1.0,
    )
    assert rec.pool_bytes == {"d0": POOL}
    assert rec.calibration.prefill_tokens_per_ms[None] == pytest.approx(10.0)
    r = replay(rec, 480.0, 64)
    gib_s, peak = _held(RECORDED_INTERVALS)
    assert r.row == {
        "ttl_s": 480.0,
        "threshold": 64,
        "decisions": 5,
        "pulled": 2,
        "expired": 0,
        "below_threshold": 1,
        "no_remote": 2,
        "local_hit": 0,
        "failed": 0,
        "unverified": 0,
        "pulled_tokens": 224,
        "recomputed_tokens": 1000 + 196 + 92 + 500 + 64,
        "gib_s_held": pytest.approx(gib_s, rel=1e-12),
        "peak_gib_held": pytest.approx(peak, rel=1e-12),
        "ttft_mean_ms": pytest.approx((200 + 60 + 50 + 80 + 30) / 5),
        "ttft_p90_ms": pytest.approx(152.0),
        "recorded": True,
    }
    assert r.failures == 0
    check_recorded_row(store)


def test_shorter_ttl_drops_the_long_gap(store):
    """TTL 60: the proxy offers entries up to 30 s old, so A's turn 2 (100 s later) recomputes; D
    holds A's turn-1 blocks until the TTL (12 + 60) and A's last blocks until 113 + 60."""
    r = replay(load(open_store(store)), 60.0, 64)
    gib_s, peak = _held(
        [(1.0, 11.005, 1104), (12.0, 72.0, 1408), (113.0, 173.0, 1600), (6.0, 8.0, 544), (9.0, 69.0, 576)]
    )
    ttft_a2 = 50.0 + (204 - 92) / 10.0 - 4.0  # 112 more tokens at 10/ms, no transfer
    assert r.row == {
        "ttl_s": 60.0,
        "threshold": 64,
        "decisions": 5,
        "pulled": 1,
        "expired": 0,
        "below_threshold": 1,
        "no_remote": 3,
        "local_hit": 0,
        "failed": 0,
        "unverified": 0,
        "pulled_tokens": 112,
        "recomputed_tokens": 1000 + 196 + 204 + 500 + 64,
        "gib_s_held": pytest.approx(gib_s, rel=1e-9),
        "peak_gib_held": pytest.approx(peak, rel=1e-12),
        "ttft_mean_ms": pytest.approx((200 + 60 + ttft_a2 + 80 + 30) / 5),
        "ttft_p90_ms": pytest.approx(152.0),
        "recorded": False,
    }
    assert [sc.OUTCOMES[c] for c in r.codes] == ["no_remote", "no_remote", "below_threshold", "pulled", "no_remote"]


def test_ttl_zero_holds_nothing_and_higher_threshold_recomputes(store):
    rec = load(open_store(store))
    zero = replay(rec, 0.0, 64).row
    assert (zero["pulled"], zero["no_remote"], zero["below_threshold"], zero["gib_s_held"], zero["peak_gib_held"]) == (
        0,
        5,
        0,
        0.0,
        0.0,
    )
    high = replay(rec, 480.0, 128)
    assert (high.row["pulled"], high.row["below_threshold"], high.row["no_remote"]) == (0, 3, 2)
    # A's blocks are released when turn 1 and turn 2 decline them (at 11 and 112)
    gib_s, _ = _held([(1.0, 11.0, 1104), (12.0, 112.0, 1408), (113.0, END_S, 1600), (6.0, 8.0, 544), (9.0, END_S, 576)])
    assert high.row["gib_s_held"] == pytest.approx(gib_s, rel=1e-9)


def test_offer_of_dropped_blocks_is_an_expired_failure(store):
    """No offer margin: at TTL 104 the proxy still offers A's turn-2 request blocks 99.9 s old, but
    they have 104 - 100 = 4 s left: vLLM declines the read (5 s margin) and, under
    kv_load_failure_policy=fail, the request fails: no TTFT; D keeps the blocks until they expire."""
    rec = load(open_store(store))
    r = replay(rec, 104.0, 64, offer_margin_s=0.0)
    assert (r.row["pulled"], r.row["expired"], r.failures) == (1, 1, 1)
    assert r.row["ttft_mean_ms"] == pytest.approx((200 + 60 + 80 + 30) / 4)
    assert math.isnan(r.ttft_ms[4])  # decisions in start order: A0, B0, B1, A1, A2
    gib_s, _ = _held(
        [(1.0, 11.005, 1104), (12.0, 116.0, 1408), (113.0, END_S, 1600), (6.0, 8.0, 544), (9.0, 113.0, 576)]
    )
    assert r.row["gib_s_held"] == pytest.approx(gib_s, rel=1e-9)
    # 6 s left: the read goes ahead
    assert replay(rec, 106.0, 64, offer_margin_s=0.0).row["pulled"] == 2


def test_decode_workers_with_different_ttls(store, tmp_path, capsys):
    """Session B on a second D whose TTL is 10 s: the recorded setting keeps each D's own TTL (its
    row, ttl_s None, gives back the recorded run); a row at one TTL applies it to both Ds, so at
    480 s it is the single-D store's row (B's last blocks are then held to the end, not 10 s) but
    for the peak, which is per D."""
    build(tmp_path / "mixed", b_ttl=10.0)
    rec = load(open_store(tmp_path / "mixed"))
    assert (rec.ttls, rec.ttl_s, rec.mixed, rec.d_engines) == ([10.0, 480.0], 480.0, True, ["d0", "d1"])
    mine = replay(rec, None, 64)
    gib_s, peak = _held(
        [(1.0, 11.005, 1104), (12.0, 112.004, 1408), (113.0, END_S, 1600), (6.0, 8.0, 544), (9.0, 19.0, 576)]
    )
    assert mine.row["recorded"] and mine.row["ttl_s"] is None
    assert (mine.row["gib_s_held"], mine.row["pulled"], mine.row["below_threshold"]) == (
        pytest.approx(gib_s, rel=1e-12),
        2,
        1,
    )
    assert mine.peak_bytes == {"d0": 1600 * BPT, "d1": 576 * BPT}
    check_recorded_row(tmp_path / "mixed")
    single = replay(load(open_store(store)), 480.0, 64).row
    at_480 = replay(rec, 480.0, 64)
    assert at_480.row == {**single, "recorded": False, "peak_gib_held": 1600 * BPT / 2**30}  # B's blocks on d1
    assert at_480.peak_bytes == {"d0": 1600 * BPT, "d1": 576 * BPT}
    assert main(["whatif", "--traces", str(tmp_path / "mixed"), "--ttl", "480", "--threshold", "64"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\| each D's own +\| 64 ", out, re.M), out
    assert "recorded (TTL each D its own: 10, 480 s, threshold 64)" in out


def test_time_scale_converts_to_model_seconds(tmp_path):
    """A simulator run compressed 4x: the same replay in model seconds."""
    build(tmp_path, time_scale=4.0)
    fast = load(open_store(tmp_path))
    assert (fast.ttl_s, fast.offer_ttl_s, fast.time_scale) == (480.0, 450.0, 4.0)
    r = replay(fast, 60.0, 64)
    assert [sc.OUTCOMES[c] for c in r.codes] == ["no_remote", "no_remote", "below_threshold", "pulled", "no_remote"]
    base = replay(load(open_store(tmp_path)), 480.0, 64).row
    assert base["gib_s_held"] == pytest.approx(4 * _held(RECORDED_INTERVALS)[0], rel=1e-12)
    assert base["ttft_mean_ms"] == pytest.approx(4 * (200 + 60 + 50 + 80 + 30) / 5)


def test_grid_and_recommendation(store):
    rec, results = run(open_store(store), ttls=(0, 60, 480), thresholds=(32, 128), workers=2)
    settings = [(r.row["ttl_s"], r.row["threshold"]) for r in results]
    assert settings == [(0.0, 32), (0.0, 128), (60.0, 32), (60.0, 128), (480.0, 32), (480.0, 64), (480.0, 128)]
    assert [r.row["recorded"] for r in results].count(True) == 1
    # both transfers moved 112 tokens: no overhead can be fitted, so pulling always pays (break-even
    # 0 tokens) and the smallest threshold is recommended
    assert rec.calibration.break_even_tokens == 0
    rc = recommend(rec, results)
    assert rc["threshold"] == 32
    pool = [r.row for r in results if r.row["threshold"] == rc["threshold"]]
    best = min(r["ttft_mean_ms"] for r in pool)
    assert rc["row"]["ttft_mean_ms"] <= best * 1.05
    assert rc["ttl_s"] == min(r["ttl_s"] for r in pool if r["ttft_mean_ms"] <= best * 1.05)
    tight = recommend(rec, results, budget_gib=1e-9)
    assert tight["row"]["peak_gib_held"] == 0.0 and tight["ttl_s"] == 0.0


def test_cli_json_csv_and_help(store, tmp_path, capsys):
    assert main(["whatif", "--traces", str(store), "--ttl", "60,480", "--threshold", "64", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert [list(r) for r in data] == [list(COLUMNS)] * 2
    assert [(r["ttl_s"], r["threshold"], r["recorded"]) for r in data] == [(60.0, 64, False), (480.0, 64, True)]
    assert "Recommendation: decoder_kv_blocks_ttl" in err and "kvtrace.engine.prefill spans" in err
    csv_path = tmp_path / "w.csv"
    assert (
        main(
            [
                "whatif",
                "--traces",
                str(store),
                "--ttl",
                "60",
                "--threshold",
                "64",
                "--format",
                "csv",
                "-o",
                str(csv_path),
            ]
        )
        == 0
    )
    lines = csv_path.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and len(lines) == 3  # 60/64 and the recorded 480/64
    assert lines[2].endswith(",true")
    with pytest.raises(SystemExit):
        main(["whatif", "--help"])
    help_text = capsys.readouterr().out
    for column in COLUMNS:
        assert re.search(rf"\n\s+{column}\s", help_text), column


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ttl", "a,b"], "invalid list value"),
        (["--ttl", "-5"], "invalid list value"),
        (["--budget-gib", "0"], "--budget-gib must be > 0"),
        (["--offer-margin", "-1"], "--offer-margin must be >= 0"),
    ],
)
def test_cli_rejects_bad_arguments(store, capsys, argv, message):
    try:
        code = main(["whatif", "--traces", str(store), *argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_one_line_errors_for_unusable_traces(tmp_path, capsys):
    assert main(["whatif", "--traces", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.strip().endswith("does not exist")
    b = SpanBuilder()
    b.span(sc.SPAN_AGENT_TURN, 0, 1, attrs={sc.SESSION_ID: "s", sc.TURN_INDEX: 0})
    b.write(tmp_path / "agent-only")
    assert main(["whatif", "--traces", str(tmp_path / "agent-only")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no d2p decisions" in err


def test_enforce_replays_the_verified_prefix_against_each_threshold(tmp_path):
    build(tmp_path, unverified=1000)
    rec = load(open_store(tmp_path))
    a1 = 1  # decisions in start order: A-0, B-0, B-1, A-1, A-2
    assert [sc.OUTCOMES[c] for c in replay(rec, 480.0, 64).codes] == [
        "no_remote",
        "no_remote",
        "below_threshold",
        "unverified",
        "pulled",
    ]
    low = replay(rec, 480.0, 8)  # the 8 verified tokens clear a threshold of 8: only they are pulled
    assert sc.OUTCOMES[low.codes[3]] == sc.OUTCOME_PULLED and low.row["pulled_tokens"] == 8 + 48 + 112
    assert replay(rec, 480.0, 64).row["unverified"] == a1
    assert replay(rec, 480.0, 128).row["unverified"] == 0  # 112 offered < 128: below threshold either way
