"""The continuity view and its summary, and KV held per session / turn (GiB·s), on hand-built
traces with known answers."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis import continuity, sessions
from kvtrace.analysis.filters import Filters
from kvtrace.store import connect
from kvtrace.testing.synth import SpanBuilder

GIB = 2**30
BPB = 16 * 262_144  # bytes per 16-token block (qwen3-32b)


def _attrs(cont, at=None, lost=None, source=sc.SOURCE_CONVERSATION_ID):
    out = {sc.SESSION_SOURCE: source, sc.SESSION_CONTINUITY: cont}
    if at is not None:
        out[sc.SESSION_DIVERGED_AT] = at
    if lost is not None:
        out[sc.SESSION_REUSABLE_TOKENS_LOST] = lost
    return out


@pytest.fixture
def store(tmp_path):
    b = SpanBuilder()
    # "strip": three turns, the last two diverged (the client dropped reasoning); D's blocks of each
    # turn held 1 s (read) or 3 s (never read)
    s = b.session("strip", 0, 10_000, scenario="reasoning-strip")
    b.call(
        "strip",
        0,
        "s0",
        0,
        parent=s,
        prompt=1000,
        outcome=sc.OUTCOME_NO_REMOTE,
        retention_end_ms=1310.0,
        request_attrs=_attrs(sc.CONTINUITY_NEW),
        output_tokens=24,
    )
    b.call(
        "strip",
        1,
        "s1",
        2000,
        parent=s,
        prompt=1200,
        local_hit=992,
        outcome=sc.OUTCOME_NO_REMOTE,
        prefill_ms=80.0,
        retention_end_ms=5310.0,
        retention_outcome=sc.RETENTION_EXPIRED,
        output_tokens=24,
        request_attrs=_attrs(sc.CONTINUITY_DIVERGED, 2, 31),
    )
    b.call(
        "strip",
        2,
        "s2",
        4000,
        parent=s,
        prompt=1400,
        local_hit=1184,
        outcome=sc.OUTCOME_NO_REMOTE,
        prefill_ms=90.0,
        request_attrs=_attrs(sc.CONTINUITY_DIVERGED, 4, 23),
    )
    # "keep": two turns, the second extends and pulls
    k = b.session("keep", 20_000, 30_000, scenario="coding-agent")
    b.call(
        "keep",
        0,
        "k0",
        20_000,
        parent=k,
        prompt=500,
        outcome=sc.OUTCOME_NO_REMOTE,
        retention_end_ms=21_310.0,
        request_attrs=_attrs(sc.CONTINUITY_NEW),
        output_tokens=12,
    )
    b.call(
        "keep",
        1,
        "k1",
        22_000,
        parent=k,
        prompt=700,
        remote=511,
        pulled=511,
        outcome=sc.OUTCOME_PULLED,
        request_attrs=_attrs(sc.CONTINUITY_EXTENDS),
    )
    # a proxy request with prefix matching off: no continuity, not a row
    b.request("other", 0, "o0", 40_000, 40_100, 10.0)
    b.write(tmp_path)
    return connect(tmp_path)


def test_continuity_rows(store):
    got = store.sql(
        "SELECT session_id, turn, agent_name, scenario, source, continuity, diverged_at, "
        "reusable_tokens_lost, offer_reason, outcome, prompt_tokens, local_hit_tokens, pulled_tokens, "
        "recomputed_tokens, round(prefill_ms, 3), ttft_ms FROM continuity ORDER BY session_id, turn"
    ).fetchall()
    agent = ("reasoning-strip", "reasoning-strip")
    coding = ("coding-agent", "coding-agent")
    assert got == [
        (
            "keep",
            0,
            *coding,
            sc.SOURCE_CONVERSATION_ID,
            sc.CONTINUITY_NEW,
            None,
            None,
            sc.OFFER_NO_ENTRY,
            sc.OUTCOME_NO_REMOTE,
            500,
            0,
            0,
            500,
            99.8,
            110.0,
        ),
        (
            "keep",
            1,
            *coding,
            sc.SOURCE_CONVERSATION_ID,
            sc.CONTINUITY_EXTENDS,
            None,
            None,
            sc.OFFER_OFFERED,
            sc.OUTCOME_PULLED,
            700,
            0,
            511,
            189,
            99.8,
            110.0,
        ),
        (
            "strip",
            0,
            *agent,
            sc.SOURCE_CONVERSATION_ID,
            sc.CONTINUITY_NEW,
            None,
            None,
            sc.OFFER_NO_ENTRY,
            sc.OUTCOME_NO_REMOTE,
            1000,
            0,
            0,
            1000,
            99.8,
            110.0,
        ),
        (
            "strip",
            1,
            *agent,
            sc.SOURCE_CONVERSATION_ID,
            sc.CONTINUITY_DIVERGED,
            2,
            31,
            sc.OFFER_NO_ENTRY,
            sc.OUTCOME_NO_REMOTE,
            1200,
            992,
            0,
            208,
            79.8,
            90.0,
        ),
        (
            "strip",
            2,
            *agent,
            sc.SOURCE_CONVERSATION_ID,
            sc.CONTINUITY_DIVERGED,
            4,
            23,
            sc.OFFER_NO_ENTRY,
            sc.OUTCOME_NO_REMOTE,
            1400,
            1184,
            0,
            216,
            89.8,
            100.0,
        ),
    ]


def test_summary_share_and_cost_per_agent_and_scenario(store):
    got = continuity.summary(store).to_pylist()
    assert [
        (
            r["agent_name"],
            r["scenario"],
            r["turns_checked"],
            r["diverged"],
            r["broken_share"],
            r["reusable_tokens_lost"],
            r["recomputed_tokens"],
            round(r["prefill_ms"], 3),
            r["diverged_ttft_ms"],
            r["extends_ttft_ms"],
        )
        for r in got
    ] == [
        ("reasoning-strip", "reasoning-strip", 2, 2, 1.0, 31 + 23, 208 + 216, 79.8 + 89.8, 95.0, None),
        ("coding-agent", "coding-agent", 1, 0, 0.0, 0, 0, 0.0, None, 110.0),
    ]
    assert [(r["session_id"], r["turn"], r["diverged_at"]) for r in continuity.breaks(store).to_pylist()] == [
        ("strip", 1, 2),
        ("strip", 2, 4),
    ]
    only = continuity.summary(store, Filters(session_id="keep")).to_pylist()
    assert [(r["scenario"], r["turns_checked"]) for r in only] == [("coding-agent", 1)]
    assert continuity.breaks(store, Filters(session_id="keep")).num_rows == 0


def test_kv_held_per_session_and_turn(store):
    # retention spans start 0.1 ms before each call's end; the synth call of prompt p, output o holds
    # ceil((p + o) / 16) blocks
    def held(tokens, start_ms, end_ms):
        return -(-tokens // 16) * BPB * (end_ms - start_ms) / 1e3 / GIB

    end0 = 0 + 110 + 200  # the call's end: ttft (prefill 100 + 10) + decode 200
    strip = [held(1024, end0 - 0.1, 1310.0), held(1224, 2000 + 80 + 10 + 200 - 0.1, 5310.0)]
    keep = [held(512, 20_000 + 310 - 0.1, 21_310.0)]
    got = dict(store.sql("SELECT session_id, kv_gib_s FROM sessions").fetchall())
    assert got["strip"] == pytest.approx(sum(strip)) and got["keep"] == pytest.approx(sum(keep))
    assert got["other"] == 0
    by_session = {r["session_id"]: r["kv_gib_s"] for r in sessions.breakdown(store).to_pylist()}
    assert by_session["strip"] == pytest.approx(sum(strip)) and by_session["keep"] == pytest.approx(sum(keep))
    turns = {(r["session_id"], r["turn"]): r["kv_gib_s"] for r in sessions.turns(store).to_pylist()}
    # no agent turn spans here: the turn windows are the proxy's requests; each retention starts in its own
    assert turns[("strip", 0)] == pytest.approx(strip[0]) and turns[("strip", 1)] == pytest.approx(strip[1])
    assert turns[("strip", 2)] == 0 and turns[("keep", 1)] == 0
    assert sessions.totals(store)["kv_gib_s"] == pytest.approx(sum(strip) + sum(keep))
    assert sessions.session_info(store, "strip")["kv_gib_s"] == pytest.approx(sum(strip))
