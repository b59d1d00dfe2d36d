"""Every bench scenario against the simulator behind the kvtrace proxy, in one process.

The simulator and the proxy read an injected clock that only the bench's ``sleep`` advances
(tool waits, app work, pauses), so TTLs and pauses are exact and no test sleeps in real time.
Spans of the bench (agent), proxy and simulated workers go to one in-memory exporter; the tests
check the tree agent -> proxy -> connector by trace id and parent links, and the reuse outcome
the scenario is built to produce.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict

import pytest

from kvtrace import semconv as sc
from kvtrace.agent import ERROR_STREAM_INTERRUPTED
from kvtrace.bench import api as bench
from kvtrace.bench import scenarios
from kvtrace.cli.bench import run as cli_run
from kvtrace.proxy import server
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.sim.cluster import SimCluster

pytestmark = pytest.mark.timeout(120)


class FakeTime:
    """Simulated seconds; ``sleep`` advances them and yields to the loop."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def stack(provider, clock: FakeTime, *, policy: str = "fail", proxy_ttl_s: float = 450.0, workers=(1, 1)):
    kv = {"kv_load_failure_policy": policy, "kv_connector_extra_config": {"bidirectional_kv_xfer": True}}
    async with SimCluster(workers[0], workers[1], cost=False, tracer_provider=provider, clock=clock, kv_config=kv) as c:
        cfg = ProxyConfig(
            prefill=[Worker("127.0.0.1", w.port) for w in c.prefill],
            decode=[Worker("127.0.0.1", w.port) for w in c.decode],
            port=0,
            conversation_ttl_s=proxy_ttl_s,
        )
        running = await server.start(cfg, tracer_provider=provider, clock=clock)
        try:
            yield running.url
        finally:
            await running.close()


async def run(provider, clock, url, scenario, **kw):
    kw.setdefault("sessions", 2)
    return await bench.arun_bench(
        url, scenario=scenario, tracer_provider=provider, sleep=clock.sleep, seed=7, nonce="t", **kw
    )


def spans_by_id(exporter):
    return {s.context.span_id: s for s in exporter.get_finished_spans()}


def check_tree(exporter, result) -> None:
    """Each llm_call is parent of one proxy request (same trace, same session), whose P leg is
    parent of the P engine span, whose decision outcome is what the client saw; every span of a
    session's trace hangs under the session span."""
    spans = exporter.get_finished_spans()
    by_id = spans_by_id(exporter)
    children = defaultdict(list)
    for s in spans:
        if s.parent is not None:
            children[s.parent.span_id].append(s)
    calls = [s for s in spans if s.name == sc.SPAN_AGENT_LLM_CALL]
    assert len(calls) == len(result.requests)
    sessions = {s.attributes[sc.SESSION_ID]: s for s in spans if s.name == sc.SPAN_AGENT_SESSION}
    assert set(sessions) == {r.session for r in result.sessions}
    for call in calls:
        sid = call.attributes[sc.SESSION_ID]
        assert call.context.trace_id == sessions[sid].context.trace_id
        (proxy_req,) = [c for c in children[call.context.span_id] if c.name == sc.SPAN_PROXY_REQUEST]
        assert proxy_req.context.trace_id == call.context.trace_id
        assert proxy_req.attributes[sc.SESSION_ID] == sid
        if call.attributes.get(sc.ERROR_TYPE):
            continue
        assert proxy_req.attributes[sc.GEN_AI_REQUEST_ID] == call.attributes[sc.GEN_AI_REQUEST_ID]
        (p_leg,) = [c for c in children[proxy_req.context.span_id] if c.name == sc.SPAN_PROXY_PREFILL]
        (d_leg,) = [c for c in children[proxy_req.context.span_id] if c.name == sc.SPAN_PROXY_DECODE]
        (p_engine,) = [c for c in children[p_leg.context.span_id] if c.name == sc.SPAN_ENGINE_PREFILL]
        (d_engine,) = [c for c in children[d_leg.context.span_id] if c.name == sc.SPAN_ENGINE_DECODE]
        assert p_engine.attributes[sc.SESSION_ID] == sid == d_engine.attributes[sc.SESSION_ID]
        decisions = [c for c in children[p_engine.context.span_id] if c.name == sc.SPAN_KV_DECISION]
        if decisions:
            assert decisions[0].attributes[sc.KV_OUTCOME] == call.attributes[sc.KV_OUTCOME]
        # walking up from the engine span reaches the agent session span
        node = p_engine
        while node.parent is not None:
            node = by_id[node.parent.span_id]
        assert node.name == sc.SPAN_AGENT_SESSION and node.attributes[sc.SESSION_ID] == sid


def outcomes_by_call(result) -> dict[int, set]:
    out = defaultdict(set)
    for r in result.requests:
        out[r.call].add(r.outcome)
    return dict(out)


async def test_coding_agent_later_turns_pull(tracer_provider, span_exporter):
    clock = FakeTime()
    async with stack(tracer_provider, clock) as url:
        result = await run(tracer_provider, clock, url, "coding-agent", clients=2)
    assert [r.error for r in result.requests] == [None] * 16
    by_call = outcomes_by_call(result)
    assert by_call[0] == {sc.OUTCOME_NO_REMOTE}
    assert all(by_call[c] == {sc.OUTCOME_PULLED} for c in range(1, 8))
    assert all(r.pulled_tokens >= 64 for r in result.requests if r.call > 0)
    assert all(r.offer_reason == (sc.OFFER_NO_ENTRY if r.call == 0 else sc.OFFER_OFFERED) for r in result.requests)
    check_tree(span_exporter, result)
    tools = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_AGENT_TOOL_CALL]
    assert len(tools) == 2 * 4 and {t.attributes[sc.GEN_AI_TOOL_NAME] for t in tools} == {"run_tests"}
    summary = result.summary()
    assert [t["turn"] for t in summary["per_turn"]] == [0, 1, 2, 3]
    assert summary["per_turn"][1]["outcomes"] == {sc.OUTCOME_PULLED: 4}
    assert summary["sessions"]["count"] == 2 and summary["sessions"]["errors"] == 0


async def test_research_assistant_correction_and_revise_pull(tracer_provider, span_exporter):
    clock = FakeTime()
    async with stack(tracer_provider, clock) as url:
        result = await run(tracer_provider, clock, url, "research-assistant")
    assert [(r.turn, r.outcome) for r in sorted(result.requests, key=lambda r: r.turn)] == [
        (0, sc.OUTCOME_NO_REMOTE),
        (0, sc.OUTCOME_NO_REMOTE),
        (1, sc.OUTCOME_PULLED),
        (1, sc.OUTCOME_PULLED),
        (2, sc.OUTCOME_PULLED),
        (2, sc.OUTCOME_PULLED),
        (3, sc.OUTCOME_PULLED),
        (3, sc.OUTCOME_PULLED),
    ]
    assert {t.label for t in result.turns} == {"gather", "compare", "correction", "revise"}
    check_tree(span_exporter, result)


@pytest.mark.parametrize(
    "policy, proxy_ttl_s, expected, reason",
    [
        # the proxy still offers D's blocks; P finds them expired and recomputes
        ("recompute", 10_000.0, sc.OUTCOME_EXPIRED, sc.OFFER_OFFERED),
        # the proxy's entry is older than its limit: nothing is offered
        ("fail", 450.0, sc.OUTCOME_NO_REMOTE, sc.OFFER_ENTRY_TOO_OLD),
    ],
)
async def test_pause_longer_than_retention(tracer_provider, span_exporter, policy, proxy_ttl_s, expected, reason):
    clock = FakeTime()
    async with stack(tracer_provider, clock, policy=policy, proxy_ttl_s=proxy_ttl_s) as url:
        result = await run(tracer_provider, clock, url, "pause-resume", max_active_conversations=1)
    got = sorted((r.session, r.turn, r.outcome, r.offer_reason) for r in result.requests)
    sessions = sorted({r.session for r in result.requests})
    assert got == [
        (s, t, o, why)
        for s in sessions
        for t, o, why in [
            (0, sc.OUTCOME_NO_REMOTE, sc.OFFER_NO_ENTRY),
            (1, sc.OUTCOME_PULLED, sc.OFFER_OFFERED),
            (2, expected, reason),
            (3, sc.OUTCOME_PULLED, sc.OFFER_OFFERED),
        ]
    ]
    assert all(r.error is None for r in result.requests)
    check_tree(span_exporter, result)
    retention = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_RETENTION]
    ended = {
        (s.attributes[sc.SESSION_ID], s.attributes[sc.TURN_INDEX]): s.attributes[sc.KV_RETENTION_OUTCOME]
        for s in retention
    }
    for sid in sessions:  # the blocks held across the pause were never read; the others were
        assert [ended[(sid, t)] == sc.RETENTION_READ for t in (0, 1, 2)] == [True, False, True]
    # each pause before turns 1-3 is a user-pause span under the session span, outside the turns
    by_id = spans_by_id(span_exporter)
    pauses = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_AGENT_USER_PAUSE]
    assert sorted(s.attributes[sc.SESSION_ID] for s in pauses) == sorted(sessions * 3)
    for p in pauses:
        sid = p.attributes[sc.SESSION_ID]
        assert dict(p.attributes) == {
            sc.GEN_AI_OPERATION_NAME: sc.OP_USER_PAUSE,
            sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN,
            sc.AGENT_PAUSE_REASON: "think",
            sc.SESSION_ID: sid,
            sc.GEN_AI_CONVERSATION_ID: sid,
        }
        assert by_id[p.parent.span_id].name == sc.SPAN_AGENT_SESSION


async def test_short_followups_below_threshold(tracer_provider, span_exporter):
    clock = FakeTime()
    async with stack(tracer_provider, clock) as url:
        result = await run(tracer_provider, clock, url, "short-followups")
    later = [r for r in result.requests if r.turn > 0]
    assert len(later) == 10
    assert {r.outcome for r in later} == {sc.OUTCOME_BELOW_THRESHOLD}
    assert all(r.pulled_tokens == 0 and r.offered for r in later)
    check_tree(span_exporter, result)


async def test_no_reuse_never_offers(tracer_provider, span_exporter):
    clock = FakeTime()
    async with stack(tracer_provider, clock) as url:
        result = await run(tracer_provider, clock, url, "no-reuse", sessions=4, clients=4)
    assert [(r.turn, r.outcome, r.offer_reason) for r in result.requests] == [
        (0, sc.OUTCOME_NO_REMOTE, sc.OFFER_NO_ENTRY)
    ] * 4
    assert len({r.session for r in result.requests}) == 4
    check_tree(span_exporter, result)


async def test_interrupted_stream_is_recorded_and_session_continues(tracer_provider, span_exporter):
    clock = FakeTime()
    async with stack(tracer_provider, clock) as url:
        result = await run(tracer_provider, clock, url, "interrupted")
    cut = [r for r in result.requests if r.turn == 1]
    assert len(cut) == 2 and all(r.interrupted and r.error is None and r.outcome is None for r in cut)
    assert all(r.ttft_ms is not None for r in cut)
    assert sorted(r.turn for r in result.requests if r.turn == 2 and r.error is None) == [2, 2]
    assert result.summary()["requests"]["interrupted"] == 2
    calls = [
        s
        for s in span_exporter.get_finished_spans()
        if s.name == sc.SPAN_AGENT_LLM_CALL and s.attributes[sc.TURN_INDEX] == 1
    ]
    assert [s.attributes[sc.ERROR_TYPE] for s in calls] == [ERROR_STREAM_INTERRUPTED] * 2
    check_tree(span_exporter, result)


async def test_parallel_tools_share_their_turn(tracer_provider, span_exporter):
    clock = FakeTime()
    async with stack(tracer_provider, clock) as url:
        result = await run(tracer_provider, clock, url, "parallel-tools", clients=2)
    assert all(r.error is None for r in result.requests)
    assert {r.outcome for r in result.requests if r.call > 0} == {sc.OUTCOME_PULLED}
    spans = span_exporter.get_finished_spans()
    turns = {s.context.span_id: s for s in spans if s.name == sc.SPAN_AGENT_TURN}
    tools = [s for s in spans if s.name == sc.SPAN_AGENT_TOOL_CALL]
    assert len(tools) == 2 * 3 * 3
    per_turn = defaultdict(set)
    for t in tools:
        parent = turns[t.parent.span_id]
        assert parent.attributes[sc.TURN_INDEX] == t.attributes[sc.TURN_INDEX]
        assert parent.attributes[sc.SESSION_ID] == t.attributes[sc.SESSION_ID]
        per_turn[t.parent.span_id].add(t.attributes[sc.GEN_AI_TOOL_NAME])
    assert all(names == {"search_code", "read_file", "run_linter"} for names in per_turn.values())
    check_tree(span_exporter, result)


async def test_ab_reports_per_turn_ttft_ratios(tracer_provider, span_exporter):
    clock = FakeTime()
    off = {"kv_connector_extra_config": {"bidirectional_kv_xfer": False}}
    async with stack(tracer_provider, clock) as url_on:
        async with SimCluster(cost=False, tracer_provider=tracer_provider, clock=clock, kv_config=off) as c:
            cfg = ProxyConfig(
                prefill=[Worker("127.0.0.1", c.prefill[0].port)], decode=[Worker("127.0.0.1", c.decode[0].port)], port=0
            )
            running = await server.start(cfg, tracer_provider=tracer_provider, clock=clock)
            try:
                ab = await bench.arun_ab(
                    running.url,
                    url_on,
                    scenario="coding-agent",
                    sessions=2,
                    repeat=2,
                    tracer_provider=tracer_provider,
                    sleep=clock.sleep,
                    seed=3,
                    nonce="ab",
                )
            finally:
                await running.close()
    assert {r.outcome for r in ab.b.requests if r.call > 0} == {sc.OUTCOME_PULLED}
    assert sc.OUTCOME_PULLED not in {r.outcome for r in ab.a.requests}
    rows = [r for r in ab.comparison if r["metric"] == "ttft_ms"]
    assert [r["turn"] for r in rows] == [0, 1, 2, 3, "≥1", "all"]
    for row in rows:
        # 2 sessions x 2 calls per turn x 2 repeats; turns >= 1: x 3 turns; all turns: x 4 turns
        assert row["n_a"] == row["n_b"] == {"≥1": 24, "all": 32}.get(row["turn"], 8)
        assert row["ratio"] == pytest.approx(row["b_mean"] / row["a_mean"])
        assert row["ci_low"] <= row["ci_high"] and row["noise"] is not None
        assert row["verdict"] in ("faster", "slower", "within noise")
    # same seeded workload on both sides: same prompts, same token counts
    key = lambda r: (r.repeat, r.session.rsplit("-", 2)[-1], r.call)  # noqa: E731
    a_in = {key(r): r.input_tokens for r in ab.a.requests}
    b_in = {key(r): r.input_tokens for r in ab.b.requests}
    assert a_in == b_in
    text = ab.format()
    assert "B/A" in text and "ttft_ms" in text


async def test_cli_json_and_summary(tracer_provider, span_exporter, tmp_path, capsys, monkeypatch):
    import argparse

    from kvtrace.cli import bench as bench_cli

    clock = FakeTime()
    out = tmp_path / "stats.json"
    async with stack(tracer_provider, clock) as url:
        parser = argparse.ArgumentParser()
        bench_cli.add_arguments(parser)
        args = parser.parse_args(
            [
                "--url",
                url,
                "--scenario",
                "no-reuse",
                "--sessions",
                "3",
                "--json",
                str(out),
                "--no-progress",
                "--traces",
                str(tmp_path / "traces"),
            ]
        )
        rc = await asyncio.to_thread(cli_run, args)
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["summary"]["requests"]["count"] == 3
    assert data["summary"]["requests"]["outcomes"] == {sc.OUTCOME_NO_REMOTE: 3}
    assert len(data["requests"]) == 3 and data["config"]["scenario"] == "no-reuse"
    printed = capsys.readouterr().out
    assert "kvtrace bench [A] no-reuse" in printed and "outcomes" in printed
    assert any((tmp_path / "traces").rglob("*.parquet"))


def test_scenario_names_are_the_documented_ones():
    assert list(scenarios.SCENARIOS) == [
        "coding-agent",
        "research-assistant",
        "pause-resume",
        "short-followups",
        "no-reuse",
        "interrupted",
        "parallel-tools",
        "reasoning-strip",
    ]


@pytest.mark.parametrize("keep", [False, True])
async def test_reasoning_strip_diverges_at_the_previous_assistant_message(tracer_provider, span_exporter, keep):
    """The client drops each answer's reasoning: every later call diverges at the assistant message
    before it (history = system, then user/assistant pairs: call c diverges at index 2c), D's blocks
    are not offered and P recomputes what it does not hold.  Keeping the reasoning, every later call pulls."""
    clock = FakeTime()
    scenario = scenarios.get("reasoning-strip").with_(keep_reasoning=keep)
    async with stack(tracer_provider, clock) as url:
        result = await run(tracer_provider, clock, url, scenario, clients=2)
    assert [r.error for r in result.requests] == [None] * 12
    check_tree(span_exporter, result)
    proxy = sorted(
        (s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_PROXY_REQUEST),
        key=lambda s: (s.attributes[sc.SESSION_ID], s.attributes[sc.TURN_INDEX]),
    )
    got = [
        (
            s.attributes[sc.TURN_INDEX],
            s.attributes[sc.SESSION_CONTINUITY],
            s.attributes.get(sc.SESSION_DIVERGED_AT),
            s.attributes[sc.KV_OUTCOME],
        )
        for s in proxy
    ]
    if keep:
        want = [(0, sc.CONTINUITY_NEW, None, sc.OUTCOME_NO_REMOTE)] + [
            (c, sc.CONTINUITY_EXTENDS, None, sc.OUTCOME_PULLED) for c in range(1, 6)
        ]
    else:
        want = [(0, sc.CONTINUITY_NEW, None, sc.OUTCOME_NO_REMOTE)] + [
            (c, sc.CONTINUITY_DIVERGED, 2 * c, sc.OUTCOME_NO_REMOTE) for c in range(1, 6)
        ]
    assert got == want * 2
    summary = result.summary()["requests"]
    if keep:
        assert summary["diverged"] == 0
        return
    lost = [s.attributes[sc.SESSION_REUSABLE_TOKENS_LOST] for s in proxy if s.attributes[sc.TURN_INDEX]]
    assert len(lost) == 10 and all(n >= 64 for n in lost)  # at least the reasoning and answer D held
    later = [r for r in result.requests if r.call]
    assert summary["diverged"] == 10 and summary["diverged_recomputed_tokens"] == sum(
        r.recomputed_tokens for r in later
    )
    assert "continuity breaks 10" in result.format()
