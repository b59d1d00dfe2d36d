"""Every way the proxy used to offer P blocks of another token sequence (issue table: completions and
n > 1 under another's id, a chat turn after a completions turn, turns finishing out of order, the
prefix table evicting a session, tools / template kwargs / content parts), through ``kvtrace proxy``
over the simulator: the proxy does not offer, or P's check of D's digest refuses, and the spans say
which and why.  P runs without a prefix cache (the published setup), so its local hit is 0."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtrace import semconv as sc
from kvtrace.proxy.config import ProxyConfig
from kvtrace.proxy.server import start
from kvtrace.sim import tokenizer
from kvtrace.sim.cluster import SimCluster

from support.held_worker import HeldWorker
from support.sim_stack import CHAT, MAX_TOKENS, Clock, Stack, d2p_decision, worker

COMPLETIONS = "/v1/completions"
SYSTEM = {"role": "system", "content": "you are a careful agent that plans each step of the tool call " * 4}
TEXT = "the agent reads the plan and checks each step of the tool result " * 6


def kv_config(verify: str) -> dict:
    return {"kv_connector_extra_config": {sc.KV_PARAMS_KEY: {"verify": verify}}}


@contextlib.asynccontextmanager
async def sim_proxy(tracer_provider, span_exporter, verify=sc.VERIFY_RECORD, hold_decode=False, **cfg):
    """A proxy over a simulated 1 P + 1 D (D behind a :class:`HeldWorker` when ``hold_decode``)."""
    clock = Clock()
    cluster = SimCluster(
        cost=False,
        tracer_provider=tracer_provider,
        clock=clock,
        kv_config=kv_config(verify),
        no_prefix_caching=(sc.ROLE_PREFILL,),
    )
    async with cluster, aiohttp.ClientSession() as http:
        held = await HeldWorker(cluster.decode_urls[0]).start() if hold_decode else None
        d_url = held.url if held else cluster.decode_urls[0]
        config = ProxyConfig(prefill=[worker(cluster.prefill_urls[0])], decode=[worker(d_url)], **cfg)
        proxy = await start(config, tracer_provider, clock=clock, port=0)
        stack = Stack(cluster, proxy, http, clock, span_exporter)
        stack.held = held
        try:
            yield stack
        finally:
            await proxy.close()
            if held:
                await held.close()


async def post(stack, path: str, body: dict, conv: str | None = "c1", rid: str | None = None):
    """(status, final event or JSON body) of one streamed request through the proxy."""
    body = {"model": "m", "max_tokens": MAX_TOKENS, "stream": True, **body}
    if conv is not None:
        body[sc.BODY_CONVERSATION_ID] = conv
    headers = {sc.HEADER_REQUEST_ID: rid} if rid else {}
    async with stack.http.post(stack.proxy.url + path, json=body, headers=headers) as r:
        data = await r.read()
        if r.status != 200:
            return r.status, json.loads(data)
    events = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: {")]
    text = "".join(
        (c["choices"][0].get("delta") or {}).get("content") or c["choices"][0].get("text") or ""
        for c in events
        if c["choices"]
    )
    final = next(c for c in events if c["choices"] and c["choices"][0]["finish_reason"])
    return 200, {"text": text, "params": final["kv_transfer_params"], "kv": final[sc.RESPONSE_KV_TRANSFER]}


def server_span(stack, rid: str) -> dict:
    (span,) = [s for s in stack.spans(sc.SPAN_PROXY_REQUEST) if s.attributes[sc.GEN_AI_REQUEST_ID] == rid]
    return dict(span.attributes)


def p_decision(stack, rid: str) -> dict:
    (span,) = [
        s
        for s in stack.spans(sc.SPAN_KV_DECISION)
        if s.attributes[sc.GEN_AI_REQUEST_ID] == rid and s.attributes[sc.KV_DIRECTION] == sc.DIRECTION_D2P
    ]
    return dict(span.attributes)


def offer_view(attrs: dict) -> dict:
    """What the proxy decided and why (the rest of the span is pinned by test_over_simulator)."""
    keys = (
        sc.SESSION_SOURCE,
        sc.SESSION_CONTINUITY,
        sc.SESSION_DIVERGED_AT,
        sc.PROXY_OFFER,
        sc.PROXY_OFFER_REASON,
        sc.KV_OUTCOME,
        sc.KV_PULLED_TOKENS,
        sc.SESSION_REUSABLE_TOKENS_LOST,
        sc.PROXY_DECODE_PARAMS_INVALID,
        sc.HTTP_RESPONSE_STATUS_CODE,
    )
    return {k: attrs[k] for k in keys if k in attrs}


def offered_decision(rid: str, turn: int, d: dict, prompt: int, pulled: int, outcome: str, verification: dict) -> dict:
    """P's whole d2p decision span when the proxy offered D's params ``d`` to turn ``turn`` of c1."""
    session = {sc.SESSION_ID: "c1", sc.GEN_AI_CONVERSATION_ID: "c1", sc.TURN_INDEX: turn}
    return {**d2p_decision(rid, d, prompt, pulled, outcome, verification), **session}


def continuity_counts(stack) -> dict:
    """kvtrace_proxy_session_continuity_total by continuity, from the proxy's /metrics registry."""
    text = stack.proxy.proxy.metrics.render(None)[0].decode()
    return {
        s.labels[sc.LABEL_CONTINUITY]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == sc.METRIC_PROXY_CONTINUITY
        for s in f.samples
        if s.name.endswith("_total")
    }


def chat_tokens(msgs: list) -> int:
    return len(tokenizer.encode(tokenizer.render_chat(msgs)))


def matched(n: int) -> dict:
    return {sc.KV_VERIFIED: sc.VERIFIED_MATCH, sc.KV_VERIFY_MODE: sc.VERIFY_RECORD, sc.KV_VERIFIED_TOKENS: n}


def refused(continuity: str, reason: str, at: int | None = 0, **extra) -> dict:
    """The offer view of a turn the proxy did not offer D's blocks (P then had nothing to pull)."""
    out = {
        sc.SESSION_SOURCE: sc.SOURCE_CONVERSATION_ID,
        sc.SESSION_CONTINUITY: continuity,
        sc.PROXY_OFFER: False,
        sc.PROXY_OFFER_REASON: reason,
        sc.KV_OUTCOME: sc.OUTCOME_NO_REMOTE,
        sc.KV_PULLED_TOKENS: 0,
        sc.HTTP_RESPONSE_STATUS_CODE: 200,
        **extra,
    }
    if at is not None:
        out[sc.SESSION_DIVERGED_AT] = at
    return out


def extended(pulled: int) -> dict:
    return {
        sc.SESSION_SOURCE: sc.SOURCE_CONVERSATION_ID,
        sc.SESSION_CONTINUITY: sc.CONTINUITY_EXTENDS,
        sc.PROXY_OFFER: True,
        sc.PROXY_OFFER_REASON: sc.OFFER_OFFERED,
        sc.KV_OUTCOME: sc.OUTCOME_PULLED,
        sc.KV_PULLED_TOKENS: pulled,
        sc.HTTP_RESPONSE_STATUS_CODE: 200,
    }


async def chat_turns(stack, msgs: list, rid: str, conv: str = "c1", **extra) -> tuple[dict, list]:
    """One chat turn: (its response, the messages with the reply appended)."""
    status, out = await post(stack, CHAT, {"messages": msgs, **extra}, conv, rid)
    assert status == 200, out
    return out, msgs + [{"role": "assistant", "content": out["text"]}]


# ---------------------------------------------------------------------- D's digest reaches P
async def test_a_true_chat_continuation_is_offered_with_d_digest_and_p_verifies_every_token(
    tracer_provider, span_exporter
):
    async with sim_proxy(tracer_provider, span_exporter) as stack:
        t0, history = await chat_turns(stack, [SYSTEM, {"role": "user", "content": TEXT}], "t0")
        msgs = history + [{"role": "user", "content": "and the next step?"}]
        await chat_turns(stack, msgs, "t1")
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
        held = t0["params"]["remote_num_tokens"]
        assert offer_view(server_span(stack, "t1")) == extended(held)
        got = p_decision(stack, "t1")
        want = offered_decision("t1", 1, t0["params"], chat_tokens(msgs), held, sc.OUTCOME_PULLED, matched(held))
        assert got == want


@pytest.mark.parametrize("kind", ["text", "ids"])
async def test_completions_under_an_id_only_router_are_caught_by_p_when_the_proxy_offers_by_id_alone(
    tracer_provider, span_exporter, kind
):
    """--no-prefix-match: the proxy offers by id alone (vLLM's example proxy); D's digest still
    reaches P, whose check under enforce recomputes instead of loading the other prompt's KV."""
    a, b = TEXT + "alpha", "an unrelated conversation about the weather in spring " * 12
    prompt_a, prompt_b = (a, b) if kind == "text" else (tokenizer.encode(a), tokenizer.encode(b))
    async with sim_proxy(tracer_provider, span_exporter, sc.VERIFY_ENFORCE, prefix_match=False) as stack:
        status, t0 = await post(stack, COMPLETIONS, {"prompt": prompt_a}, rid="a0")
        status, _ = await post(stack, COMPLETIONS, {"prompt": prompt_b}, rid="b1")
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
        span = server_span(stack, "b1")
        n_b = len(tokenizer.encode(b))
        assert offer_view(span) == {
            sc.SESSION_SOURCE: sc.SOURCE_CONVERSATION_ID,
            sc.PROXY_OFFER: True,
            sc.PROXY_OFFER_REASON: sc.OFFER_OFFERED,
            sc.KV_OUTCOME: sc.OUTCOME_UNVERIFIED,
            sc.KV_PULLED_TOKENS: 0,
            sc.HTTP_RESPONSE_STATUS_CODE: 200,
        }
        d = t0["params"]
        wanted = min(d["remote_num_tokens"], n_b)
        verification = {
            sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
            sc.KV_VERIFY_MODE: sc.VERIFY_ENFORCE,
            sc.KV_VERIFIED_TOKENS: 0,
            sc.KV_VERIFY_MISMATCH_TOKEN: 0,
            sc.KV_VERIFY_WRONG_TOKENS: wanted,
        }
        assert p_decision(stack, "b1") == offered_decision("b1", 1, d, n_b, 0, sc.OUTCOME_UNVERIFIED, verification)


# ---------------------------------------------------------------------- row 1: completions
@pytest.mark.parametrize("kind", ["text", "ids"])
async def test_completions_of_another_conversation_under_the_same_id_are_not_offered(
    tracer_provider, span_exporter, kind
):
    a, b = TEXT + "alpha", "an unrelated conversation about the weather in spring " * 6
    prompt_a, prompt_b = (a, b) if kind == "text" else (tokenizer.encode(a), tokenizer.encode(b))
    async with sim_proxy(tracer_provider, span_exporter) as stack:
        await post(stack, COMPLETIONS, {"prompt": prompt_a}, rid="a0")
        await post(stack, COMPLETIONS, {"prompt": prompt_b, sc.BODY_PROMPT_CACHE_KEY: "k"}, rid="b1")
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
        assert offer_view(server_span(stack, "b1")) == refused(sc.CONTINUITY_REUSED_ID, sc.OFFER_REUSED_ID)
        assert p_decision(stack, "b1")[sc.KV_OUTCOME] == sc.OUTCOME_NO_REMOTE
        counts = continuity_counts(stack)
        assert counts == {**dict.fromkeys(sc.CONTINUITIES, 0.0), sc.CONTINUITY_NEW: 1.0, sc.CONTINUITY_REUSED_ID: 1.0}


async def test_a_text_completion_that_extends_prompt_and_reply_is_offered_and_verified(tracer_provider, span_exporter):
    async with sim_proxy(tracer_provider, span_exporter) as stack:
        _, t0 = await post(stack, COMPLETIONS, {"prompt": TEXT}, rid="a0")
        nxt = TEXT + t0["text"] + "then check the result "
        _, t1 = await post(stack, COMPLETIONS, {"prompt": nxt}, rid="a1")
        rewritten = TEXT + "a different answer " + t0["text"] + "then check the result "
        await post(stack, COMPLETIONS, {"prompt": rewritten}, rid="a2")
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 3)
        held = t0["params"]["remote_num_tokens"]
        assert offer_view(server_span(stack, "a1")) == extended(held)
        n = len(tokenizer.encode(nxt))
        assert p_decision(stack, "a1") == offered_decision(
            "a1", 1, t0["params"], n, held, sc.OUTCOME_PULLED, matched(held)
        )
        lost = min(t1["params"]["remote_num_tokens"], len(tokenizer.encode(rewritten)))
        assert offer_view(server_span(stack, "a2")) == refused(
            sc.CONTINUITY_DIVERGED, sc.OFFER_DIVERGED, 1, **{sc.SESSION_REUSABLE_TOKENS_LOST: lost}
        )


async def test_a_token_id_continuation_past_the_served_prompt_is_not_offered(tracer_provider, span_exporter):
    """The response carries no output token ids: what D holds past the prompt cannot be checked."""
    ids = tokenizer.encode(TEXT)
    async with sim_proxy(tracer_provider, span_exporter) as stack:
        _, t0 = await post(stack, COMPLETIONS, {"prompt": ids}, rid="i0")
        nxt = ids + tokenizer.encode(t0["text"] + "go on ")  # what D holds, then more: unknown to the proxy
        _, t1 = await post(stack, COMPLETIONS, {"prompt": nxt}, rid="i1")
        await post(stack, COMPLETIONS, {"prompt": nxt}, rid="i2")  # a retry: a prefix of what D holds
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 3)
        assert offer_view(server_span(stack, "i1")) == refused(sc.CONTINUITY_UNKNOWN, sc.OFFER_HISTORY_UNKNOWN, None)
        held = min(t1["params"]["remote_num_tokens"], len(nxt))
        assert offer_view(server_span(stack, "i2")) == extended(held)
        assert p_decision(stack, "i2")[sc.KV_VERIFIED] == sc.VERIFIED_MATCH


# ---------------------------------------------------------------------- row 2: n > 1, kind switch
async def test_chat_with_n_above_one_under_another_conversations_id_is_not_offered(tracer_provider, span_exporter):
    async with sim_proxy(tracer_provider, span_exporter) as stack:
        await chat_turns(stack, [SYSTEM, {"role": "user", "content": TEXT}], "a0")
        other = [{"role": "user", "content": "an unrelated question about rivers"}]
        status, body = await post(stack, CHAT, {"messages": other, "n": 2}, rid="b1")
        assert status == 400 and body["error"]["param"] == "n"  # the simulator serves n=1 only; vLLM would answer
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
        view = refused(sc.CONTINUITY_REUSED_ID, sc.OFFER_REUSED_ID, **{sc.HTTP_RESPONSE_STATUS_CODE: 400})
        del view[sc.KV_OUTCOME], view[sc.KV_PULLED_TOKENS]  # P refused the request: no decision
        assert offer_view(server_span(stack, "b1")) == view
        (p_leg,) = [s for s in stack.spans(sc.SPAN_PROXY_PREFILL) if s.attributes[sc.GEN_AI_REQUEST_ID] == "b1"]
        assert p_leg.attributes[sc.PROXY_OFFER] is False


async def test_a_chat_turn_after_a_completions_turn_of_the_session_is_not_offered(tracer_provider, span_exporter):
    async with sim_proxy(tracer_provider, span_exporter) as stack:
        await post(stack, COMPLETIONS, {"prompt": TEXT}, rid="a0")
        await chat_turns(stack, [{"role": "user", "content": TEXT}], "a1")
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
        assert offer_view(server_span(stack, "a1")) == refused(sc.CONTINUITY_REUSED_ID, sc.OFFER_REUSED_ID)


# ---------------------------------------------------------------------- row 3: out-of-order turns
async def test_an_older_turn_finishing_after_newer_ones_changes_neither_table(tracer_provider, span_exporter):
    """Turn 1 (older) is held at D's relay while turns 2 and 3 run to the end; then it finishes."""
    async with sim_proxy(tracer_provider, span_exporter, hold_decode=True) as stack:
        table, chains = stack.proxy.proxy.table, stack.proxy.proxy.chains
        _, history = await chat_turns(stack, [SYSTEM, {"role": "user", "content": TEXT}], "t0")
        release = stack.held.hold("old")
        older = asyncio.create_task(chat_turns(stack, history + [{"role": "user", "content": "sub-agent A"}], "old"))
        await stack.wait_spans(sc.SPAN_KV_DECISION, 4)  # turn 0's two decisions, then turn 1's on P and on D
        assert stack.held.arrived == {"old"}  # D answered turn 1; the relay holds it
        t2, newer = await chat_turns(stack, history + [{"role": "user", "content": "sub-agent B"}], "new")
        t3, newest = await chat_turns(stack, newer + [{"role": "user", "content": "go on"}], "t3")
        assert (table.peek("c1").turn, chains.turn("c1")) == (3, 3)
        release.set()
        _, older_history = await older
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 4)
        assert (table.peek("c1").turn, chains.turn("c1"), chains.stale_turns) == (3, 3, 1)
        late, _ = await chat_turns(stack, older_history + [{"role": "user", "content": "A again"}], "late-a")
        t5_msgs = newest + [{"role": "user", "content": "and then"}]
        await chat_turns(stack, t5_msgs, "t5")
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 6)
        views = {rid: offer_view(server_span(stack, rid)) for rid in ("new", "t3", "late-a", "t5")}
        late_msgs = older_history + [{"role": "user", "content": "A again"}]
        lost = lambda d, msgs: {sc.SESSION_REUSABLE_TOKENS_LOST: min(d["remote_num_tokens"], chat_tokens(msgs))}  # noqa: E731
        assert views == {
            "new": refused(sc.CONTINUITY_EXTENDS, sc.OFFER_NO_ENTRY, None),  # turn 1 took turn 0's blocks
            "t3": extended(t2["params"]["remote_num_tokens"]),
            # A's history differs from the newest turn's (turn 3) at message 3: before, turn 1's late end
            # had replaced the prefix record while D's blocks stayed turn 3's, and this was offered them
            "late-a": refused(sc.CONTINUITY_DIVERGED, sc.OFFER_DIVERGED, 3, **lost(t3["params"], late_msgs)),
            "t5": refused(sc.CONTINUITY_DIVERGED, sc.OFFER_DIVERGED, 3, **lost(late["params"], t5_msgs)),
        }
        assert p_decision(stack, "t3")[sc.KV_VERIFIED] == sc.VERIFIED_MATCH


# ---------------------------------------------------------------------- row 4: eviction
async def test_a_session_the_prefix_table_evicts_loses_its_blocks_too(tracer_provider, span_exporter):
    async with sim_proxy(tracer_provider, span_exporter, max_chain_bytes=3000) as stack:
        table, chains = stack.proxy.proxy.table, stack.proxy.proxy.chains
        await chat_turns(stack, [SYSTEM, {"role": "user", "content": TEXT}], "v0", conv="victim")
        assert table.peek("victim") is not None and chains.turn("victim") == 0
        crowd = [[{"role": "user", "content": f"id-less chat number {i} about tools"}] for i in range(12)]
        sem = asyncio.Semaphore(4)

        async def one(i, msgs):
            async with sem:
                return await post(stack, CHAT, {"messages": msgs}, conv=None, rid=f"x{i}")

        results = await asyncio.gather(*(one(i, m) for i, m in enumerate(crowd)))
        assert [status for status, _ in results] == [200] * 12
        assert chains.turn("victim") is None and table.peek("victim") is None  # evicted together
        attacker = [{"role": "user", "content": "what did the victim's agent plan?"}]
        await chat_turns(stack, attacker, "attack", conv="victim")
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 14)
        assert offer_view(server_span(stack, "attack")) == refused(sc.CONTINUITY_NEW, sc.OFFER_NO_ENTRY, None)


# ---------------------------------------------------------------------- row 5: what else renders
@pytest.mark.parametrize(
    "change",
    [
        {"tools": [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]},
        {"chat_template_kwargs": {"enable_thinking": True}},
    ],
    ids=["tools", "chat_template_kwargs"],
)
async def test_a_continuation_that_changes_tools_or_template_kwargs_is_not_offered(
    tracer_provider, span_exporter, change
):
    async with sim_proxy(tracer_provider, span_exporter) as stack:
        t0, history = await chat_turns(stack, [SYSTEM, {"role": "user", "content": TEXT}], "a0")
        msgs = history + [{"role": "user", "content": "next"}]
        await chat_turns(stack, msgs, "a1", **change)
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
        lost = min(t0["params"]["remote_num_tokens"], chat_tokens(msgs))
        assert offer_view(server_span(stack, "a1")) == refused(
            sc.CONTINUITY_DIVERGED, sc.OFFER_DIVERGED, 0, **{sc.SESSION_REUSABLE_TOKENS_LOST: lost}
        )


async def test_content_parts_are_equal_to_the_string_vllm_joins_them_into_and_different_otherwise(
    tracer_provider, span_exporter
):
    parts = [{"type": "text", "text": "first line of the task"}, {"type": "text", "text": TEXT}]
    joined = "first line of the task\n" + TEXT
    async with sim_proxy(tracer_provider, span_exporter) as stack:
        t0, history = await chat_turns(stack, [SYSTEM, {"role": "user", "content": joined}], "a0")
        as_parts = [SYSTEM, {"role": "user", "content": parts}, *history[2:], {"role": "user", "content": "next"}]
        t1, history1 = await chat_turns(stack, as_parts, "a1")
        glued = [SYSTEM, {"role": "user", "content": "first line of the task" + TEXT}, *history1[2:]]
        glued.append({"role": "user", "content": "more"})
        await chat_turns(stack, glued, "a2")
        await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 3)
        held = t0["params"]["remote_num_tokens"]
        assert offer_view(server_span(stack, "a1")) == extended(held)
        assert p_decision(stack, "a1")[sc.KV_VERIFIED] == sc.VERIFIED_MATCH  # the rendered tokens are equal
        lost = min(t1["params"]["remote_num_tokens"], chat_tokens(glued))
        assert offer_view(server_span(stack, "a2")) == refused(
            sc.CONTINUITY_DIVERGED, sc.OFFER_DIVERGED, 1, **{sc.SESSION_REUSABLE_TOKENS_LOST: lost}
        )
