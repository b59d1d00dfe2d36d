"""The traffic of tests/vllm/test_wrong_kv_on_real_vllm.py: conversations continued under their id
with a history that no longer matches what D's blocks hold, offered the way vLLM's example proxy
offers (turn 1's D ``kv_transfer_params`` handed to P for turn 2, whatever turn 2's prompt is), and
the same breaks sent through the real kvtrace proxy.  Greedy (temperature 0), fixed lengths, on
vllm_rig.make_sharp_model (float32 weights whose greedy answer depends on the KV it attends to).

Turn 1 of every driver conversation: a 300-token prompt, D answers 100 tokens; D then holds prompt +
99 answer tokens (``remote_num_tokens`` 399: the last token's KV is not computed) and P's prefix
cache holds the prompt's 2 whole blocks (256 tokens).  Turn 2, by case:

- ``rewritten``: tokens 200..259 of turn 1's prompt replaced (an earlier message rewritten), then
  turn 1's answer and 150 new tokens;
- ``reasoning_dropped``: turn 1's prompt, the answer without its first 60 tokens (its reasoning),
  150 new tokens;
- ``honest``: turn 1's prompt + answer + 150 new tokens (the control: D's blocks are this prompt's).

Every turn 2 has a cold recompute: the same prompt on D alone with a fresh ``cache_salt`` (vLLM's
prefix cache neither serves that request nor keeps its blocks under the unsalted hashes), same
sampling.  A P that pulled wrong KV caches it under turn 2's block hashes, so each case runs its own
conversation on each P.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from kvtrace import semconv as sc

from support import vllm_pd as pd
from support import vllm_rig as rig_model
from support.http_json import post
from support.tokens import ids
from support.vllm_scenario import SPAN_WAIT_S, rows

CASES = ("rewritten", "reasoning_dropped", "honest")
PROMPT_TOKENS, TURN1_TOKENS, NEW_TOKENS, ANSWER_TOKENS = 300, 100, 150, 8
REWRITE_AT, REWRITE_LEN, REASONING_TOKENS = 200, 60, 60
# no logprobs: vLLM's CPU sampler torch.compiles its logprob gather on first use (a C++ build of minutes)
SAMPLING = {"temperature": 0.0}
READY_S = 480  # start-up is 30 s on an idle 2-core host, minutes when the host is shared
SEEDS = {"rewritten": 11, "reasoning_dropped": 12, "honest": 13}
# per P: D caches the KV P computed for a turn 2 under that prompt's block hashes, wrong KV included,
# so a conversation whose prompt another P already sent wrongly would find D's copy poisoned
TAG_SEEDS = {"plain": 0, "record": 20, "enforce": 40}
PROXY_CASES = ("rewritten", "reasoning_dropped")
PROXY_TURN1 = " ".join(f"step {i}: the agent reads file {i} and calls tool number {i * 7} again." for i in range(16))
PROXY_NEW = " ".join(f"follow-up {i}: now the agent reads file {i + 40} and calls tool {i * 11}." for i in range(6))


@dataclass
class Conversation:
    """One driver conversation: turn 1, turn 2 offered by id alone, and turn 2's cold recompute."""

    case: str
    turn1: pd.Turn
    held: list[int]  # the tokens D's retained blocks hold (turn 1's prompt + answer, remote_num_tokens)
    prompt2: list[int]
    turn2: pd.Turn
    cold: list[int]  # the cold recompute's answer

    @property
    def answer(self) -> list[int]:
        return self.turn2.output_ids


def turn2_prompt(case: str, prompt1: list[int], answer1: list[int], seed: int) -> list[int]:
    new = ids(seed + 100, NEW_TOKENS)
    if case == "rewritten":
        history = list(prompt1)
        history[REWRITE_AT : REWRITE_AT + REWRITE_LEN] = ids(seed + 200, REWRITE_LEN)
        return history + answer1 + new
    if case == "reasoning_dropped":
        return prompt1 + answer1[REASONING_TOKENS:] + new
    return prompt1 + answer1 + new


def _post(url: str, body: dict, headers: dict | None = None) -> dict:
    return post(url, body, headers, timeout=pd.REQUEST_TIMEOUT_S)


def cold(rig: pd.Rig, server: pd.Server, prompt: list[int]) -> list[int]:
    """``prompt`` computed on ``server`` alone (no kv_transfer_params), under a fresh cache_salt."""
    body = {
        "model": pd.MODEL,
        "prompt": prompt,
        "max_tokens": ANSWER_TOKENS,
        "min_tokens": ANSWER_TOKENS,
        "ignore_eos": True,
        "return_token_ids": True,
        "cache_salt": secrets.token_hex(8),
        **SAMPLING,
    }
    [choice] = rig.call("cold recompute", _post, server.url + "/v1/completions", body)["choices"]
    return choice["token_ids"]


def conversation(rig: pd.Rig, p: pd.Server, d: pd.Server, case: str, tag: str) -> Conversation:
    seed = SEEDS[case] + TAG_SEEDS[tag]
    session = f"{tag}-{case}"
    prompt1 = ids(seed, PROMPT_TOKENS)
    kw = dict(sampling=SAMPLING)
    t1 = pd.run_turn(rig, p, d, session=session, turn=0, prompt=prompt1, cached=None, max_tokens=TURN1_TOKENS, **kw)
    held = (prompt1 + t1.output_ids)[: t1.d_params["remote_num_tokens"]]
    prompt2 = turn2_prompt(case, prompt1, t1.output_ids, seed)
    reference = cold(rig, d, prompt2)
    t2 = pd.run_turn(
        rig,
        p,
        d,
        session=session,
        turn=1,
        prompt=prompt2,
        cached=t1.d_params,
        max_tokens=ANSWER_TOKENS,
        verbatim_offer=True,
        **kw,
    )
    rig.progress(f"{session}: answer {t2.output_ids}, cold {reference}")
    return Conversation(case, t1, held, prompt2, t2, reference)


def _servers(base: Path, *specs: tuple[str, str, str, str | None]) -> dict[str, pd.Server]:
    model = rig_model.make_sharp_model(base / "model")
    out = {}
    for name, role, connector, verify in specs:
        out[name] = pd.Server(
            name,
            role,
            model,
            base / "traces",
            base,
            ttl_s=120,
            connector=connector,
            verify=verify,
            dtype="float32",
            load_format="safetensors",
            plain_nixl_delay=connector == "plain",
        )
    return out


def run_plain(base: Path) -> dict:
    """vLLM's NixlConnector on P and D: the rewritten and reasoning-dropped conversations, and how
    many tokens P's /metrics counts as loaded from D for each turn 2."""
    servers = _servers(base, ("p", "prefill", "plain", None), ("d", "decode", "plain", None))
    p, d = servers["p"], servers["d"]
    rig = pd.Rig([p, d])
    out: dict = {"servers": servers}
    try:
        rig.start(READY_S)
        for case in ("rewritten", "reasoning_dropped"):
            before = p.external_kv_tokens()
            out[case] = conversation(rig, p, d, case, "plain")
            out[f"{case}_loaded"] = rig.wait_for(
                lambda before=before: p.external_kv_tokens() - before, deadline_s=30, what="P's external KV counter"
            )
    finally:
        rig.stop()
    out["wall_s"] = time.monotonic() - rig.started
    rig.progress(f"plain NixlConnector run: {out['wall_s']:.1f}s")
    return out


def run_kvtrace(base: Path) -> dict:
    """KVTraceNixlConnector: P ``record`` and P ``enforce`` beside one D; the driver's cases on
    each P (``honest`` on enforce), then the proxy's cases through the kvtrace proxy over P record."""
    servers = _servers(
        base,
        ("p_record", "prefill", "kvtrace", sc.VERIFY_RECORD),
        ("p_enforce", "prefill", "kvtrace", sc.VERIFY_ENFORCE),
        ("d", "decode", "kvtrace", None),
    )
    p_record, p_enforce, d = servers["p_record"], servers["p_enforce"], servers["d"]
    traces = base / "traces"
    rig = pd.Rig(list(servers.values()))
    out: dict = {"servers": servers, "traces": traces}
    try:
        rig.start(READY_S)
        for case in ("rewritten", "reasoning_dropped"):
            out[("record", case)] = conversation(rig, p_record, d, case, "record")
        for case in CASES:
            out[("enforce", case)] = conversation(rig, p_enforce, d, case, "enforce")
        out["proxy"] = asyncio.run(proxy_chats(rig, p_record, d, traces))
        driven = [c.turn2.request_id for k, c in out.items() if isinstance(k, tuple)]
        _wait_for_decisions(rig, traces, driven + [c.turn2_id for c in out["proxy"].values()])
    finally:
        rig.stop()
    out["wall_s"] = time.monotonic() - rig.started
    rig.progress(f"kvtrace connector run: {out['wall_s']:.1f}s")
    return out


def _wait_for_decisions(rig: pd.Rig, traces: Path, request_ids: list[str]) -> None:
    """Every request's settled P decision span in the store (one query per poll)."""
    marks = ", ".join("?" * len(request_ids))
    sql = (
        f"SELECT count(DISTINCT request_id) AS n FROM kv_decisions WHERE request_id IN ({marks}) "
        "AND engine_role = ? AND outcome IS NOT NULL"
    )
    rig.wait_for(
        lambda: rows(traces, sql, [*request_ids, sc.ROLE_PREFILL])[0]["n"] == len(request_ids),
        deadline_s=SPAN_WAIT_S,
        what=f"P's decision spans for {request_ids}",
    )


# ---------------------------------------------------------------------------- through the kvtrace proxy
@dataclass
class ProxyChat:
    case: str
    session: str
    turn1_id: str
    turn2_id: str
    messages2: list[dict]
    reply: str
    cold_reply: str


def _chat_body(messages: list[dict], max_tokens: int) -> dict:
    return {
        "model": pd.MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def proxy_messages(case: str, reply1: str) -> list[dict]:
    """Turn 2 of a proxy chat: turn 1's history broken as ``case`` says, then a new user message."""
    user1, assistant1 = PROXY_TURN1, reply1
    if case == "rewritten":
        user1 = PROXY_TURN1.replace("step 8: the agent reads file 8", "step 8: the agent deletes file 8")
    else:
        assistant1 = reply1[len(reply1) // 2 :]
    return [
        {"role": "user", "content": user1},
        {"role": "assistant", "content": assistant1},
        {"role": "user", "content": PROXY_NEW},
    ]


async def proxy_chats(rig: pd.Rig, p: pd.Server, d: pd.Server, traces: Path) -> dict[str, ProxyChat]:
    """Per case, a non-streaming chat session under its ``conversation_id`` through the kvtrace
    proxy (in-process, port 0, its spans into ``traces``), and turn 2's cold recompute on D."""
    from kvtrace import telemetry
    from kvtrace.proxy.config import ProxyConfig, Worker
    from kvtrace.proxy.server import start

    provider = telemetry.configure(pd.PROXY_SERVICE, traces_dir=traces, handle_sigterm=False)
    config = ProxyConfig(
        prefill=[Worker("127.0.0.1", p.port)], decode=[Worker("127.0.0.1", d.port)], read_timeout_s=pd.REQUEST_TIMEOUT_S
    )
    running = await start(config, provider, port=0)
    out = {}
    try:
        for case in PROXY_CASES:
            out[case] = await _proxy_chat(rig, running.url, d, case)
    finally:
        await running.close()
        provider.force_flush()
        provider.shutdown()
    return out


async def _proxy_chat(rig: pd.Rig, url: str, d: pd.Server, case: str) -> ProxyChat:
    session = f"proxy-{case}"

    def send(messages: list[dict], max_tokens: int, rid: str) -> str:
        body = {**_chat_body(messages, max_tokens), "conversation_id": session}
        resp = rig.call(f"{rid} via the proxy", _post, url + "/v1/chat/completions", body, {sc.HEADER_REQUEST_ID: rid})
        return resp["choices"][0]["message"]["content"]

    turn1 = [{"role": "user", "content": PROXY_TURN1}]
    reply1 = await asyncio.to_thread(send, turn1, TURN1_TOKENS, f"{session}-t0")
    messages2 = proxy_messages(case, reply1)
    reply2 = await asyncio.to_thread(send, messages2, ANSWER_TOKENS, f"{session}-t1")
    body = {**_chat_body(messages2, ANSWER_TOKENS), "cache_salt": secrets.token_hex(8)}
    cold_resp = await asyncio.to_thread(rig.call, "cold chat", _post, d.url + "/v1/chat/completions", body)
    rig.progress(f"{session}: reply {reply2!r}")
    cold_reply = cold_resp["choices"][0]["message"]["content"]
    return ProxyChat(case, session, f"{session}-t0", f"{session}-t1", messages2, reply2, cold_reply)


# ---------------------------------------------------------------------------- reading the spans back
def span_attributes(traces: Path, span: dict) -> dict:
    """The attributes of one stored span (a view row: trace, span and engine id), typed as recorded."""
    [row] = rows(
        traces,
        "SELECT SpanAttributes, SpanAttributesInt, SpanAttributesFloat FROM spans "
        "WHERE span_id = ? AND trace_id = ? AND engine_id = ?",
        [span["span_id"], span["trace_id"], span["engine_id"]],
    )
    ints, floats = dict(row["SpanAttributesInt"]), dict(row["SpanAttributesFloat"])
    out: dict = {}
    for key, text in dict(row["SpanAttributes"]).items():
        if key in ints:
            out[key] = ints[key]
        elif key in floats:
            out[key] = floats[key]
        else:
            out[key] = {"true": True, "false": False}.get(text, text)
    return out


def decision(traces: Path, request_id: str) -> dict:
    """P's d2p decision row (kv_decisions) for ``request_id``."""
    found = rows(
        traces, "SELECT * FROM kv_decisions WHERE request_id = ? AND engine_role = ?", [request_id, sc.ROLE_PREFILL]
    )
    assert len(found) == 1, found
    return found[0]
