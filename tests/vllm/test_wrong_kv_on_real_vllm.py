"""The wrong KV, on real vLLM (CPU build, NIXL on loopback): a conversation continued under its id
with a history that no longer matches what D's blocks hold, offered by id alone as vLLM's example
proxy does; the conversations are described in support/vllm_wrong_kv.py.

- vLLM's NixlConnector pulls D's blocks anyway and the greedy answer differs from a cold recompute
  of the same prompt;
- KVTraceNixlConnector ``verify: record`` lets it pull and its decision span says ``mismatch`` at
  the first differing digest chunk; ``verify: enforce`` loads only the verified prefix (or nothing)
  and answers what the cold recompute answers;
- the kvtrace proxy, which sees chat histories, does not offer a diverged turn at all.

Two server configurations, each started once (class / module fixtures): plain P + D, then P record,
P enforce and one D.  Assertions are on tokens, P's counters and spans, never on latency.
"""

from __future__ import annotations

import pytest

from kvtrace import kvdigest
from kvtrace import semconv as sc

from support.require import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
require_vllm()
require_vllm("nixl")

from support import vllm_rig as rig  # noqa: E402
from support import vllm_wrong_kv as wk  # noqa: E402
from support.tokens import first_difference  # noqa: E402

BROKEN = ("rewritten", "reasoning_dropped")
P_CACHED = wk.PROMPT_TOKENS // rig.CPU_BLOCK_SIZE * rig.CPU_BLOCK_SIZE  # P's turn 1 leaves its whole blocks cached
THRESHOLD = 64


def _local_hit(conv: wk.Conversation) -> int:
    """P's prefix-cache hit on turn 2: the whole blocks turn 2 shares with turn 1's cached prompt."""
    common = min(first_difference(conv.prompt2, conv.held), P_CACHED)
    return common // rig.CPU_BLOCK_SIZE * rig.CPU_BLOCK_SIZE


def _digest(conv: wk.Conversation) -> dict:
    """D's digest of turn 1's blocks, as its params carried it."""
    return conv.turn1.d_params[sc.KV_PARAMS_KEY][sc.KVT_DIGEST]


def _offered(conv: wk.Conversation) -> int:
    """What vLLM's rule would load up to: min(remote_num_tokens, prompt)."""
    return min(conv.turn1.d_params["remote_num_tokens"], len(conv.prompt2))


# ---------------------------------------------------------------------------- vLLM's NixlConnector
@pytest.fixture(scope="class")
def plain_run(tmp_path_factory):
    return wk.run_plain(tmp_path_factory.mktemp("plain"))


class TestPlainNixlConnector:
    @pytest.mark.parametrize("case", BROKEN)
    def test_p_pulls_the_other_historys_kv_and_the_answer_differs_from_a_cold_recompute(self, plain_run, case):
        conv = plain_run[case]
        first = first_difference(conv.prompt2, conv.held)
        assert first == {"rewritten": wk.REWRITE_AT, "reasoning_dropped": wk.PROMPT_TOKENS}[case]
        # vLLM's rule: everything D offers beyond P's cache, although D's KV from `first` on is other tokens'
        assert plain_run[f"{case}_loaded"] == _offered(conv) - _local_hit(conv) >= _offered(conv) - first > 0
        assert len(conv.answer) == len(conv.cold) == wk.ANSWER_TOKENS
        # measured: all 8 greedy tokens differ, from the first (rewritten 28 / cold 264, dropped 144 / 308)
        assert conv.answer[0] != conv.cold[0], (conv.answer, conv.cold)


# ---------------------------------------------------------------------------- KVTraceNixlConnector
@pytest.fixture(scope="module")
def kvtrace_run(tmp_path_factory):
    return wk.run_kvtrace(tmp_path_factory.mktemp("kvtrace"))


def _expected_decision(run, conv: wk.Conversation, mode: str) -> dict:
    """P's decision span for ``conv``'s turn 2, from the tokens alone: D's digest proves the prompt up
    to the first differing chunk; record loads what vLLM's rule loads; enforce at most that proof."""
    p, d = run["servers"][f"p_{mode}"], run["servers"]["d"]
    local, offered, n = _local_hit(conv), _offered(conv), len(conv.prompt2)
    first = first_difference(conv.prompt2, conv.held)
    if first >= offered:
        verification = {sc.KV_VERIFIED: sc.VERIFIED_MATCH, sc.KV_VERIFY_MODE: mode, sc.KV_VERIFIED_TOKENS: offered}
        verified = offered
    else:
        chunk = _digest(conv)[sc.DIGEST_CHUNK]
        verified = first // chunk * chunk
        verification = {
            sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
            sc.KV_VERIFY_MODE: mode,
            sc.KV_VERIFIED_TOKENS: verified,
            sc.KV_VERIFY_MISMATCH_TOKEN: verified,
            sc.KV_VERIFY_WRONG_TOKENS: offered - max(verified, local),
        }
    loadable = (verified if mode == sc.VERIFY_ENFORCE else offered) - local
    pulled = loadable if loadable >= THRESHOLD else 0
    outcome = sc.OUTCOME_PULLED if pulled else sc.OUTCOME_UNVERIFIED
    return {  # the offer came as D returned it: no kvtrace context, so no session or turn
        sc.GEN_AI_REQUEST_ID: conv.turn2.request_id,
        sc.ENGINE_ID: p.engine_id,
        sc.ENGINE_ROLE: sc.ROLE_PREFILL,
        sc.KV_DIRECTION: sc.DIRECTION_D2P,
        sc.KV_PROMPT_TOKENS: n,
        sc.KV_LOCAL_HIT_TOKENS: local,
        sc.KV_REMOTE_TOKENS: offered,
        sc.KV_PULLED_TOKENS: pulled,
        sc.KV_RECOMPUTED_TOKENS: n - local - pulled,
        sc.KV_THRESHOLD: THRESHOLD,
        sc.KV_LOAD_FAILURE_POLICY: "fail",
        sc.KV_EXPIRY_DEADLINE: conv.turn1.d_params["remote_blocks_expiry_time"],
        sc.KV_PEER_ENGINE_ID: d.engine_id,
        sc.KV_REMOTE_REQUEST_ID: conv.turn1.d_params["remote_request_id"],
        sc.KV_OUTCOME: outcome,
        **verification,
    }


def _decision_attributes(run, conv: wk.Conversation) -> dict:
    row = wk.decision(run["traces"], conv.turn2.request_id)
    attrs = wk.span_attributes(run["traces"], row)
    remaining = attrs.pop(sc.KV_EXPIRY_REMAINING_S)
    assert 0 < remaining <= 120  # D's decoder_kv_blocks_ttl
    return attrs


class TestKVTraceConnector:
    @pytest.mark.parametrize("case", [*BROKEN, "honest"])
    def test_d_digests_its_blocks_by_vllms_block_hashes_in_128_token_chunks(self, kvtrace_run, case):
        digest = _digest(kvtrace_run[("enforce", case)])
        assert (digest[sc.DIGEST_VERSION], digest[sc.DIGEST_CHUNK]) == (kvdigest.VERSION_BLOCKS, rig.CPU_BLOCK_SIZE)
        assert len(digest[sc.DIGEST_FINGERPRINT]) == 2 * kvdigest.FINGERPRINT_BYTES

    @pytest.mark.parametrize("case", BROKEN)
    def test_record_says_mismatch_at_the_first_differing_chunk_and_lets_vllm_pull(self, kvtrace_run, case):
        conv = kvtrace_run[("record", case)]
        expected = _expected_decision(kvtrace_run, conv, sc.VERIFY_RECORD)
        assert expected[sc.KV_VERIFIED] == sc.VERIFIED_MISMATCH and expected[sc.KV_PULLED_TOKENS] > 0
        assert _decision_attributes(kvtrace_run, conv) == expected
        assert conv.turn2.p_params[sc.KV_PARAMS_KEY][sc.KVT_VERIFIED] == sc.VERIFIED_MISMATCH
        assert conv.answer[0] != conv.cold[0], (conv.answer, conv.cold)  # record changes nothing vLLM does

    @pytest.mark.parametrize("case", [*BROKEN, "honest"])
    def test_enforce_loads_only_verified_kv_and_answers_as_a_cold_recompute(self, kvtrace_run, case):
        conv = kvtrace_run[("enforce", case)]
        expected = _expected_decision(kvtrace_run, conv, sc.VERIFY_ENFORCE)
        assert (expected[sc.KV_VERIFIED], expected[sc.KV_OUTCOME]) == {
            # v2's chunk is the 128-token block: the verified prefix (128) is P's own cache, nothing to pull
            "rewritten": (sc.VERIFIED_MISMATCH, sc.OUTCOME_UNVERIFIED),
            "reasoning_dropped": (sc.VERIFIED_MISMATCH, sc.OUTCOME_UNVERIFIED),  # P's cache covers the proof
            "honest": (sc.VERIFIED_MATCH, sc.OUTCOME_PULLED),
        }[case]
        assert _decision_attributes(kvtrace_run, conv) == expected
        assert conv.answer == conv.cold

    @pytest.mark.parametrize("case", wk.PROXY_CASES)
    def test_the_kvtrace_proxy_does_not_offer_a_diverged_history(self, kvtrace_run, case):
        chat = kvtrace_run["proxy"][case]
        traces = kvtrace_run["traces"]
        [t1] = wk.rows(traces, "SELECT * FROM continuity WHERE request_id = ?", [chat.turn1_id])
        [t2] = wk.rows(traces, "SELECT * FROM continuity WHERE request_id = ?", [chat.turn2_id])
        held = t1["prompt_tokens"] + wk.TURN1_TOKENS - 1  # D's remote_num_tokens after turn 1
        # a first message rewritten shares nothing with the served conversation: to the proxy that is
        # another conversation under the same id (reused_id), whose KV is nobody's loss
        reused = case == "rewritten"
        got = {k: t2[k] for k in t2 if k not in ("trace_id", "span_id", "start_ns", "prefill_ms", "ttft_ms")}
        assert got == {
            "request_id": chat.turn2_id,
            "session_id": chat.session,
            "turn": 1,
            "agent_name": None,
            "scenario": None,
            "source": sc.SOURCE_CONVERSATION_ID,
            "continuity": sc.CONTINUITY_REUSED_ID if reused else sc.CONTINUITY_DIVERGED,
            "diverged_at": {"rewritten": 0, "reasoning_dropped": 1}[case],  # the user message / the assistant's
            "reusable_tokens_lost": None if reused else min(held, t2["prompt_tokens"]) - t2["local_hit_tokens"],
            "offer_reason": sc.OFFER_REUSED_ID if reused else sc.OFFER_DIVERGED,
            "outcome": sc.OUTCOME_NO_REMOTE,
            "prompt_tokens": t2["prompt_tokens"],
            "local_hit_tokens": t2["local_hit_tokens"],
            "pulled_tokens": 0,
            "recomputed_tokens": t2["prompt_tokens"] - t2["local_hit_tokens"],
        }
        assert reused or t2["reusable_tokens_lost"] > 0
        dec = wk.decision(traces, chat.turn2_id)
        assert (dec["remote_tokens"], dec["verified"], dec["peer_engine_id"]) == (0, None, None)  # nothing offered
        assert chat.reply == chat.cold_reply
