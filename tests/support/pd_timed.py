"""Timed P/D turns on token-id prompts, the same against real vLLM servers and the simulator: the
P leg (``max_tokens=1``, ``do_remote_decode`` plus D's params of the session's previous turn), then
D's streamed leg with P's params; TTFT is from sending the P leg to D's first streamed token.
Used by tests/vllm/test_calibrated_sim_replays_vllm.py to replay the same conversations (token
counts, sessions, order) on both."""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass

from kvtrace import semconv as sc

from support.http_json import post
from support.tokens import ids

MODEL = "tiny"
TIMEOUT_S = 90


@dataclass
class TimedTurn:
    request_id: str
    prompt_tokens: int
    ttft_s: float
    decision: str  # P's d2p outcome (its kvtrace summary)
    pulled_tokens: int
    d_params: dict
    output_ids: list


def _post(url: str, body: dict, rid: str) -> dict:
    return post(url, body, {"X-Request-Id": rid}, timeout=TIMEOUT_S)


def _stream(url: str, body: dict, rid: str) -> tuple[float, list[dict]]:
    """(monotonic time of the first chunk carrying a token, every chunk)."""
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", "X-Request-Id": rid}
    )
    first, chunks = None, []
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if first is None and any(c.get("text") or c.get("token_ids") for c in chunk.get("choices") or ()):
                    first = time.monotonic()
                chunks.append(chunk)
    return first, chunks


def turn(p_url: str, d_url: str, *, rid: str, session: str, index: int, prompt: list, cached, max_tokens: int):
    ctx = {sc.CTX_SESSION_ID: session, sc.CTX_TURN: index}
    p_kv = {**(cached or {}), "do_remote_decode": True, "do_remote_prefill": False, sc.KV_PARAMS_KEY: ctx}
    payload = {"model": MODEL, "prompt": prompt, "return_token_ids": True, "ignore_eos": True}
    started = time.monotonic()
    p = _post(p_url + "/v1/completions", {**payload, "max_tokens": 1, "stream": False, "kv_transfer_params": p_kv}, rid)
    p_params = p["kv_transfer_params"]
    summary = p_params.get(sc.KV_PARAMS_KEY) or {}
    d_kv = {**{k: v for k, v in p_params.items() if k != sc.KV_PARAMS_KEY}, sc.KV_PARAMS_KEY: ctx}
    body = {**payload, "max_tokens": max_tokens, "min_tokens": max_tokens, "stream": True, "kv_transfer_params": d_kv}
    first, chunks = _stream(d_url + "/v1/completions", body, rid)
    out = [t for c in chunks for ch in c.get("choices") or () for t in ch.get("token_ids") or ()]
    final = [c for c in chunks if c.get("kv_transfer_params")]
    return TimedTurn(
        rid,
        len(prompt),
        (first or time.monotonic()) - started,
        summary.get(sc.KVT_DECISION),
        int(summary.get(sc.KVT_PULLED_TOKENS) or 0),
        final[-1]["kv_transfer_params"] if final else {},
        out,
    )


def conversations(p_url: str, d_url: str, plan: list[tuple[str, list[tuple[int, int]]]], tag: str) -> list[TimedTurn]:
    """Each session's turns in order, one request at a time: ``plan`` = [(session, [(new tokens,
    max_tokens), ...])]; a turn's prompt is the previous prompt, its output and ``new`` tokens."""
    done = []
    for s, (session, turns) in enumerate(plan):
        prompt, cached = [], None
        for k, (new, max_tokens) in enumerate(turns):
            prompt = prompt + ids(10 * s + k, new)
            t = turn(
                p_url, d_url, rid=f"{tag}-{session}-t{k}", session=session, index=k, prompt=prompt,
                cached=cached, max_tokens=max_tokens,
            )  # fmt: skip
            done.append(t)
            # the simulator streams no token ids: the same number of others (only lengths are replayed)
            prompt, cached = prompt + (t.output_ids or ids(1000 + 10 * s + k, max_tokens)), t.d_params
    return done
