"""Merge what P and D returned into the client-facing ``kv_transfer`` object.

Called by :mod:`kvtrace.proxy.app` once D's leg has produced its final ``kv_transfer_params``.
Instrumented workers (kvtrace connector or simulator) put a ``kvtrace`` object (``sc.KVT_*``
fields, made by ``KVRecorder.request_finished``) inside their ``kv_transfer_params``; those are
authoritative.  For plain vLLM workers the object is derived from what the raw parameters and
P's ``usage`` allow: prompt and cached tokens, the ``remote_num_tokens`` the proxy offered, and the
blocks D says it retains.  Unknown values are ``null``; the key set is always the same.
"""

from __future__ import annotations

from kvtrace import semconv as sc

# fields copied from P's kvtrace object (the d2p decision happens on P)
_FROM_PREFILL = (
    sc.KVT_DECISION,
    sc.KVT_PROMPT_TOKENS,
    sc.KVT_LOCAL_HIT_TOKENS,
    sc.KVT_REMOTE_TOKENS,
    sc.KVT_PULLED_TOKENS,
    sc.KVT_RECOMPUTED_TOKENS,
    sc.KVT_BYTES,
    sc.KVT_TRANSFER_MS,
    sc.KVT_PEER_ENGINE_ID,
)
# fields copied from D's kvtrace object (what D keeps for the next turn)
_FROM_DECODE = (sc.KVT_RETAINED_BLOCKS, sc.KVT_RETAINED_BYTES, sc.KVT_RETAINED_TTL_S)


def kvtrace_object(params: object) -> dict | None:
    """The ``kvtrace`` entry of a worker's kv_transfer_params, if it is a dict."""
    if isinstance(params, dict):
        obj = params.get(sc.KV_PARAMS_KEY)
        if isinstance(obj, dict):
            return obj
    return None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _raw_prefill(p_usage: object, offered_params: dict | None) -> dict:
    """Prefill-side fields derivable without the kvtrace connector."""
    usage = p_usage if isinstance(p_usage, dict) else {}
    prompt = _int(usage.get("prompt_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
    out = dict.fromkeys(_FROM_PREFILL)
    out[sc.KVT_PROMPT_TOKENS] = prompt
    if offered_params is None:
        out.update({sc.KVT_REMOTE_TOKENS: 0, sc.KVT_PULLED_TOKENS: 0, sc.KVT_BYTES: 0})
        out[sc.KVT_LOCAL_HIT_TOKENS] = cached
    else:
        out[sc.KVT_REMOTE_TOKENS] = _int(offered_params.get("remote_num_tokens"))
        out[sc.KVT_PEER_ENGINE_ID] = offered_params.get("remote_engine_id")
    if prompt is not None and cached is not None:
        out[sc.KVT_RECOMPUTED_TOKENS] = max(0, prompt - cached)
    return out


def _raw_decode(d_params: object) -> dict:
    out = dict.fromkeys(_FROM_DECODE)
    if isinstance(d_params, dict) and d_params.get("do_remote_decode"):
        ids = d_params.get("remote_block_ids")
        if isinstance(ids, list) and ids:
            first = ids[0]
            out[sc.KVT_RETAINED_BLOCKS] = len(first) if isinstance(first, list) else len(ids)
    return out


def build(
    *,
    trace_id: str,
    request_id: str,
    session_id: str | None,
    turn: int | None,
    offered: bool,
    offer_reason: str,
    offered_params: dict | None,
    p_params: object,
    p_usage: object,
    prefill_answered: bool,
    d_params: object,
    fallback: str,
    ttft_ms: float | None,
) -> dict:
    """The merged ``kv_transfer`` object (every :data:`sc.KV_TRANSFER_FIELDS` key but the
    workers-only ``engine_id``/``role``/``verified``/``kv_digest``).  ``prefill_answered``: P's leg returned 200."""
    p_obj, d_obj = kvtrace_object(p_params), kvtrace_object(d_params)
    out: dict[str, object] = {
        sc.KVT_TRACE_ID: trace_id,
        sc.KVT_REQUEST_ID: request_id,
        sc.KVT_SESSION_ID: session_id,
        sc.KVT_TURN: turn,
        sc.KVT_OFFERED: offered,
        sc.KVT_OFFER_REASON: offer_reason,
    }
    if not prefill_answered:  # P failed (decode-only fallback or error): nothing known of it
        out.update(dict.fromkeys(_FROM_PREFILL))
    else:
        raw = _raw_prefill(p_usage, offered_params if offered else None)
        out.update({k: (p_obj[k] if p_obj and p_obj.get(k) is not None else raw[k]) for k in _FROM_PREFILL})
    raw_d = _raw_decode(d_params)
    out.update({k: (d_obj[k] if d_obj and d_obj.get(k) is not None else raw_d[k]) for k in _FROM_DECODE})
    out[sc.KVT_PREFILL] = p_obj
    out[sc.KVT_DECODE] = d_obj
    out[sc.KVT_FALLBACK] = fallback
    out[sc.KVT_TTFT_MS] = ttft_ms
    return out
