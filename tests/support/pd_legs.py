"""The two legs of a P/D turn driven by hand, the way vLLM's multi-turn disaggregation proxy drives
workers: the P leg gets ``max_tokens=1``, ``stream=false`` and ``kv_transfer_params`` with
``do_remote_decode`` (plus D's cached params from the previous turn); the D leg streams with P's
returned params."""

from __future__ import annotations

import json

from kvtrace import semconv as sc

P_LEG_BASE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def sse_events(raw: str) -> list:
    """The JSON events of a complete SSE body (one that ends with [DONE])."""
    assert raw.endswith("data: [DONE]\n\n")
    return [json.loads(block[6:]) for block in raw.split("\n\n") if block.startswith("data: {")]


async def p_leg(session, cluster, body: dict, rid: str, cached: dict | None, ctx: dict | None = None, i: int = 0):
    """(status, JSON body) of P worker ``i``'s answer to the prefill-only request."""
    params = dict(P_LEG_BASE)
    if cached:
        params.update({k: v for k, v in cached.items() if k != sc.KV_PARAMS_KEY})
    if ctx:
        params[sc.KV_PARAMS_KEY] = dict(ctx)
        digest = (cached or {}).get(sc.KV_PARAMS_KEY, {}).get(sc.KVT_DIGEST)
        if digest is not None:  # D's identity of its blocks travels beside the trace context
            params[sc.KV_PARAMS_KEY][sc.KVT_DIGEST] = digest
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    req = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": params}
    async with session.post(cluster.prefill_urls[i] + path, json=req, headers={"X-Request-Id": rid}) as resp:
        return resp.status, await resp.json()


async def d_leg(session, cluster, body: dict, rid: str, p_params: dict, max_tokens: int, ctx: dict | None = None):
    """(SSE events, the final event's kv_transfer_params) of D's streamed answer."""
    params = {k: v for k, v in p_params.items() if k != sc.KV_PARAMS_KEY}
    if ctx:
        params[sc.KV_PARAMS_KEY] = ctx
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    req = {
        **body,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "kv_transfer_params": params,
    }
    async with session.post(cluster.decode_urls[0] + path, json=req, headers={"X-Request-Id": rid}) as resp:
        assert resp.status == 200
        events = sse_events(await resp.text())
    final = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(final) == 1
    return events, final[0]["kv_transfer_params"]
