"""Request bodies and headers of the P and D legs (upstream ``disagg_proxy_multiturn.py`` semantics).

P leg: the client's body with ``stream: false``, ``max_tokens: 1`` and ``max_completion_tokens``,
``min_tokens``, ``stream_options`` removed; ``kv_transfer_params`` = D's cached params from the
last turn with ``do_remote_decode: true, do_remote_prefill: false`` when offered, else upstream's
"miss" parameters.  D leg: the client's body, always streaming (with usage so the proxy can count
tokens), ``kv_transfer_params`` = what P returned.  Both legs carry the proxy's trace context as
``kv_transfer_params["kvtrace"]`` (``sc.CTX_*``) and the ``traceparent`` header.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.proxy.codec import dumps

P_LEG_DROPPED = ("max_completion_tokens", "min_tokens", "stream_options")


def _miss_params() -> dict:
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }


def context(traceparent: str, session_id: str | None, turn: int | None) -> dict:
    return {sc.CTX_TRACEPARENT: traceparent, sc.CTX_SESSION_ID: session_id, sc.CTX_TURN: turn}


def prefill_body(body: dict, offered_params: dict | None, ctx: dict) -> bytes:
    payload = {k: v for k, v in body.items() if k not in P_LEG_DROPPED}
    payload["stream"] = False
    payload["max_tokens"] = 1
    if offered_params is not None:
        kv = dict(offered_params)
        kv["do_remote_decode"] = True
        kv["do_remote_prefill"] = False
    else:
        kv = _miss_params()
    kv[sc.KV_PARAMS_KEY] = ctx
    payload["kv_transfer_params"] = kv
    return dumps(payload)


def decode_body(body: dict, p_params: dict | None, ctx: dict) -> bytes:
    """``p_params`` None = decode-only (P failed or returned nothing): D prefills locally."""
    payload = dict(body)
    payload["stream"] = True
    opts = dict(body.get("stream_options") or {})
    opts["include_usage"] = True
    payload["stream_options"] = opts
    kv = dict(p_params) if p_params else {}
    kv[sc.KV_PARAMS_KEY] = ctx
    payload["kv_transfer_params"] = kv
    return dumps(payload)


def headers(request_id: str, traceparent: str, authorization: str | None) -> dict:
    out = {sc.HEADER_REQUEST_ID: request_id, "traceparent": traceparent, "Content-Type": "application/json"}
    if authorization:
        out["Authorization"] = authorization
    return out


def cacheable(params: dict) -> bool:
    """D's params describe retained blocks P could pull next turn."""
    return bool(params.get("do_remote_decode") or params.get("remote_block_ids"))
