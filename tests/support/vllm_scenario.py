"""The traffic of the real P/D end-to-end test, shared by tests/vllm/test_end_to_end.py (its fixture)
and scripts/e2e_stall.py (which runs it N times, with kvtrace's connector or vLLM's plain one).

P, D and D2 start at once (D2 has its own ports and a 10 s TTL; it is used after D stops).

Conversation A (D with decoder_kv_blocks_ttl=480):
  turn 0: 300-token prompt, D generates 100 tokens and retains the conversation;
  turn 1: turn 0 + its output + 122 new tokens: P holds 256 tokens locally (2 blocks of 128),
          D offers 399, so P pulls 143 (>= 64) from D  -> decision pulled, d2p transfer;
  turn 2: turn 1 + 4 output + 30 new tokens: P now holds 512 locally, D offers ~525 -> < 64
          -> below_threshold.
Conversation C: one chat turn, D streamed through the kvtrace plugin's finish-chunk patch.
Conversation "agent" (same P and D, before D stops): a kvtrace agent session whose traced
  ``openai`` client streams chat through the real kvtrace proxy (in-process): turn 0 (~300
  tokens, 100 generated) is not offered (no_entry -> no_remote); turn 1 adds >= 100 new tokens and
  P pulls from D.
Conversation B (D2, after D stopped): turn 0, then, once D2 has released the blocks (kvtrace: its
  retention span ended ``expired``; plain: the TTL has passed), turn 1 offers the stale blocks:
  P's worker declines the read -> decision expired.

With ``traced`` (kvtrace's connector) the run also waits, before stopping the servers, for every
span the test reads (vLLM's API server kills its engine at shutdown).
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from pathlib import Path

from kvtrace import semconv as sc
from kvtrace.store import connect

from support import vllm_diag as diag
from support import vllm_pd as pd
from support import vllm_rig as rig_model
from support.tokens import ids

AGENT_SESSION = "conv-agent"
AGENT_MAX_TOKENS = [100, 4]
AGENT_TURNS = [
    " ".join(f"step {i}: the agent reads file {i} and calls tool number {i * 7} again." for i in range(16)),
    " ".join(
        f"follow-up {i}: now the agent reads file {i + 40} and calls tool number {i * 11} again." for i in range(5)
    ),
]
SPAN_WAIT_S = 60
D2_TTL_S = 10


def rows(traces: Path, sql: str, params: list) -> list[dict]:
    con = connect(traces, allow_empty=True)
    try:
        cur = con.execute(sql, params)
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
    finally:
        con.close()


def servers(base: Path, model: Path, *, layout: str = "uni", connector: str = "kvtrace") -> dict:
    traces = base / "traces"
    kw = dict(layout=layout, connector=connector)
    return {
        "traces": traces,
        "p": pd.Server("p", "prefill", model, traces, base, **kw),
        "d": pd.Server("d", "decode", model, traces, base, ttl_s=480, **kw),
        "d2": pd.Server("d2", "decode", model, traces, base, ttl_s=D2_TTL_S, **kw),
    }


def run(
    base: Path,
    *,
    layout: str = "uni",
    connector: str = "kvtrace",
    ready_s: float = pd.READY_TIMEOUT_S,
    unpin: bool = True,
) -> dict:
    """Start P, D and D2 (ready within ``ready_s``; ``unpin``: undo vLLM's pinning, see
    vllm_pd.Server.unpin), drive every conversation, stop the servers.  Returns what the test
    reads (turns, metric deltas, pids, wall time)."""
    model = rig_model.make_tiny_model(base / "model")
    out = servers(base, model, layout=layout, connector=connector)
    p, d, d2, traces = out["p"], out["d"], out["d2"], out["traces"]
    rig = pd.Rig([p, d, d2], unpin=unpin)
    out["rig"] = rig
    traced = connector == "kvtrace"
    try:
        rig.start(ready_s)
        out["pids"] = {s.name: s.engine_pids() for s in (p, d, d2)}
        _conversations_a_c(rig, out)
        try:  # a failure here fails the agent tests only (agent_run), not the turns above
            out.update(_agent_session(rig, p, d, traces, model, traced))
        except Exception:
            out["agent_error"] = traceback.format_exc()
        # after the traffic: threads started since (NIXL handshakes, ...) included
        out["affinities"] = {s.name: _affinities(s) for s in (p, d, d2)}
        d.stop()
        _conversation_b(rig, out, traced)
        if traced:
            _wait_for_spans(rig, out)
    finally:
        rig.stop()
    out["wall_s"] = time.monotonic() - rig.started
    rig.progress(f"vLLM P/D e2e wall time: {out['wall_s']:.1f}s")
    return out


def _affinities(server: pd.Server) -> set[frozenset]:
    """The distinct CPU sets the threads of the server's processes may run on."""
    found = set()
    for pid in diag.process_tree(server.proc.pid):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                found.add(frozenset(os.sched_getaffinity(int(task.name))))
            except OSError:  # the thread ended
                pass
    return found


def _conversations_a_c(rig: pd.Rig, out: dict) -> None:
    p, d = out["p"], out["d"]
    a0 = ids(1, 300)
    t0 = pd.run_turn(rig, p, d, session="conv-a", turn=0, prompt=a0, cached=None, max_tokens=100)
    before = p.external_kv_tokens()
    a1 = a0 + t0.output_ids + ids(2, 122)
    t1 = pd.run_turn(rig, p, d, session="conv-a", turn=1, prompt=a1, cached=t0.d_params, max_tokens=4)
    out["metric_delta"] = rig.wait_for(
        lambda: p.external_kv_tokens() - before, deadline_s=30, what="P's external_kv_transfer counter"
    )
    a2 = a1 + t1.output_ids + ids(3, 30)
    t2 = pd.run_turn(rig, p, d, session="conv-a", turn=2, prompt=a2, cached=t1.d_params, max_tokens=4)
    chat = [{"role": "user", "content": "turn 0: the agent reads file 3 and calls tool number 21 again. " * 8}]
    tc = pd.run_turn(rig, p, d, session="conv-c", turn=0, prompt=chat, cached=None, max_tokens=8, chat=True)
    out.update(t0=t0, t1=t1, t2=t2, tc=tc)


def _conversation_b(rig: pd.Rig, out: dict, traced: bool) -> None:
    p, d2, traces = out["p"], out["d2"], out["traces"]
    b0 = ids(7, 300)
    u0 = pd.run_turn(rig, p, d2, session="conv-b", turn=0, prompt=b0, cached=None, max_tokens=100)
    if traced:
        rig.wait_for(
            lambda: rows(
                traces, "SELECT outcome FROM kv_retention WHERE request_id = ? AND outcome IS NOT NULL", [u0.request_id]
            ),
            deadline_s=D2_TTL_S + SPAN_WAIT_S,
            what="D2 releasing conversation B's blocks",
        )
    else:  # no spans: the TTL itself is the condition
        expires = time.monotonic() + D2_TTL_S + 2
        rig.wait_for(lambda: time.monotonic() >= expires, deadline_s=D2_TTL_S + 5, what="D2's TTL")
    u1 = pd.run_turn(
        rig,
        p,
        d2,
        session="conv-b",
        turn=1,
        prompt=b0 + u0.output_ids + ids(8, 122),
        cached=u0.d_params,
        max_tokens=4,
        p_fails=True,
        attempts=1,
    )
    out.update(u0=u0, u1=u1)


def _wait_for_spans(rig: pd.Rig, out: dict) -> None:
    """Every span the assertions need, exported before the servers stop."""
    traces = out["traces"]
    for turn in (out["t1"], out["t2"], out["u1"]):
        rig.wait_for(
            lambda turn=turn: rows(
                traces,
                "SELECT 1 FROM kv_decisions WHERE request_id = ? AND engine_role = ?",
                [turn.request_id, sc.ROLE_PREFILL],
            ),
            deadline_s=SPAN_WAIT_S,
            what=f"P's decision span for {turn.request_id}",
        )
    for turn in (out["t1"], out["u1"]):
        rig.wait_for(
            lambda turn=turn: rows(
                traces,
                "SELECT 1 FROM kv_transfers WHERE request_id = ? AND direction = ?",
                [turn.request_id, sc.DIRECTION_D2P],
            ),
            deadline_s=SPAN_WAIT_S,
            what=f"P's d2p transfer span for {turn.request_id}",
        )
    rig.progress("spans exported")


def _agent_session(rig: pd.Rig, p, d, traces: Path, model: Path, traced: bool) -> dict:
    """Conversation "agent" through the kvtrace proxy; waits (before D stops) for every span the
    agent tests read.  Turn 0 pulls nothing, so P's counter delta is turn 1's pull."""
    from tokenizers import Tokenizer

    started, before = time.monotonic(), p.external_kv_tokens()
    turns = asyncio.run(
        pd.run_agent_session(
            rig, p, d, traces, session=AGENT_SESSION, user_turns=AGENT_TURNS, max_tokens=AGENT_MAX_TOKENS
        )
    )
    new_tokens = len(Tokenizer.from_file(str(model / "tokenizer.json")).encode(AGENT_TURNS[1]).ids)
    out = {"agent": turns, "agent_new_tokens": new_tokens}
    if not traced:  # plain vLLM streams no kv_transfer_params: the proxy offers nothing
        return out
    out["agent_metric_delta"] = rig.wait_for(
        lambda: p.external_kv_tokens() - before, deadline_s=30, what="P's external_kv_transfer counter (agent turn 1)"
    )
    rid0, rid1 = ((t.kv_transfer or {}).get(sc.KVT_REQUEST_ID) for t in turns)
    waits = [
        ("SELECT 1 FROM kv_decisions WHERE request_id = ? AND engine_role = ?", [rid0, sc.ROLE_PREFILL]),
        ("SELECT 1 FROM kv_decisions WHERE request_id = ? AND engine_role = ?", [rid1, sc.ROLE_PREFILL]),
        ("SELECT 1 FROM kv_transfers WHERE request_id = ? AND direction = ?", [rid1, sc.DIRECTION_D2P]),
        ("SELECT 1 FROM spans WHERE request_id = ? AND name = ?", [rid1, sc.SPAN_ENGINE_PREFILL]),
        ("SELECT 1 FROM spans WHERE request_id = ? AND name = ?", [rid1, sc.SPAN_ENGINE_DECODE]),
        ("SELECT 1 FROM kv_retention WHERE request_id = ? AND outcome IS NOT NULL", [rid0]),
    ]
    for sql, params in waits:
        rig.wait_for(
            lambda sql=sql, params=params: rows(traces, sql, params), deadline_s=SPAN_WAIT_S, what=f"{sql} {params}"
        )
    rig.progress(
        f"agent session through the kvtrace proxy: {time.monotonic() - started:.1f}s, "
        f"attempts per turn {[t.attempts for t in turns]}"
    )
    return out
