"""Acceptance: sessions without any id found by prefix matching, continuity per turn, and a
client that strips reasoning — the official openai client through the proxy and the simulator."""

from __future__ import annotations

import openai
import pytest

from kvtrace import semconv as sc

from support.sim_stack import MAX_TOKENS

SYSTEM = {"role": "system", "content": "you are a careful travel agent"}
THINKING = {"chat_template_kwargs": {"enable_thinking": True}}


def _client(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=stack.proxy.url + "/v1", api_key="none", max_retries=0)


async def _ask(client, messages, stream=True, **extra) -> tuple[str, str]:
    """(content, reasoning) of one answer, as a plain openai client reads it."""
    if not stream:
        r = await client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS, **extra)
        msg = r.choices[0].message
        return msg.content or "", getattr(msg, "reasoning", None) or ""
    stream = await client.chat.completions.create(
        model="m", messages=messages, max_tokens=MAX_TOKENS, stream=True, **extra
    )
    content, reasoning = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            reasoning.append(getattr(choice.delta, "reasoning", None) or "")
    return "".join(content), "".join(reasoning)


async def _conversation(client, first: str, turns: int, stream=True, **extra) -> list[dict]:
    messages = [SYSTEM, {"role": "user", "content": first}]
    for i in range(turns):
        text, _ = await _ask(client, messages, stream, **extra)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"now step {i} please"}]
    return messages


def _attrs(spans, *names):
    return [tuple(s.attributes.get(n) for n in names) for s in spans]


@pytest.mark.parametrize("stream", [True, False])
async def test_openai_client_without_any_id_pulls_via_prefix_matching(make_stack, stream):
    """vLLM's v2 multi-turn benchmark style (no conversation_id, no header) gets the outcome mix of
    v1 with --send-conversation-id."""
    stack = await make_stack()
    client = _client(stack)
    await _conversation(client, "plan four days in Lisbon", 4, stream)
    await _conversation(client, "plan four days in Porto", 4, stream, extra_body={sc.BODY_CONVERSATION_ID: "v1"})
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 8)
    no_id, with_id = servers[:4], servers[4:]
    want = [sc.OUTCOME_NO_REMOTE, sc.OUTCOME_PULLED, sc.OUTCOME_PULLED, sc.OUTCOME_PULLED]
    assert [a[0] for a in _attrs(no_id, sc.KV_OUTCOME)] == want == [a[0] for a in _attrs(with_id, sc.KV_OUTCOME)]
    continuity = [sc.CONTINUITY_NEW] + [sc.CONTINUITY_EXTENDS] * 3
    (session,) = {a[0] for a in _attrs(no_id, sc.SESSION_ID)}
    assert session.startswith(sc.PREFIX_SESSION_PREFIX)
    assert _attrs(no_id, sc.SESSION_SOURCE, sc.TURN_INDEX, sc.SESSION_CONTINUITY, sc.PROXY_OFFER_REASON) == [
        (sc.SOURCE_PREFIX, t, c, sc.OFFER_OFFERED if t else sc.OFFER_NO_ENTRY) for t, c in enumerate(continuity)
    ]
    assert _attrs(with_id, sc.SESSION_ID, sc.SESSION_SOURCE, sc.TURN_INDEX, sc.SESSION_CONTINUITY) == [
        ("v1", sc.SOURCE_CONVERSATION_ID, t, c) for t, c in enumerate(continuity)
    ]
    pulled = [s.attributes[sc.KV_PULLED_TOKENS] for s in no_id[1:]]
    assert all(p >= 64 for p in pulled) and pulled == [s.attributes[sc.KV_PULLED_TOKENS] for s in with_id[1:]]
    health = stack.proxy.proxy.health_body()
    assert (health["prefix_sessions"], health["prefix_index"]) == (2, 4)  # request end + reply end each


async def test_interleaved_id_less_conversations_keep_their_own_sessions(make_stack):
    stack = await make_stack()
    client = _client(stack)
    histories = {k: [SYSTEM, {"role": "user", "content": f"question about {k}"}] for k in ("owls", "hawks", "kites")}
    for i in range(3):
        for history in histories.values():
            text, _ = await _ask(client, history)
            history += [{"role": "assistant", "content": text}, {"role": "user", "content": f"more {i}"}]
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 9)
    sessions = [s.attributes[sc.SESSION_ID] for s in servers]
    assert len(set(sessions)) == 3 and sessions[:3] * 3 == sessions
    assert [s.attributes[sc.TURN_INDEX] for s in servers] == [0] * 3 + [1] * 3 + [2] * 3
    assert [s.attributes[sc.KV_OUTCOME] for s in servers] == [sc.OUTCOME_NO_REMOTE] * 3 + [sc.OUTCOME_PULLED] * 6


@pytest.mark.parametrize("keep", [True, False])
async def test_stripped_reasoning_diverges_at_that_assistant_message(make_stack, keep):
    stack = await make_stack()
    client = _client(stack)
    messages = [SYSTEM, {"role": "user", "content": "find a quiet hotel"}]
    for i in range(3):
        content, reasoning = await _ask(client, messages, extra_body=THINKING)
        assert reasoning and content  # the simulator thinks first (enable_thinking)
        reply = {"role": "assistant", "content": content, **({"reasoning": reasoning} if keep else {})}
        messages += [reply, {"role": "user", "content": f"and turn {i + 1}?"}]
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 3)
    decisions = {
        d.attributes[sc.GEN_AI_REQUEST_ID]: d.attributes
        for d in stack.spans(sc.SPAN_KV_DECISION)
        if d.attributes[sc.KV_DIRECTION] == sc.DIRECTION_D2P
    }
    prompts = [decisions[s.attributes[sc.GEN_AI_REQUEST_ID]][sc.KV_PROMPT_TOKENS] for s in servers]
    held = [p + MAX_TOKENS - 1 for p in prompts]  # what D computed (and keeps) for each turn
    got = _attrs(servers, sc.SESSION_CONTINUITY, sc.SESSION_DIVERGED_AT, sc.PROXY_OFFER_REASON, sc.KV_OUTCOME)
    if keep:
        assert (
            got
            == [(sc.CONTINUITY_NEW, None, sc.OFFER_NO_ENTRY, sc.OUTCOME_NO_REMOTE)]
            + [(sc.CONTINUITY_EXTENDS, None, sc.OFFER_OFFERED, sc.OUTCOME_PULLED)] * 2
        )
        assert all(sc.SESSION_REUSABLE_TOKENS_LOST not in s.attributes for s in servers)
        return
    # the assistant message of the previous turn lost its reasoning: index 2, then 4
    assert got == [
        (sc.CONTINUITY_NEW, None, sc.OFFER_NO_ENTRY, sc.OUTCOME_NO_REMOTE),
        (sc.CONTINUITY_DIVERGED, 2, sc.OFFER_DIVERGED, sc.OUTCOME_NO_REMOTE),
        (sc.CONTINUITY_DIVERGED, 4, sc.OFFER_DIVERGED, sc.OUTCOME_NO_REMOTE),
    ]
    for turn, server in enumerate(servers[1:], 1):
        d = decisions[server.attributes[sc.GEN_AI_REQUEST_ID]]
        lost = max(0, min(held[turn - 1], d[sc.KV_PROMPT_TOKENS]) - d[sc.KV_LOCAL_HIT_TOKENS])
        assert server.attributes[sc.SESSION_REUSABLE_TOKENS_LOST] == lost > 0
        assert d[sc.KV_RECOMPUTED_TOKENS] == d[sc.KV_PROMPT_TOKENS] - d[sc.KV_LOCAL_HIT_TOKENS]
    assert stack.proxy.proxy.table.peek(servers[0].attributes[sc.SESSION_ID]).turn == 2  # the dropped entry is gone


async def test_id_less_client_that_strips_reasoning_is_still_found(make_stack):
    """The request-end hash finds the session even when the reply came back changed."""
    stack = await make_stack()
    client = _client(stack)
    messages = [SYSTEM, {"role": "user", "content": "a museum for a rainy day"}]
    for i in range(2):
        content, _ = await _ask(client, messages, extra_body=THINKING)
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"next {i}"}]
    first, second = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
    assert first.attributes[sc.SESSION_ID] == second.attributes[sc.SESSION_ID]
    assert _attrs([second], sc.SESSION_SOURCE, sc.TURN_INDEX, sc.SESSION_CONTINUITY, sc.SESSION_DIVERGED_AT) == [
        (sc.SOURCE_PREFIX, 1, sc.CONTINUITY_DIVERGED, 2)
    ]


async def test_retry_of_the_last_request_extends_and_a_truncated_history_diverges(make_stack):
    stack = await make_stack()
    client = _client(stack)
    messages = [SYSTEM, {"role": "user", "content": "where to eat"}]
    text, _ = await _ask(client, messages, extra_body={sc.BODY_CONVERSATION_ID: "c"})
    longer = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": "cheaper?"}]
    await _ask(client, longer, extra_body={sc.BODY_CONVERSATION_ID: "c"})
    await _ask(client, longer, extra_body={sc.BODY_CONVERSATION_ID: "c"})  # the same request again
    await _ask(client, messages, extra_body={sc.BODY_CONVERSATION_ID: "c"})  # history cut back to turn 0
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 4)
    assert _attrs(servers, sc.SESSION_CONTINUITY, sc.SESSION_DIVERGED_AT) == [
        (sc.CONTINUITY_NEW, None),
        (sc.CONTINUITY_EXTENDS, None),
        (sc.CONTINUITY_EXTENDS, None),
        (sc.CONTINUITY_DIVERGED, 2),
    ]
