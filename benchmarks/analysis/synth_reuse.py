"""The reuse attributes of :mod:`bench_analysis`'s synthetic sessions: each LLM call's proxy, engine
and KV spans name its request (``gen_ai.request.id``) and carry what the KV reuse and retention pages
read (engines, the d2p decision and its pull, P's prompt and cached tokens, D's retention), so those
pages join and price real rows.

Call ``k`` of a session (two a turn) has a prompt of ``1000 + 400 k`` tokens; from the second call on,
P pulls all but the last 400 from D (``pulled``), the first call's decision finds nothing offered.
P and D alternate between two engines each by session.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from kvtrace import semconv as sc

PROMPT, STEP = 1000, 400
BYTES_PER_TOKEN, BLOCK = 131_072, 16
_P_SPANS = (sc.SPAN_ENGINE_PREFILL, sc.SPAN_KV_DECISION, sc.SPAN_KV_TRANSFER)
_D_SPANS = (sc.SPAN_ENGINE_DECODE, sc.SPAN_KV_RETENTION)


def calls(names: list[str]) -> list[int]:
    """Per template row (span names in order): the index of the LLM call it belongs to (the call
    itself and the spans following it up to the next agent span), or -1."""
    out, k, current = [], -1, -1
    for name in names:
        if name == sc.SPAN_AGENT_LLM_CALL:
            k += 1
            current = k
        elif name.startswith("kvtrace.agent."):
            current = -1
        out.append(current)
    return out


def masked_map(entries: list[tuple[str, np.ndarray, np.ndarray]], n: int, typ) -> pa.MapArray:
    """A map column of ``n`` rows: for each ``(key, mask, values)``, ``key -> values[i]`` on the rows
    where ``mask`` holds (the keys of a row in the order given)."""
    rows = [np.nonzero(mask)[0] for _, mask, _ in entries]
    at = np.concatenate(rows) if rows else np.array([], dtype=np.int64)
    order = np.argsort(at, kind="stable")
    keys = np.concatenate([np.full(len(r), key, dtype=object) for (key, _, _), r in zip(entries, rows, strict=True)])
    values = np.concatenate([np.asarray(v)[m] for _, m, v in entries])
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(at, minlength=n), out=offsets[1:])
    return pa.MapArray.from_arrays(pa.array(offsets), pa.array(keys[order], pa.string()), pa.array(values[order], typ))


def attribute_maps(names: np.ndarray, call: np.ndarray, sid: np.ndarray, sess: np.ndarray, ints: list) -> tuple:
    """(string map, int map) of the rows: the session id on every span, the reuse attributes (module
    doc), and ``ints`` (more ``(key, mask, values)`` int entries: the turn index)."""
    n = len(names)
    has = call >= 0
    is_ = {name: names == name for name in (*_P_SPANS, *_D_SPANS, sc.SPAN_PROXY_REQUEST)}
    prompt = PROMPT + STEP * np.maximum(call, 0)
    pulled = np.where(call > 0, prompt - STEP, 0)
    request = np.char.add(np.char.add(sid.astype(str), "-"), call.astype(str)).astype(object)
    p_engine = np.char.add("bench-p", (sess % 2).astype(str)).astype(object)
    d_engine = np.char.add("bench-d", (sess % 2).astype(str)).astype(object)
    on_p = is_[sc.SPAN_ENGINE_PREFILL] | is_[sc.SPAN_KV_DECISION] | is_[sc.SPAN_KV_TRANSFER]
    on_d = is_[sc.SPAN_ENGINE_DECODE] | is_[sc.SPAN_KV_RETENTION]
    kv = is_[sc.SPAN_KV_DECISION] | is_[sc.SPAN_KV_TRANSFER]
    dec, xfer, ret = is_[sc.SPAN_KV_DECISION], is_[sc.SPAN_KV_TRANSFER], is_[sc.SPAN_KV_RETENTION]
    const = lambda v: np.full(n, v, dtype=object)  # noqa: E731
    strings = [
        (sc.SESSION_ID, np.ones(n, dtype=bool), sid),
        (sc.GEN_AI_REQUEST_ID, has, request),
        (sc.ENGINE_ID, on_p | on_d, np.where(on_p, p_engine, d_engine)),
        (sc.KV_DIRECTION, kv, const(sc.DIRECTION_D2P)),
        (sc.KV_OUTCOME, dec, np.where(call > 0, sc.OUTCOME_PULLED, sc.OUTCOME_NO_REMOTE).astype(object)),
        (sc.KV_TRANSFER_STATUS, xfer, const(sc.TRANSFER_OK)),
        (sc.KV_RETENTION_OUTCOME, ret, const(sc.RETENTION_READ)),
        (
            sc.PROXY_OFFER_REASON,
            is_[sc.SPAN_PROXY_REQUEST],
            np.where(call > 0, sc.OFFER_OFFERED, sc.OFFER_NO_ENTRY).astype(object),
        ),
    ]
    blocks = -(-prompt // BLOCK)
    tokens_prefill = is_[sc.SPAN_ENGINE_PREFILL]
    integers = [
        *ints,
        (sc.KV_PROMPT_TOKENS, tokens_prefill | dec, prompt),
        (sc.REQUEST_CACHED_TOKENS, tokens_prefill, pulled),
        (sc.KV_LOCAL_HIT_TOKENS, dec, np.zeros(n, dtype=np.int64)),
        (sc.KV_REMOTE_TOKENS, dec, pulled),
        (sc.KV_PULLED_TOKENS, dec, pulled),
        (sc.KV_RECOMPUTED_TOKENS, dec, prompt - pulled),
        (sc.KV_TRANSFER_TOKENS, xfer, pulled),
        (sc.KV_TRANSFER_BYTES, xfer, pulled * BYTES_PER_TOKEN),
        (sc.KV_RETENTION_BLOCKS, ret, blocks),
        (sc.KV_RETENTION_BYTES, ret, blocks * BLOCK * BYTES_PER_TOKEN),
    ]
    return masked_map(strings, n, pa.string()), masked_map(integers, n, pa.int64())
