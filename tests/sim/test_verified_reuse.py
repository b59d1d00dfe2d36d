"""P checks D's digest before a d2p pull, through real simulator workers over HTTP.

A client drives the legs the way an id-only router does (vLLM's example proxy keys D's params on
a client-supplied conversation id and sends them back whole): it offers P one conversation's D
params with another conversation's prompt.  ``verify: record`` says where the prompts part and
still pulls (vLLM's rule); ``enforce`` pulls only the verified prefix, or recomputes.
"""

from __future__ import annotations

import aiohttp
import pytest

from kvtrace import semconv as sc
from kvtrace.sim import tokenizer
from kvtrace.sim.cluster import SimCluster

from support.sim_stack import d2p_decision as expected
from support.tokens import first_difference

BS = 16
OUT = 100  # D's output tokens on turn 0
SHARED = "the agent reads the plan and checks each step of the tool result " * 12  # 168 tokens of user text


class FakeClock:
    now = 5000.0

    def __call__(self) -> float:
        return self.now


def kv_config(verify: str | None) -> dict:
    extra = {"bidirectional_kv_xfer": True}
    if verify:
        extra[sc.KV_PARAMS_KEY] = {"verify": verify}
    return {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": extra}


async def _post(session, url: str, body: dict, rid: str, params: dict, stream: bool) -> dict:
    path = "/v1/chat/completions"
    req = {**body, "stream": stream, "kv_transfer_params": params}
    if stream:
        req["stream_options"] = {"include_usage": True}
    async with session.post(url + path, json=req, headers={"X-Request-Id": rid}) as resp:
        assert resp.status == 200, await resp.text()
        if not stream:
            return await resp.json()
        import json

        chunks = [json.loads(b[6:]) for b in (await resp.text()).split("\n\n") if b.startswith("data: {")]
        final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        return final[0]


async def first_turn(session, c: SimCluster, msgs: list, rid: str) -> tuple[dict, list[int]]:
    """P leg then D leg of a conversation's first turn: (D's params, the tokens D's blocks hold)."""
    p_params = {"do_remote_decode": True, "do_remote_prefill": False}
    p = await _post(session, c.prefill_urls[0], {"model": "m", "messages": msgs, "max_tokens": 1}, rid, p_params, False)
    d_params = {k: v for k, v in p["kv_transfer_params"].items() if k != sc.KV_PARAMS_KEY}
    final = await _post(
        session, c.decode_urls[0], {"model": "m", "messages": msgs, "max_tokens": OUT}, rid, d_params, True
    )
    d = final["kv_transfer_params"]
    prompt = tokenizer.encode(tokenizer.render_chat(msgs))
    out_ids, _ = tokenizer.generate(tokenizer.seed_for(prompt, None), OUT)
    held = prompt + out_ids[:-1]
    assert d["remote_num_tokens"] == len(held)
    return d, held


async def offer(session, c: SimCluster, msgs: list, rid: str, d_params: dict) -> dict:
    """A P leg offered ``d_params`` whole (D's kvtrace entry with its digest included)."""
    params = {**d_params, "do_remote_decode": True, "do_remote_prefill": False}
    p = await _post(session, c.prefill_urls[0], {"model": "m", "messages": msgs, "max_tokens": 1}, rid, params, False)
    return p["kv_transfer_params"][sc.KV_PARAMS_KEY]


def decision(exporter, rid: str) -> dict:
    found = [
        s
        for s in exporter.get_finished_spans()
        if s.name == sc.SPAN_KV_DECISION and s.attributes.get(sc.GEN_AI_REQUEST_ID) == rid
    ]
    assert len(found) == 1
    return dict(found[0].attributes)


def d2p_transfers(exporter) -> list:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.name == sc.SPAN_KV_TRANSFER and s.attributes[sc.KV_DIRECTION] == sc.DIRECTION_D2P
    ]


def cluster(tracer_provider, verify: str | None) -> SimCluster:
    # P without a prefix cache (the published setup's --no-enable-prefix-caching): local hit 0
    return SimCluster(
        cost=False,
        tracer_provider=tracer_provider,
        clock=FakeClock(),
        kv_config=kv_config(verify),
        no_prefix_caching=("prefill",),
    )


@pytest.mark.parametrize("verify", [None, sc.VERIFY_RECORD, sc.VERIFY_ENFORCE])
async def test_a_true_continuation_matches_and_pulls_everything_d_holds(tracer_provider, span_exporter, verify):
    msgs = [{"role": "user", "content": SHARED + "alpha"}]
    async with cluster(tracer_provider, verify) as c, aiohttp.ClientSession() as s:
        d, held = await first_turn(s, c, msgs, "a-0")
        text = "".join(tokenizer.generate(tokenizer.seed_for(held[: len(held) - OUT + 1], None), OUT)[1])
        msgs2 = msgs + [{"role": "assistant", "content": text}, {"role": "user", "content": "and then"}]
        summary = await offer(s, c, msgs2, "a-1", d)
    prompt = tokenizer.encode(tokenizer.render_chat(msgs2))
    assert prompt[: len(held)] == held
    mode = verify or sc.VERIFY_RECORD
    verification = {sc.KV_VERIFIED: sc.VERIFIED_MATCH, sc.KV_VERIFY_MODE: mode, sc.KV_VERIFIED_TOKENS: len(held)}
    assert decision(span_exporter, "a-1") == expected("a-1", d, len(prompt), len(held), sc.OUTCOME_PULLED, verification)
    assert summary[sc.KVT_VERIFIED] == sc.VERIFIED_MATCH and summary[sc.KVT_PULLED_TOKENS] == len(held)


async def test_record_says_mismatch_at_the_first_differing_chunk_and_still_pulls(tracer_provider, span_exporter):
    a = [{"role": "user", "content": SHARED + "alpha"}]
    b = [{"role": "user", "content": SHARED + "beta and a longer question about the transfer " * 4}]
    async with cluster(tracer_provider, sc.VERIFY_RECORD) as c, aiohttp.ClientSession() as s:
        d, held = await first_turn(s, c, a, "a-0")
        summary = await offer(s, c, b, "b-1", d)  # b reuses a's conversation id: the router offers a's blocks
    prompt = tokenizer.encode(tokenizer.render_chat(b))
    differ = first_difference(held, prompt)
    assert differ > 128  # the shared text spans two whole chunks
    wanted = min(len(held), len(prompt))
    verification = {
        sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
        sc.KV_VERIFY_MODE: sc.VERIFY_RECORD,
        sc.KV_VERIFIED_TOKENS: differ // 64 * 64,
        sc.KV_VERIFY_MISMATCH_TOKEN: differ // 64 * 64,
        sc.KV_VERIFY_WRONG_TOKENS: wanted - differ // 64 * 64,
    }
    # vLLM's rule: P loads every offered token, those from a's other tokens included
    assert decision(span_exporter, "b-1") == expected("b-1", d, len(prompt), wanted, sc.OUTCOME_PULLED, verification)
    assert summary[sc.KVT_VERIFIED] == sc.VERIFIED_MISMATCH and summary[sc.KVT_PULLED_TOKENS] == wanted


async def test_enforce_pulls_only_the_verified_prefix(tracer_provider, span_exporter):
    a = [{"role": "user", "content": SHARED + "alpha"}]
    b = [{"role": "user", "content": SHARED + "beta and a longer question about the transfer " * 4}]
    async with cluster(tracer_provider, sc.VERIFY_ENFORCE) as c, aiohttp.ClientSession() as s:
        d, held = await first_turn(s, c, a, "a-0")
        summary = await offer(s, c, b, "b-1", d)
        assert len(c.engines["sim-decode-0"].holds) == 0  # the pull read (and freed) a's blocks on D
    prompt = tokenizer.encode(tokenizer.render_chat(b))
    verified = first_difference(held, prompt) // 64 * 64
    assert verified >= 64
    wanted = min(len(held), len(prompt))
    verification = {
        sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
        sc.KV_VERIFY_MODE: sc.VERIFY_ENFORCE,
        sc.KV_VERIFIED_TOKENS: verified,
        sc.KV_VERIFY_MISMATCH_TOKEN: verified,
        sc.KV_VERIFY_WRONG_TOKENS: wanted - verified,
    }
    assert decision(span_exporter, "b-1") == expected("b-1", d, len(prompt), verified, sc.OUTCOME_PULLED, verification)
    assert [t.attributes[sc.KV_TRANSFER_TOKENS] for t in d2p_transfers(span_exporter)] == [verified]
    assert summary[sc.KVT_PULLED_TOKENS] == verified


async def test_enforce_recomputes_when_the_verified_prefix_misses_the_threshold(tracer_provider, span_exporter):
    a = [{"role": "user", "content": "alpha " + SHARED}]
    b = [{"role": "user", "content": "beta " + SHARED}]  # parts at the first user token
    async with cluster(tracer_provider, sc.VERIFY_ENFORCE) as c, aiohttp.ClientSession() as s:
        d, held = await first_turn(s, c, a, "a-0")
        summary = await offer(s, c, b, "b-1", d)
        assert len(c.engines["sim-decode-0"].holds) == 0  # D was told to release its blocks (vLLM's empty read)
    prompt = tokenizer.encode(tokenizer.render_chat(b))
    wanted = min(len(held), len(prompt))
    assert first_difference(held, prompt) < 64
    verification = {
        sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
        sc.KV_VERIFY_MODE: sc.VERIFY_ENFORCE,
        sc.KV_VERIFIED_TOKENS: 0,
        sc.KV_VERIFY_MISMATCH_TOKEN: 0,
        sc.KV_VERIFY_WRONG_TOKENS: wanted,
    }
    assert decision(span_exporter, "b-1") == expected("b-1", d, len(prompt), 0, sc.OUTCOME_UNVERIFIED, verification)
    assert d2p_transfers(span_exporter) == []
    assert summary[sc.KVT_DECISION] == sc.OUTCOME_UNVERIFIED


@pytest.mark.parametrize(
    ("verify", "pulled", "outcome"),
    [(sc.VERIFY_RECORD, True, sc.OUTCOME_PULLED), (sc.VERIFY_ENFORCE, False, sc.OUTCOME_UNVERIFIED)],
)
async def test_an_offer_without_a_digest_is_unverifiable(tracer_provider, span_exporter, verify, pulled, outcome):
    a = [{"role": "user", "content": SHARED + "alpha"}]
    async with cluster(tracer_provider, verify) as c, aiohttp.ClientSession() as s:
        d, held = await first_turn(s, c, a, "a-0")
        bare = {k: v for k, v in d.items() if k != sc.KV_PARAMS_KEY}  # what an uninstrumented D returns
        await offer(s, c, a + [{"role": "user", "content": "more"}], "a-1", bare)
    prompt = tokenizer.encode(tokenizer.render_chat(a + [{"role": "user", "content": "more"}]))
    n = min(len(held), len(prompt))
    verification = {sc.KV_VERIFIED: sc.VERIFIED_UNVERIFIABLE, sc.KV_VERIFY_MODE: verify, sc.KV_VERIFIED_TOKENS: 0}
    want = expected("a-1", d, len(prompt), n if pulled else 0, outcome, verification)
    assert decision(span_exporter, "a-1") == want


async def test_a_digest_copied_into_another_conversations_offer_fails_at_the_first_chunk(
    tracer_provider, span_exporter
):
    # an injected offer: b's blocks (ids, request id) with a's digest, a's prompt
    a = [{"role": "user", "content": SHARED + "alpha"}]
    b = [{"role": "user", "content": "another text entirely " * 30}]
    async with cluster(tracer_provider, sc.VERIFY_ENFORCE) as c, aiohttp.ClientSession() as s:
        da, held = await first_turn(s, c, a, "a-0")
        db, _ = await first_turn(s, c, b, "b-0")
        forged = {**db, sc.KV_PARAMS_KEY: da[sc.KV_PARAMS_KEY], "remote_num_tokens": da["remote_num_tokens"]}
        await offer(s, c, a + [{"role": "user", "content": "more"}], "a-1", forged)
    got = decision(span_exporter, "a-1")
    assert (got[sc.KV_VERIFIED], got[sc.KV_VERIFIED_TOKENS], got[sc.KV_VERIFY_MISMATCH_TOKEN]) == (
        sc.VERIFIED_MISMATCH,
        0,
        0,
    )
    assert (got[sc.KV_OUTCOME], got[sc.KV_PULLED_TOKENS]) == (sc.OUTCOME_UNVERIFIED, 0)
