"""Request bodies and headers of the P and D legs (upstream ``disagg_proxy_multiturn.py`` semantics).

P leg: the client's body with ``stream: false``, ``max_tokens: 1`` and ``max_completion_tokens``,
``min_tokens``, ``stream_options`` removed; ``kv_transfer_params`` = D's cached params from the
last turn with ``do_remote_decode: true, do_remote_prefill: false`` when offered, else upstream's
"miss" parameters.  D leg: the client's body, always streaming (with usage so the proxy can count
tokens), ``kv_transfer_params`` = what P returned.  Both legs carry the proxy's trace context as
``kv_transfer_params["kvtrace"]`` (``sc.CTX_*``) and the ``traceparent`` header.
"""

from __future__ import annotations

import math

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


def _finite(value, depth: int = 0) -> bool:
    """No NaN or infinity anywhere in a parsed JSON value (``json.loads`` reads ``NaN`` and
    ``1e400``); nesting deeper than a worker's params ever go counts as not finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if depth > 8:
        return False
    if isinstance(value, dict):
        return all(_finite(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v, depth + 1) for v in value)
    return True


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _block_ids(value) -> bool:
    """vLLM's ``remote_block_ids``: block ids, or one list of them per KV cache group."""
    return isinstance(value, list) and all(
        (_int(b) and b >= 0) or (isinstance(b, list) and all(_int(i) and i >= 0 for i in b)) for b in value
    )


_FIELD_CHECKS = {
    "do_remote_decode": (lambda v: isinstance(v, bool), "a boolean"),
    "do_remote_prefill": (lambda v: isinstance(v, bool), "a boolean"),
    "remote_engine_id": (lambda v: isinstance(v, str), "a string"),
    "remote_request_id": (lambda v: isinstance(v, str), "a string"),
    "remote_port": (lambda v: _int(v) and 0 < v < 65536, "a port"),
    "tp_size": (lambda v: _int(v) and v > 0, "a positive integer"),
    "remote_block_ids": (_block_ids, "a list of block ids"),
}
"""The fields of P's ``kv_transfer_params`` D's connector reads, and what each must be (when
present and not null)."""


def unusable_params(params: object) -> str | None:
    """Why P's ``kv_transfer_params`` cannot be handed to D (not an object, a field of the wrong
    type, a non-finite number), or None when it can; D then prefills locally: the decode-only
    fallback, recorded as such."""
    if not isinstance(params, dict):
        return f"kv_transfer_params is {type(params).__name__}, not an object"
    if not _finite(params):
        return "kv_transfer_params holds a non-finite number"
    for key, (ok, what) in _FIELD_CHECKS.items():
        value = params.get(key)
        if value is not None and not ok(value):
            return f"kv_transfer_params.{key} is not {what}"
    return None
