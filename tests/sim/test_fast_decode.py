"""The virtual arm's fast path (kvtrace.sim.decoding: a decode step is a fast event of the virtual
loop, not a timer and a task wake-up; kvtrace.sim.streaming: the answer after its first token with
text goes out in one write) makes exactly the spans the served code path makes (a chunk per token,
an ``asyncio.sleep`` per decode step) on the same workload and seed: the same span ids, names,
parents, timestamps, durations, whole attribute dicts and events, hence the same decisions."""

from __future__ import annotations

import glob
import math

import pyarrow.parquet as pq
import pytest

from kvtrace import semconv as sc
from kvtrace.bench.fleet import Fleet
from kvtrace.sim import decoding, virtual

pytest.importorskip("aiohttp")
pytest.importorskip("openai")

ROW = ("SpanName", "ParentSpanId", "ServiceName", "Timestamp", "Duration", "StatusCode", "Events.Name")


def _spans(run_dir: str) -> dict:
    out = {}
    for path in glob.glob(f"{run_dir}/**/*.parquet", recursive=True):
        for r in pq.read_table(path).to_pylist():
            events = [dict(a) for a in r["Events.Attributes"]]
            out[(r["TraceId"], r["SpanId"])] = (
                *(r[k] for k in ROW),
                dict(r["SpanAttributes"]),
                dict(r["ResourceAttributes"]),
                events,
                r["Events.Timestamp"],
            )
    return out


def _run(run_dir: str, cfg: dict, fleet: Fleet, fast: bool, monkeypatch, preset: str = "qwen3-32b"):
    from kvtrace.bench import inproc

    with monkeypatch.context() as m:
        if not fast:
            m.setattr(decoding, "fast_loop", lambda engine: None)
        main = inproc.run_arm(
            run_dir, preset, True, True, "efa-3200", cfg, "A", 450.0, None, fleet, None if fast else 1
        )
        return virtual.run(main, seed=3)


def _decisions(spans: dict) -> list:
    return sorted(
        (attrs.get(sc.GEN_AI_REQUEST_ID), attrs.get(sc.KV_OUTCOME), attrs.get(sc.KV_PULLED_TOKENS))
        for name, *_, attrs, _res, _ev, _evt in spans.values()
        if name == sc.SPAN_KV_DECISION
    )


@pytest.mark.parametrize(
    "cfg, fleet",
    [
        # the shipped trace's first sessions on a fleet: its gaps, one past D's TTL, long prompts
        (dict(input="mooncake-conversation", sessions=14, nonce="f"), Fleet(2, 2, sc.ROUTING_KV_AWARE)),
        # a thinking model (the first token is an empty delta) whose client drops the reasoning
        (dict(scenario="reasoning-strip", sessions=3, nonce="f"), Fleet(1, 1)),
        # tool waits and parallel calls between the turns
        (dict(scenario="parallel-tools", sessions=2, nonce="f"), Fleet(1, 2, sc.ROUTING_LEAST_LOADED)),
    ],
    ids=["mooncake-2P2D", "reasoning-strip", "parallel-tools"],
)
def test_the_fast_path_makes_the_served_paths_spans(tmp_path, monkeypatch, cfg, fleet):
    served = _run(str(tmp_path / "served"), cfg, fleet, False, monkeypatch)
    fast = _run(str(tmp_path / "fast"), cfg, fleet, True, monkeypatch)
    a, b = _spans(str(tmp_path / "served")), _spans(str(tmp_path / "fast"))
    assert len(a) > 50 and a.keys() == b.keys()
    assert {k: v for k, v in a.items() if v != b[k]} == {}
    assert _decisions(a) == _decisions(b) and len(_decisions(a)) >= len(served.requests)
    rows = [(r.session, r.call, r.ttft_ms, r.tpot_ms, r.latency_ms, r.output_tokens) for r in served.requests]
    assert rows == [(r.session, r.call, r.ttft_ms, r.tpot_ms, r.latency_ms, r.output_tokens) for r in fast.requests]


def test_a_client_that_stops_reading_early_gets_a_chunk_per_token():
    from kvtrace.bench.inproc import may_interrupt

    assert may_interrupt(dict(scenario="interrupted"))
    assert not may_interrupt(dict(scenario="coding-agent"))
    assert not may_interrupt(dict(input="mooncake-conversation"))
    assert not may_interrupt(dict(published="published-sweep"))


def test_a_merged_stream_has_the_per_token_streams_text_and_counts(monkeypatch):
    """A chat stream with stream_interval inf: the role chunk, the first token, then the rest in one
    chunk with finish_reason and kv_transfer_params, then usage; same text and usage as per token."""
    chunks = {}
    for interval in (1, math.inf):
        chunks[interval] = virtual.run(_stream(interval), seed=0)
    per_token, merged = chunks[1], chunks[math.inf]
    text = ["".join(_delta(c) for c in cs) for cs in (per_token, merged)]
    assert text[0] == text[1] and len(text[0].split()) == 40
    assert len(per_token) == 1 + 40 + 1 and len(merged) == 1 + 2 + 1  # role, tokens, usage
    assert [_finish(c) for c in merged] == [None, None, "length", None]
    assert merged[-1]["usage"] == per_token[-1]["usage"] and merged[-1]["usage"]["completion_tokens"] == 40
    assert "kv_transfer_params" in merged[2] and merged[2]["kv_transfer_params"] == per_token[-2]["kv_transfer_params"]


async def _stream(interval: float) -> list[dict]:
    import json

    import aiohttp

    from kvtrace.sim.cluster import SimCluster

    async with SimCluster(0, 1, metrics=False, stream_interval=interval) as c:
        body = {
            "messages": [{"role": "user", "content": "tell me something"}],
            "max_tokens": 40,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        async with aiohttp.ClientSession() as http:
            async with http.post(c.decode_urls[0] + "/v1/chat/completions", json=body) as r:
                raw = (await r.read()).decode()
    events = [line[6:] for line in raw.split("\n") if line.startswith("data: ") and line != "data: [DONE]"]
    return [json.loads(e) for e in events]


def _delta(chunk: dict) -> str:
    return "".join((c.get("delta") or {}).get("content") or "" for c in chunk.get("choices") or [])


def _finish(chunk: dict):
    return next((c.get("finish_reason") for c in chunk.get("choices") or []), None)


# -- a decode alone on its engine: its steps computed ahead, settled when another touches the engine

STARTS = {"A": (0.0, 300, 2000), "B": (0.25, 120, 500), "C": (3.0, 400, 800), "D": (3.4, 60, 300)}
ABORT_C_AFTER_S = 0.3  # C leaves while alone on the engine (before D comes), its steps computed ahead


async def _decodes(log: list, ahead: list) -> int:
    """A alone, B joining mid-way; then C alone, aborted, and D after it: each batch's (request,
    virtual time, tokens, output so far), C's output at its abort; the engine's context at the end."""
    import asyncio

    from kvtrace.sim import streaming, wire
    from kvtrace.sim.cluster import SimCluster

    async with SimCluster(0, 1, metrics=False, stream_interval=math.inf) as c:
        engine = next(iter(c.engines.values()))
        loop = asyncio.get_running_loop()

        async def one(name: str) -> None:
            start, max_tokens, prompt = STARTS[name]
            await asyncio.sleep(start)
            prompt_ids = list(range(1, prompt))
            gen = engine.submit(prompt_ids, max_tokens=max_tokens, params=None, request_id=name, internal_id=name)
            await gen.prefill()
            req = wire.ParsedRequest(True, gen.prompt, max_tokens, True, False, False, None, None, None)
            batches = gen.decode_batches(streaming.Pacing(math.inf, req, 0, True))

            async def consume() -> None:
                async for batch in batches:
                    log.append((name, loop.time(), len(batch), len(gen.output)))
                    ahead.append((name, engine._ahead is not None))

            task = asyncio.create_task(consume())
            if name != "C":
                await task
                gen.finish()
                return
            await asyncio.sleep(ABORT_C_AFTER_S)
            ahead.append(("abort", engine._ahead is not None))
            gen.abort(sc.ERROR_CLIENT_DISCONNECT)
            log.append((name, loop.time(), "abort", len(gen.output)))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await batches.aclose()

        await asyncio.gather(*(one(n) for n in STARTS))
        return engine._decode_ctx


def test_a_decode_computed_ahead_gives_the_token_by_token_times_through_joins_and_aborts(monkeypatch):
    """The same batches at the same virtual times, token counts included, as the served path's
    token-by-token sleeps: while B joins A mid-decode (A's tokens made so far settled first), and
    when C is aborted while its steps are computed ahead (its output is the tokens made by then)."""
    runs = {}
    for fast in (False, True):
        log, ahead = [], []
        with monkeypatch.context() as m:
            if not fast:
                m.setattr(decoding, "fast_loop", lambda engine: None)
            ctx = virtual.run(_decodes(log, ahead), seed=0)
        runs[fast] = (log, ahead, ctx)
    (served, _, ctx_served), (fast, ahead, ctx_fast) = runs[False], runs[True]
    assert fast == served and ctx_fast == ctx_served == 0
    assert [e[:1] + e[2:] for e in fast] == [
        ("A", 1, 1),  # the first token alone: A's steps are then computed ahead ...
        ("B", 1, 1),  # ... until B joins: A's tokens so far settled, both token by token
        ("B", 119, 120),
        ("A", 299, 300),  # alone again after B, computed ahead to its last token
        ("C", 1, 1),
        ("C", "abort", fast[5][3]),  # aborted ahead: the tokens made before the abort
        ("D", 1, 1),
        ("D", 59, 60),
    ]
    assert 0 < fast[5][3] < STARTS["C"][1]
    assert ahead == [
        *[("A", True), ("B", False), ("B", False), ("A", False)],
        *[("C", True), ("abort", True), ("D", True), ("D", False)],
    ]


@pytest.mark.parametrize("interval", [1, 2, 5, math.inf])
def test_a_pacers_first_due_token_is_the_one_its_deliver_says_yes_to(interval):
    """``first_due`` (a count and a binary search over the computed-ahead times) answers what
    ``deliver`` would, token by token: the first yes, every no before it counted (``skip``),
    through the first token with text and the 30 s silence bound."""
    from kvtrace.sim import streaming, wire

    req = wire.ParsedRequest(True, [1], 400, True, False, False, None, None, None)
    pieces = ["", "", "word "] + ["more "] * 397  # two empty deltas first: a thinking answer's tags
    times = [0.5 + 0.2 * k for k in range(len(pieces))]  # 80 s of tokens: past the silence bound twice
    stepped, ahead = streaming.Pacing(interval, req, 0, True), streaming.Pacing(interval, req, 0, True)
    yes_stepped, yes_ahead, i = [], [], 0
    for k, t in enumerate(times):
        stepped._time = lambda t=t: t
        if stepped.deliver(k, pieces[k]):
            yes_stepped.append(k)
    while i < len(pieces):  # asked in slices of 7, as the decode computes its times ahead in slices
        due, skipped = None, 0
        while due is None and i + skipped < len(pieces):
            part = times[i + skipped : i + skipped + 7]
            due = ahead.first_due(part, skipped)
            skipped += 0 if due is not None else len(part)
        if due is None:
            break
        ahead.skip(skipped + due)
        ahead._time = lambda t=times[i + skipped + due]: t
        assert ahead.deliver(i + skipped + due, pieces[i + skipped + due])
        yes_ahead.append(i + skipped + due)
        i += skipped + due + 1
    ahead.skip(len(pieces) - i)  # the tokens after the last yes, refused
    assert yes_ahead == yes_stepped
    assert (ahead.since, ahead.last_t, ahead.texted) == (stepped.since, stepped.last_t, stepped.texted)
    expected = {1: list(range(400)), 2: [0, 1, 2, *range(4, 400, 2)], 5: [0, 1, 2, *range(7, 400, 5)]}
    assert yes_stepped == expected.get(interval, [0, 1, 2, 152, 302])  # inf: at most 30 s apart
