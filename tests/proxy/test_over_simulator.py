"""Acceptance: the proxy over the zero-cost simulator — multi-turn reuse, metadata == spans,
TTL expiry, several workers, concurrent turns, the official openai client."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from opentelemetry.trace import SpanKind

from kvtrace import semconv as sc
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.proxy.server import start
from kvtrace.sim.cluster import SimCluster

from support.sim_stack import CHAT, MAX_TOKENS, Clock, worker


def _children(spans, parent):
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def _one(spans, parent, name):
    (child,) = [s for s in _children(spans, parent) if s.name == name]
    return child


async def _conversation(stack, turns, conv="c1", **kw):
    messages, finals = [{"role": "user", "content": "plan a trip to the mountains in spring"}], []
    for i in range(turns):
        text, chunks, header = await stack.chat(messages, conv=conv, **kw)
        finals.append((chunks, header))
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"more detail on step {i}"}]
    return finals


async def test_multi_turn_reuse_and_metadata_equals_spans(make_stack):
    stack = await make_stack()
    finals = await _conversation(stack, 3)
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 3)
    spans = stack.spans()
    p_engine, d_engine = stack.cluster.prefill[0].engine.engine_id, stack.cluster.decode[0].engine.engine_id
    prev_d_request = None
    for turn, ((chunks, header), server) in enumerate(zip(finals, servers, strict=True)):
        final = chunks[-1]
        assert final["choices"][0]["finish_reason"] == "length"
        assert all(sc.RESPONSE_KV_TRANSFER not in c for c in chunks[:-1])  # only the final chunk is patched
        assert all(not c["choices"] or c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
        kv = final[sc.RESPONSE_KV_TRANSFER]
        trace_id = format(server.context.trace_id, "032x")
        assert header == trace_id == kv[sc.KVT_TRACE_ID]
        p_leg, d_leg = _one(spans, server, sc.SPAN_PROXY_PREFILL), _one(spans, server, sc.SPAN_PROXY_DECODE)
        eng_p, eng_d = _one(spans, p_leg, sc.SPAN_ENGINE_PREFILL), _one(spans, d_leg, sc.SPAN_ENGINE_DECODE)
        decision = _one(spans, eng_p, sc.SPAN_KV_DECISION)
        assert server.kind == SpanKind.SERVER and p_leg.kind == d_leg.kind == SpanKind.CLIENT
        rid = server.attributes[sc.GEN_AI_REQUEST_ID]
        ident = {sc.GEN_AI_REQUEST_ID: rid, sc.SESSION_ID: "c1", sc.GEN_AI_CONVERSATION_ID: "c1", sc.TURN_INDEX: turn}
        offered = turn > 0
        outcome = sc.OUTCOME_PULLED if offered else sc.OUTCOME_NO_REMOTE
        d = decision.attributes
        attrs = dict(server.attributes)
        assert attrs.pop(sc.REQUEST_LATENCY_MS) >= attrs.pop(sc.REQUEST_TTFT_MS) == kv[sc.KVT_TTFT_MS] > 0
        age = attrs.pop(sc.PROXY_ENTRY_AGE_S, None)
        assert (age is not None) == offered
        assert attrs == {
            **ident,
            sc.HTTP_REQUEST_METHOD: "POST",
            sc.URL_PATH: CHAT,
            sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
            sc.GEN_AI_REQUEST_MODEL: "m",
            sc.REQUEST_STREAM: True,
            sc.PROXY_OFFER: offered,
            sc.PROXY_OFFER_REASON: sc.OFFER_OFFERED if offered else sc.OFFER_NO_ENTRY,
            sc.PROXY_CONVERSATION_TTL_S: 450.0,
            sc.PROXY_DECODER_KV_TTL_S: 480.0,  # reported by the (instrumented) simulator
            sc.PROXY_FALLBACK: sc.FALLBACK_NONE,
            sc.PROXY_PREFILL_ENDPOINT: stack.cluster.prefill_urls[0],
            sc.PROXY_DECODE_ENDPOINT: stack.cluster.decode_urls[0],
            sc.GEN_AI_USAGE_INPUT_TOKENS: d[sc.KV_PROMPT_TOKENS],
            sc.GEN_AI_USAGE_OUTPUT_TOKENS: MAX_TOKENS,
            sc.GEN_AI_RESPONSE_FINISH_REASONS: ("length",),
            sc.HTTP_RESPONSE_STATUS_CODE: 200,
            sc.KV_OUTCOME: outcome,
            sc.KV_PULLED_TOKENS: d[sc.KV_PULLED_TOKENS],
            sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: d[sc.KV_LOCAL_HIT_TOKENS] + d[sc.KV_PULLED_TOKENS],
            sc.SESSION_SOURCE: sc.SOURCE_CONVERSATION_ID,
            sc.SESSION_CONTINUITY: sc.CONTINUITY_EXTENDS if turn else sc.CONTINUITY_NEW,
        }
        assert d[sc.KV_OUTCOME] == outcome and d[sc.KV_DIRECTION] == sc.DIRECTION_D2P
        assert {k: v for k, v in kv.items() if k not in (sc.KVT_PREFILL, sc.KVT_DECODE)} == {
            sc.KVT_TRACE_ID: trace_id,
            sc.KVT_REQUEST_ID: rid,
            sc.KVT_SESSION_ID: "c1",
            sc.KVT_TURN: turn,
            sc.KVT_OFFERED: offered,
            sc.KVT_OFFER_REASON: attrs[sc.PROXY_OFFER_REASON],
            sc.KVT_DECISION: outcome,
            sc.KVT_PROMPT_TOKENS: d[sc.KV_PROMPT_TOKENS],
            sc.KVT_LOCAL_HIT_TOKENS: d[sc.KV_LOCAL_HIT_TOKENS],
            sc.KVT_REMOTE_TOKENS: d[sc.KV_REMOTE_TOKENS],
            sc.KVT_PULLED_TOKENS: d[sc.KV_PULLED_TOKENS],
            sc.KVT_RECOMPUTED_TOKENS: d[sc.KV_RECOMPUTED_TOKENS],
            sc.KVT_BYTES: kv[sc.KVT_PREFILL].get(sc.KVT_BYTES, 0 if not offered else None),
            sc.KVT_TRANSFER_MS: kv[sc.KVT_PREFILL].get(sc.KVT_TRANSFER_MS),
            sc.KVT_PEER_ENGINE_ID: d_engine if offered else None,
            sc.KVT_RETAINED_BLOCKS: kv[sc.KVT_DECODE][sc.KVT_RETAINED_BLOCKS],
            sc.KVT_RETAINED_BYTES: kv[sc.KVT_DECODE][sc.KVT_RETAINED_BYTES],
            sc.KVT_RETAINED_TTL_S: 480.0,
            sc.KVT_FALLBACK: sc.FALLBACK_NONE,
            sc.KVT_TTFT_MS: kv[sc.KVT_TTFT_MS],
        }
        assert kv[sc.KVT_PREFILL][sc.KVT_ENGINE_ID] == p_engine and kv[sc.KVT_DECODE][sc.KVT_ENGINE_ID] == d_engine
        assert kv[sc.KVT_PREFILL][sc.KVT_TRACE_ID] == kv[sc.KVT_DECODE][sc.KVT_TRACE_ID] == trace_id
        if offered:
            transfer = _one(spans, decision, sc.SPAN_KV_TRANSFER)
            assert d[sc.KV_PULLED_TOKENS] >= 64 and d[sc.KV_REMOTE_REQUEST_ID] == prev_d_request
            assert transfer.attributes[sc.KV_TRANSFER_BYTES] == kv[sc.KVT_BYTES] > 0
            assert transfer.attributes[sc.KV_TRANSFER_STATUS] == sc.TRANSFER_OK
        retention = _one(spans, eng_d, sc.SPAN_KV_RETENTION) if turn < 2 else None
        if retention is not None:  # D's blocks of turns 0 and 1 were read by the next turn's P
            assert retention.attributes[sc.KV_RETENTION_OUTCOME] == sc.RETENTION_READ
            assert retention.attributes[sc.KV_RETENTION_BLOCKS] == kv[sc.KVT_RETAINED_BLOCKS]
        prev_d_request = final["kv_transfer_params"]["remote_request_id"]


async def test_paused_past_proxy_ttl_is_not_offered(make_stack):
    stack = await make_stack()
    messages = [{"role": "user", "content": "hello there, tell me a story"}]
    text, _, _ = await stack.chat(messages)
    stack.clock.t += 500  # past the proxy's 450 s and D's 480 s
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    _, chunks, _ = await stack.chat(messages)
    kv = chunks[-1][sc.RESPONSE_KV_TRANSFER]
    assert (kv[sc.KVT_OFFERED], kv[sc.KVT_OFFER_REASON], kv[sc.KVT_DECISION]) == (
        False,
        sc.OFFER_ENTRY_TOO_OLD,
        sc.OUTCOME_NO_REMOTE,
    )
    server = (await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2))[1]
    assert server.attributes[sc.PROXY_OFFER_REASON] == sc.OFFER_ENTRY_TOO_OLD
    assert server.attributes[sc.PROXY_ENTRY_AGE_S] == 500.0
    assert server.attributes[sc.KV_OUTCOME] == sc.OUTCOME_NO_REMOTE


async def test_paused_past_decoder_ttl_shows_expired(make_stack):
    kv_config = {"kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"decoder_kv_blocks_ttl": 60}}
    stack = await make_stack(kv_config=kv_config, conversation_ttl_s=10_000)
    messages = [{"role": "user", "content": "hello there, tell me a story"}]
    text, _, _ = await stack.chat(messages)
    stack.clock.t += 100  # D's 60 s TTL passed; the proxy (TTL 10000 s) still offers
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    _, chunks, _ = await stack.chat(messages)
    kv = chunks[-1][sc.RESPONSE_KV_TRANSFER]
    assert (kv[sc.KVT_OFFERED], kv[sc.KVT_OFFER_REASON], kv[sc.KVT_DECISION]) == (
        True,
        sc.OFFER_OFFERED,
        sc.OUTCOME_EXPIRED,
    )
    assert (
        kv[sc.KVT_PULLED_TOKENS] == 0
        and kv[sc.KVT_RECOMPUTED_TOKENS] == kv[sc.KVT_PROMPT_TOKENS] - kv[sc.KVT_LOCAL_HIT_TOKENS]
    )
    (transfer,) = [t for t in stack.spans(sc.SPAN_KV_TRANSFER) if t.attributes[sc.KV_DIRECTION] == sc.DIRECTION_D2P]
    assert transfer.attributes[sc.KV_TRANSFER_STATUS] == sc.TRANSFER_EXPIRED
    server = (await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2))[1]
    assert server.attributes[sc.KV_OUTCOME] == sc.OUTCOME_EXPIRED and server.attributes[sc.PROXY_ENTRY_AGE_S] == 100.0


async def test_many_workers_pull_from_the_decoder_that_holds_the_blocks(make_stack):
    stack = await make_stack(n_prefill=2, n_decode=3)
    finals = await _conversation(stack, 5)
    d_ids = [w.engine.engine_id for w in stack.cluster.decode]
    for turn, (chunks, _) in enumerate(finals):
        kv = chunks[-1][sc.RESPONSE_KV_TRANSFER]
        assert kv[sc.KVT_DECODE][sc.KVT_ENGINE_ID] == d_ids[turn % 3]  # round robin
        if turn:
            assert kv[sc.KVT_DECISION] == sc.OUTCOME_PULLED
            assert kv[sc.KVT_PEER_ENGINE_ID] == d_ids[(turn - 1) % 3]  # the D of the previous turn


async def test_concurrent_turns_of_one_conversation(make_stack):
    stack = await make_stack()
    messages = [{"role": "user", "content": "first question about rivers"}]
    text, _, _ = await stack.chat(messages)
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "and lakes?"}]
    results = await asyncio.gather(stack.chat(messages), stack.chat(messages))
    kvs = sorted((r[1][-1][sc.RESPONSE_KV_TRANSFER] for r in results), key=lambda k: k[sc.KVT_TURN])
    assert [(k[sc.KVT_TURN], k[sc.KVT_OFFER_REASON]) for k in kvs] == [(1, sc.OFFER_OFFERED), (2, sc.OFFER_NO_ENTRY)]
    assert kvs[0][sc.KVT_DECISION] == sc.OUTCOME_PULLED  # D's blocks were pulled once, not twice
    entry = stack.proxy.proxy.table.peek("c1")
    assert entry.turn == 2  # the newest turn's location is kept


async def test_session_from_header_and_baggage(make_stack):
    stack = await make_stack()
    msgs = [{"role": "user", "content": "hi"}]
    _, chunks, _ = await stack.chat(msgs, conv=None, headers={sc.HEADER_SESSION_ID: "hdr"})
    assert chunks[-1][sc.RESPONSE_KV_TRANSFER][sc.KVT_SESSION_ID] == "hdr"
    _, chunks, _ = await stack.chat(msgs, conv=None, headers={"baggage": "session.id=bag,other=1"})
    assert chunks[-1][sc.RESPONSE_KV_TRANSFER][sc.KVT_SESSION_ID] == "bag"
    _, chunks, _ = await stack.chat(msgs, conv=None, prompt_cache_key="pck")
    assert chunks[-1][sc.RESPONSE_KV_TRANSFER][sc.KVT_SESSION_ID] == "pck"
    _, chunks, _ = await stack.chat(msgs, conv=None, headers={sc.HEADER_SESSION_ID: "hdr2"}, prompt_cache_key="pck")
    assert chunks[-1][sc.RESPONSE_KV_TRANSFER][sc.KVT_SESSION_ID] == "hdr2"  # the header comes first
    _, chunks, _ = await stack.chat(msgs, conv=None)  # no id at all: the proxy names a prefix session
    kv = chunks[-1][sc.RESPONSE_KV_TRANSFER]
    assert kv[sc.KVT_SESSION_ID].startswith(sc.PREFIX_SESSION_PREFIX)
    assert (kv[sc.KVT_TURN], kv[sc.KVT_OFFER_REASON]) == (0, sc.OFFER_NO_ENTRY)
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 5)
    assert [s.attributes[sc.SESSION_SOURCE] for s in servers] == [
        sc.SOURCE_HEADER,
        sc.SOURCE_BAGGAGE,
        sc.SOURCE_PROMPT_CACHE_KEY,
        sc.SOURCE_HEADER,
        sc.SOURCE_PREFIX,
    ]


async def test_without_prefix_matching_an_id_less_request_has_no_session(make_stack):
    stack = await make_stack(prefix_match=False)
    _, chunks, _ = await stack.chat([{"role": "user", "content": "hi"}], conv=None)
    kv = chunks[-1][sc.RESPONSE_KV_TRANSFER]
    assert (kv[sc.KVT_SESSION_ID], kv[sc.KVT_TURN], kv[sc.KVT_OFFER_REASON]) == (
        None,
        None,
        sc.OFFER_NO_CONVERSATION_ID,
    )
    (server,) = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 1)
    assert server.attributes[sc.SESSION_SOURCE] == sc.SOURCE_NONE
    assert sc.SESSION_CONTINUITY not in server.attributes


async def test_incoming_traceparent_is_continued(make_stack):
    stack = await make_stack()
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    _, chunks, header = await stack.chat([{"role": "user", "content": "hi"}], headers={"traceparent": tp})
    assert header == "0af7651916cd43dd8448eb211c80319c"
    (server,) = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 1)
    assert server.parent.span_id == 0xB7AD6B7169203331 and server.parent.is_remote


async def test_non_streaming_client_gets_aggregated_body(make_stack):
    stack = await make_stack()
    messages = [{"role": "user", "content": "tell me about owls"}]
    text, obj, header = await stack.chat(messages, stream=False)
    assert obj["object"] == "chat.completion" and obj["choices"][0]["finish_reason"] == "length"
    assert obj["usage"]["completion_tokens"] == MAX_TOKENS and len(text) > 0
    assert obj[sc.RESPONSE_KV_TRANSFER][sc.KVT_TRACE_ID] == header
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "and hawks?"}]
    _, obj, _ = await stack.chat(messages, stream=False)
    assert obj[sc.RESPONSE_KV_TRANSFER][sc.KVT_DECISION] == sc.OUTCOME_PULLED


async def test_completions_route(make_stack):
    stack = await make_stack()
    body = {"model": "m", "prompt": "once upon a time", "max_tokens": 5, "stream": True, "conversation_id": "t"}
    async with stack.http.post(stack.proxy.url + "/v1/completions", json=body) as r:
        events = [ln[6:] for ln in (await r.text()).splitlines() if ln.startswith("data: ")]
    final = json.loads(events[-2])
    assert final["object"] == "text_completion" and final[sc.RESPONSE_KV_TRANSFER][sc.KVT_TURN] == 0
    (server,) = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 1)
    assert server.attributes[sc.GEN_AI_OPERATION_NAME] == sc.OP_TEXT_COMPLETION


async def test_no_patch_keeps_responses_untouched_but_still_reuses(make_stack):
    stack = await make_stack(patch_responses=False)
    messages = [{"role": "user", "content": "tell me about owls"}]
    text, chunks, header = await stack.chat(messages)
    assert header is None and all(sc.RESPONSE_KV_TRANSFER not in c for c in chunks)
    assert all(c["choices"] for c in chunks)  # the usage chunk the proxy asked for is not leaked
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "and hawks?"}]
    await stack.chat(messages)
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
    assert servers[1].attributes[sc.KV_OUTCOME] == sc.OUTCOME_PULLED


@pytest.mark.parametrize("include_usage", [False, True])
async def test_openai_client_parses_every_chunk(make_stack, include_usage):
    stack = await make_stack()
    client = openai.AsyncOpenAI(base_url=stack.proxy.url + "/v1", api_key="none", max_retries=0)
    try:
        messages = [{"role": "user", "content": "write a haiku about rain"}]
        for turn in range(2):
            extra = {"stream_options": {"include_usage": True}} if include_usage else {}
            stream = await client.chat.completions.create(
                model="m",
                messages=messages,
                max_tokens=MAX_TOKENS,
                stream=True,
                extra_body={sc.BODY_CONVERSATION_ID: "oa"},
                **extra,
            )
            chunks = [c async for c in stream]
            assert all(isinstance(c, openai.types.chat.ChatCompletionChunk) for c in chunks)
            last = chunks[-1]
            kv = last.model_extra[sc.RESPONSE_KV_TRANSFER]
            assert all(sc.RESPONSE_KV_TRANSFER not in (c.model_extra or {}) for c in chunks[:-1])
            if include_usage:
                assert last.choices == [] and last.usage.completion_tokens == MAX_TOKENS
                assert chunks[-2].choices[0].finish_reason == "length"
            else:
                assert last.choices[0].finish_reason == "length" and last.usage is None
            assert kv[sc.KVT_TURN] == turn
            assert kv[sc.KVT_DECISION] == (sc.OUTCOME_PULLED if turn else sc.OUTCOME_NO_REMOTE)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "another"}]
        resp = await client.chat.completions.create(
            model="m", messages=messages, max_tokens=4, extra_body={sc.BODY_CONVERSATION_ID: "oa"}
        )
        assert resp.model_extra[sc.RESPONSE_KV_TRANSFER][sc.KVT_TURN] == 2
    finally:
        await client.close()


class SleepClock(Clock):
    """The bench's ``sleep`` advances the shared clock (pauses cost no real time)."""

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await asyncio.sleep(0)


async def test_expired_offer_is_retried_and_answered(tracer_provider, span_exporter, caplog):
    """`kvtrace bench --scenario pause-resume --time-scale 0.02` against D with a 15 s retention and
    the proxy's default 450 s offer window: the resumed turn (after a 12 s pause) is offered blocks
    D dropped, P fails the read (500, kv_load_failure_policy=fail) and the proxy asks P again
    without them.  Before: 502 to the client and the session's later turns never ran."""
    from kvtrace.bench import api as bench

    clock = SleepClock()
    kv = {
        "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 15},
    }
    caplog.set_level("WARNING", logger="kvtrace.proxy.decoder_ttl")
    async with SimCluster(1, 1, cost=False, tracer_provider=tracer_provider, clock=clock, kv_config=kv) as cluster:
        config = ProxyConfig(
            prefill=[worker(u) for u in cluster.prefill_urls], decode=[worker(u) for u in cluster.decode_urls]
        )
        running = await start(config, tracer_provider, clock=clock, port=0)
        try:
            result = await bench.arun_bench(
                running.url,
                scenario="pause-resume",
                tracer_provider=tracer_provider,
                sleep=clock.sleep,
                seed=7,
                nonce="t",
                sessions=3,
                time_scale=0.02,
                max_active_conversations=1,
            )
        finally:
            await running.close()
    assert [s.error for s in result.sessions] == [None] * 3
    got = sorted((r.session, r.turn, r.outcome, r.offer_reason, r.error) for r in result.requests)
    assert got == [
        (s, t, outcome, sc.OFFER_NO_ENTRY if t == 0 else sc.OFFER_OFFERED, None)
        for s in sorted({r.session for r in result.requests})
        for t, outcome in enumerate([sc.OUTCOME_NO_REMOTE, sc.OUTCOME_PULLED, sc.OUTCOME_EXPIRED, sc.OUTCOME_PULLED])
    ]
    spans = span_exporter.get_finished_spans()
    resumed = [s for s in spans if s.name == sc.SPAN_PROXY_REQUEST and s.attributes[sc.TURN_INDEX] == 2]
    assert len(resumed) == 3
    for server in resumed:
        a = server.attributes
        assert (a[sc.HTTP_RESPONSE_STATUS_CODE], a[sc.KV_OUTCOME], a[sc.PROXY_PREFILL_ATTEMPTS]) == (
            200,
            sc.OUTCOME_EXPIRED,
            2,
        )
        assert (a[sc.PROXY_CONVERSATION_TTL_S], a[sc.PROXY_DECODER_KV_TTL_S], a[sc.PROXY_OFFER]) == (450.0, 15.0, True)
        assert sc.ERROR_TYPE not in a and a[sc.PROXY_ENTRY_AGE_S] >= 12
        first, retry = [s for s in _children(spans, server) if s.name == sc.SPAN_PROXY_PREFILL]
        assert (
            first.attributes[sc.PROXY_OFFER],
            first.attributes[sc.HTTP_RESPONSE_STATUS_CODE],
            first.attributes[sc.ERROR_TYPE],
        ) == (True, 500, "500")
        assert (
            retry.attributes[sc.PROXY_OFFER],
            retry.attributes[sc.PROXY_RETRY],
            retry.attributes[sc.HTTP_RESPONSE_STATUS_CODE],
        ) == (False, True, 200)
        assert sc.ERROR_TYPE not in retry.attributes
        # P saw the expired offer (its decision span says so), then prefilled without it
        failed = _one(spans, _one(spans, first, sc.SPAN_ENGINE_PREFILL), sc.SPAN_KV_DECISION)
        assert failed.attributes[sc.KV_OUTCOME] == sc.OUTCOME_EXPIRED
        fresh = _one(spans, _one(spans, retry, sc.SPAN_ENGINE_PREFILL), sc.SPAN_KV_DECISION)
        assert fresh.attributes[sc.KV_OUTCOME] == sc.OUTCOME_NO_REMOTE
        assert [e.name for e in server.events] == [sc.EVENT_UPSTREAM_ERROR, sc.EVENT_FIRST_TOKEN]
    warnings = [r.getMessage() for r in caplog.records if "block retention" in r.getMessage()]
    assert len(warnings) == 1 and "retention 15 s from decode worker" in warnings[0]


def test_startup_warns_when_the_offer_window_outlives_decoder_retention(caplog):
    from kvtrace.proxy.app import Proxy

    caplog.set_level("WARNING", logger="kvtrace.proxy.decoder_ttl")
    workers = dict(prefill=[Worker("h", 1)], decode=[Worker("h", 2)])
    Proxy(ProxyConfig(**workers, decoder_kv_ttl_s=15.0))  # default --conversation-ttl 450
    Proxy(ProxyConfig(**workers, decoder_kv_ttl_s=15.0, conversation_ttl_s=9.0))  # 9 + 5 < 15: fine
    Proxy(ProxyConfig(**workers))  # D's retention unknown: nothing to compare
    (record,) = [r for r in caplog.records if "block retention" in r.getMessage()]
    assert "--conversation-ttl 450 s" in record.getMessage() and "from --decoder-kv-ttl" in record.getMessage()
