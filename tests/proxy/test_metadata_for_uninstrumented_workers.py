"""The response metadata the proxy builds from raw kv_transfer_params and usage when the workers
are not instrumented (no kvtrace summary in their params)."""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.proxy import metadata


def test_metadata_from_raw_params_and_usage():
    offered = {"remote_num_tokens": 300, "remote_engine_id": "d7"}
    p_usage = {"prompt_tokens": 400, "prompt_tokens_details": {"cached_tokens": 256}}
    d_params = {"do_remote_decode": True, "remote_block_ids": [[1, 2, 3, 4]]}
    common = dict(
        trace_id="t",
        request_id="r",
        session_id="s",
        turn=1,
        offered_params=offered,
        p_params={},
        p_usage=p_usage,
        prefill_answered=True,
        d_params=d_params,
        fallback=sc.FALLBACK_NONE,
        ttft_ms=1.5,
    )
    kv = metadata.build(offered=True, offer_reason=sc.OFFER_OFFERED, **common)
    assert kv == {
        sc.KVT_TRACE_ID: "t",
        sc.KVT_REQUEST_ID: "r",
        sc.KVT_SESSION_ID: "s",
        sc.KVT_TURN: 1,
        sc.KVT_OFFERED: True,
        sc.KVT_OFFER_REASON: sc.OFFER_OFFERED,
        sc.KVT_DECISION: None,
        sc.KVT_PROMPT_TOKENS: 400,
        sc.KVT_LOCAL_HIT_TOKENS: None,
        sc.KVT_REMOTE_TOKENS: 300,
        sc.KVT_PULLED_TOKENS: None,
        sc.KVT_RECOMPUTED_TOKENS: 144,
        sc.KVT_BYTES: None,
        sc.KVT_TRANSFER_MS: None,
        sc.KVT_PEER_ENGINE_ID: "d7",
        sc.KVT_RETAINED_BLOCKS: 4,
        sc.KVT_RETAINED_BYTES: None,
        sc.KVT_RETAINED_TTL_S: None,
        sc.KVT_PREFILL: None,
        sc.KVT_DECODE: None,
        sc.KVT_FALLBACK: sc.FALLBACK_NONE,
        sc.KVT_TTFT_MS: 1.5,
    }
    kv = metadata.build(offered=False, offer_reason=sc.OFFER_NO_ENTRY, **common)
    assert (kv[sc.KVT_LOCAL_HIT_TOKENS], kv[sc.KVT_PULLED_TOKENS], kv[sc.KVT_REMOTE_TOKENS]) == (256, 0, 0)
    assert set(kv) == set(sc.KV_TRANSFER_FIELDS) - {sc.KVT_ENGINE_ID, sc.KVT_ROLE, sc.KVT_VERIFIED, sc.KVT_DIGEST}
