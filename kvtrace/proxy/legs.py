"""Request bodies and headers of the P and D legs (upstream ``disagg_proxy_multiturn.py`` semantics).

P leg: the client's body with ``stream: false``, ``max_tokens: 1`` and ``max_completion_tokens``,
``min_tokens``, ``stream_options`` removed; ``kv_transfer_params`` = D's cached params from the
last turn with ``do_remote_decode: true, do_remote_prefill: false`` when offered, else upstream's
"miss" parameters.  D leg: the client's body, always streaming (with usage so the proxy can count
tokens), ``kv_transfer_params`` = what P returned.  Both legs carry the proxy's trace context as
``kv_transfer_params["kvtrace"]`` (``sc.CTX_*``) and the ``traceparent`` header; an offer also
carries D's digest of what its blocks hold (``sc.KVT_DIGEST``, :mod:`kvtrace.kvdigest`) in that
entry, so P's connector can check the blocks against its prompt before it pulls them.
"""

from __future__ import annotations

import math

from kvtrace import semconv as sc
from kvtrace.jsoncodec import dumps

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
        kept = kv.get(sc.KV_PARAMS_KEY)
        digest = kept.get(sc.KVT_DIGEST) if isinstance(kept, dict) else None
        if digest is not None:  # D's identity of its blocks travels beside the trace context
            ctx = {**ctx, sc.KVT_DIGEST: digest}
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


def kept(params: dict) -> dict:
    """What the conversation table keeps of D's params: all of vLLM's fields, and of D's kvtrace
    entry only the digest of its blocks (the rest is this turn's report, not the next turn's offer)."""
    out = dict(params)  # a C-level copy, then the entry out (a comprehension costs ~3x as much)
    entry = out.pop(sc.KV_PARAMS_KEY, None)
    digest = entry.get(sc.KVT_DIGEST) if isinstance(entry, dict) else None
    if digest is not None:
        out[sc.KV_PARAMS_KEY] = {sc.KVT_DIGEST: digest}
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
        # block id lists hold thousands of ints: one pass in C for them
        return _all_ints(value) or all(_finite(v, depth + 1) for v in value)
    return True


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _all_ints(value: list) -> bool:
    """Every item is an int (not a bool: its type is bool), checked without a call per item."""
    return not value or set(map(type, value)) == {int}


def _block_ids(value) -> bool:
    """vLLM's ``remote_block_ids``: block ids, or one list of them per KV cache group."""
    if not isinstance(value, list):
        return False
    if _all_ints(value):
        return not value or min(value) >= 0
    return all((_int(b) and b >= 0) or (isinstance(b, list) and _all_ints(b) and (not b or min(b) >= 0)) for b in value)


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


MAX_ID_CHARS = 1024  # engine / request ids, hosts, transfer modes: vLLM's are tens of characters
MAX_SIZE = 4096  # tp / dcp / pp sizes
MAX_TOKENS = 1 << 24  # remote_num_tokens (kvtrace.kvdigest.MAX_TOKENS)
MAX_GROUPS = 64  # KV-cache groups in remote_block_ids
MAX_TAG_CHARS = 1 << 20  # a digest's base64 tags: ~11 KB for a 128k-token context


_ID = f"a string of at most {MAX_ID_CHARS} characters"
_BOOL, _STR, _INT_T, _NUM = frozenset((bool,)), frozenset((str,)), frozenset((int,)), frozenset((int, float))
_DECODE_CHECKS: dict[str, tuple[frozenset, float, float, str]] = {
    "do_remote_decode": (_BOOL, 0, 1, "a boolean"),
    "do_remote_prefill": (_BOOL, 0, 1, "a boolean"),
    "remote_engine_id": (_STR, 0, MAX_ID_CHARS, _ID),
    "remote_request_id": (_STR, 0, MAX_ID_CHARS, _ID),
    "remote_host": (_STR, 0, MAX_ID_CHARS, _ID),
    "remote_port": (_INT_T, 1, 65535, "a port"),
    "tp_size": (_INT_T, 1, MAX_SIZE, f"an integer in 1..{MAX_SIZE}"),
    "dcp_size": (_INT_T, 1, MAX_SIZE, f"an integer in 1..{MAX_SIZE}"),
    "pp_size": (_INT_T, 1, MAX_SIZE, f"an integer in 1..{MAX_SIZE}"),
    "remote_num_tokens": (_INT_T, 0, MAX_TOKENS, f"an integer in 0..{MAX_TOKENS}"),
    "remote_blocks_expiry_time": (_NUM, -math.inf, math.inf, "a finite number"),
    "remote_registration_generation": (_INT_T, 0, math.inf, "a non-negative integer"),
    "transfer_mode": (_STR, 0, MAX_ID_CHARS, _ID),
}
"""The fields of D's params P's connector reads: ``(types, low, high, what)``: the value's exact
type (``bool`` is not an ``int`` here), and its bounds (a string's: its length).  Checked inline,
one dict probe per field and no call (they run on every turn's params)."""
_FINITE_TYPES = frozenset((str, int, bool, type(None)))


def _field_problem(params: dict) -> tuple[str, str] | None:
    """The first field of D's params (in D's order) that holds a non-finite number (anywhere in it,
    the block ids and D's kvtrace report left out) or breaks :data:`_DECODE_CHECKS`."""
    checks = _DECODE_CHECKS
    for key, value in params.items():
        t = type(value)
        if t not in _FINITE_TYPES and key != "remote_block_ids" and key != sc.KV_PARAMS_KEY and not _finite(value):
            return sc.DECODE_PARAMS_NON_FINITE, "kv_transfer_params holds a non-finite number"
        check = checks.get(key)
        if check is None or value is None:
            continue
        types, low, high, what = check
        if t not in types or not low <= (len(value) if t is str else value) <= high:
            return key, f"kv_transfer_params.{key} is not {what}"
    return None


# what the JSON of a nest of lists of non-negative integers is made of: a bool dumps as ``true``, a
# float always with ``.`` / ``e`` (or as ``NaN`` / ``null``), a negative number with ``-``, text with ``"``
_ID_LIST_BYTES = b"0123456789,[]"


def _groups(value, tokens: int) -> str | None:
    """What is wrong with D's ``remote_block_ids``: one list of block ids per KV-cache group (or
    one flat list), each no longer than D's tokens + 1 (a block holds at least one token; + 1 for
    the block of the token D generated last)."""
    if not isinstance(value, list) or not value:
        return "is not a non-empty list"
    nested = isinstance(value[0], list)
    groups = value if nested else [value]
    if len(groups) > MAX_GROUPS:
        return f"has more than {MAX_GROUPS} groups"
    if not all(isinstance(g, list) for g in groups):
        return "is not a list of block id lists"
    # the ids in one C-level pass (a Python test per id costs ~1 µs per 10 blocks, every turn): their
    # JSON holds only digits, commas and brackets, and one "[" per list (no list inside a group)
    try:
        raw = dumps(value)
    except (RecursionError, ValueError):
        return "is not a list of block id lists"
    if raw.translate(None, _ID_LIST_BYTES) or raw.count(b"[") != len(groups) + nested:
        return "is not a list of block id lists"
    for g in groups:
        if len(g) > tokens + 1:
            return f"holds {len(g)} blocks for {tokens} tokens"
    return None


def _digest(value) -> str | None:
    if not isinstance(value, dict):
        return "is not an object"
    chunk, n, tags = value.get(sc.DIGEST_CHUNK), value.get(sc.DIGEST_TOKENS), value.get(sc.DIGEST_TAGS)
    if not (_int(value.get(sc.DIGEST_VERSION)) and isinstance(chunk, int) and isinstance(n, int)):
        return "has no integer version, chunk and token count in bounds"
    if isinstance(chunk, bool) or isinstance(n, bool) or chunk <= 0 or not 0 <= n <= MAX_TOKENS:
        return "has no integer version, chunk and token count in bounds"
    if not isinstance(tags, str) or len(tags) > min(MAX_TAG_CHARS, 8 * (n // chunk + 2)):
        return "has tags that are not a string of its length"
    fp = value.get(sc.DIGEST_FINGERPRINT)  # v2: a hex string (kvtrace.kvdigest.FINGERPRINT_BYTES)
    if fp is not None and not (isinstance(fp, str) and len(fp) <= 64):
        return "has a fingerprint that is not a short string"
    return None


def invalid_decode_params(params: dict) -> tuple[str, str] | None:
    """``(field, why)`` when D's final ``kv_transfer_params`` must not be kept and offered to P
    next turn (a field of the wrong type or out of bounds, a non-finite number, a block list
    longer than D's tokens, a malformed digest), else None.  ``field`` is the key at fault,
    ``sc.DECODE_PARAMS_NON_FINITE`` or ``sc.DECODE_PARAMS_OBJECT`` (a bounded metric label)."""
    fault = _field_problem(params)
    if fault is not None:
        return fault
    blocks = params.get("remote_block_ids")
    if blocks is not None:
        problem = _groups(blocks, params.get("remote_num_tokens") or 0)
        if problem is not None:
            return "remote_block_ids", f"kv_transfer_params.remote_block_ids {problem}"
    entry = params.get(sc.KV_PARAMS_KEY)
    if entry is not None and not isinstance(entry, dict):
        return sc.DECODE_PARAMS_OBJECT, f"kv_transfer_params.{sc.KV_PARAMS_KEY} is not an object"
    digest = entry.get(sc.KVT_DIGEST) if entry else None
    problem = _digest(digest) if digest is not None else None
    if problem is not None:
        return sc.KVT_DIGEST, f"kv_transfer_params.{sc.KV_PARAMS_KEY}.{sc.KVT_DIGEST} {problem}"
    return None
