"""Real P/D end to end: two vLLM CPU servers with NIXL and the kvtrace connector on loopback.

Conversation A (D with decoder_kv_blocks_ttl=480):
  turn 0: 300-token prompt, D generates 100 tokens and retains the conversation;
  turn 1: turn 0 + its output + 122 new tokens: P holds 256 tokens locally (2 blocks of 128),
          D offers 399, so P pulls 143 (>= 64) from D  -> decision pulled, d2p transfer;
  turn 2: turn 1 + 20 output + 30 new tokens: P now holds 512 locally, D offers ~541 -> 29 < 64
          -> below_threshold.
Conversation C: one chat turn, D streamed through the kvtrace plugin's finish-chunk patch.
Conversation B (a second D, ttl=10 s, started after the first one stops): turn 0, then, once
  D has released the blocks (its retention span ended ``expired``), turn 1 offers the stale
  blocks: P's worker declines the read -> decision expired.

Assertions are on kv_transfer_params, spans (Parquet, via kvtrace.store views) and P's
Prometheus counters -- never on latency.
"""

from __future__ import annotations

import time

import pytest

from conftest import require_vllm
from kvtrace import semconv as sc

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
require_vllm()
require_vllm("nixl")

import vllm_pd as pd  # noqa: E402
import vllm_rig as rig  # noqa: E402
from kvtrace.store.views import connect  # noqa: E402


def _ids(seed: int, n: int) -> list[int]:
    return [5 + (seed * 131 + i * 37) % 500 for i in range(n)]


def _rows(traces, sql: str, params: list):
    con = connect(traces, allow_empty=True)
    try:
        cur = con.execute(sql, params)
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]
    finally:
        con.close()


@pytest.fixture(scope="module")
def rig_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("pd")
    model = rig.make_tiny_model(base / "model")
    traces = base / "traces"
    started = time.monotonic()
    p = pd.Server("p", "prefill", model, traces, base)
    d = pd.Server("d", "decode", model, traces, base, ttl_s=480)
    d2 = pd.Server("d2", "decode", model, traces, base, ttl_s=10)
    out = {"traces": traces, "p": p, "d": d, "d2": d2}
    try:
        for s in (p, d):
            s.start()
        for s in (p, d):
            s.wait_ready()
        a0 = _ids(1, 300)
        t0 = pd.run_turn(p, d, session="conv-a", turn=0, prompt=a0, cached=None, max_tokens=100)
        before = p.external_kv_tokens()
        a1 = a0 + t0.output_ids + _ids(2, 122)
        t1 = pd.run_turn(p, d, session="conv-a", turn=1, prompt=a1, cached=t0.d_params, max_tokens=20)
        out["metric_delta"] = pd.wait_for(lambda: p.external_kv_tokens() - before, deadline_s=30,
                                          what="P's external_kv_transfer counter")
        a2 = a1 + t1.output_ids + _ids(3, 30)
        t2 = pd.run_turn(p, d, session="conv-a", turn=2, prompt=a2, cached=t1.d_params, max_tokens=4)
        chat = [{"role": "user", "content": "turn 0: the agent reads file 3 and calls tool number 21 again. " * 8}]
        tc = pd.run_turn(p, d, session="conv-c", turn=0, prompt=chat, cached=None, max_tokens=8, chat=True)
        out.update(t0=t0, t1=t1, t2=t2, tc=tc)
        d.stop()
        d2.start()
        d2.wait_ready()
        b0 = _ids(7, 300)
        u0 = pd.run_turn(p, d2, session="conv-b", turn=0, prompt=b0, cached=None, max_tokens=100)
        pd.wait_for(lambda: _rows(traces, "SELECT outcome FROM kv_retention WHERE request_id = ? AND outcome IS NOT NULL",
                                  [u0.request_id]), deadline_s=90, what="D2 releasing conversation B's blocks")
        u1 = pd.run_turn(p, d2, session="conv-b", turn=1, prompt=b0 + u0.output_ids + _ids(8, 122),
                         cached=u0.d_params, max_tokens=4, p_fails=True, attempts=1)
        out.update(u0=u0, u1=u1)
        # vLLM's API server kills its engine process at shutdown: wait until every span the
        # assertions need has been exported before stopping the servers.
        for turn in (t1, t2, u1):
            pd.wait_for(lambda: _rows(traces, "SELECT 1 FROM kv_decisions WHERE request_id = ? AND engine_role = ?",
                                      [turn.request_id, sc.ROLE_PREFILL]), deadline_s=60,
                        what=f"P's decision span for {turn.request_id}")
        for turn in (t1, u1):
            pd.wait_for(lambda: _rows(traces, "SELECT 1 FROM kv_transfers WHERE request_id = ? AND direction = ?",
                                      [turn.request_id, sc.DIRECTION_D2P]), deadline_s=60,
                        what=f"P's d2p transfer span for {turn.request_id}")
    finally:
        for s in (p, d, d2):
            s.stop()
    out["wall_s"] = time.monotonic() - started
    print(f"\nvLLM P/D e2e wall time: {out['wall_s']:.1f}s")
    return out


def _decision(run, turn, role=sc.ROLE_PREFILL):
    rows = _rows(run["traces"], "SELECT * FROM kv_decisions WHERE request_id = ? AND engine_role = ?",
                 [turn.request_id, role])
    assert len(rows) == 1, rows
    return rows[0]


def test_turn_1_pulls_what_vllm_counts(rig_run):
    t1 = rig_run["t1"]
    dec = _decision(rig_run, t1)
    assert (dec["outcome"], dec["direction"], dec["local_hit_tokens"]) == (sc.OUTCOME_PULLED, sc.DIRECTION_D2P, 256)
    assert dec["pulled_tokens"] == rig_run["metric_delta"] >= 64
    assert dec["peer_engine_id"] == rig_run["d"].engine_id and dec["session_id"] == "conv-a" and dec["turn"] == 1
    summary = t1.p_params[sc.KV_PARAMS_KEY]
    assert (summary[sc.KVT_DECISION], summary[sc.KVT_PULLED_TOKENS]) == (sc.OUTCOME_PULLED, dec["pulled_tokens"])
    assert summary[sc.KVT_TRACE_ID] == t1.trace_id


def test_d2p_transfer_span_in_the_requests_trace(rig_run):
    t1 = rig_run["t1"]
    dec = _decision(rig_run, t1)
    [xfer] = _rows(rig_run["traces"], "SELECT * FROM kv_transfers WHERE request_id = ? AND direction = ?",
                   [t1.request_id, sc.DIRECTION_D2P])
    assert xfer["trace_id"] == t1.trace_id == dec["trace_id"]
    assert xfer["parent_span_id"] == dec["span_id"]
    assert (xfer["status"], xfer["tokens"], xfer["peer_engine_id"]) == (sc.TRANSFER_OK, dec["pulled_tokens"],
                                                                      rig_run["d"].engine_id)
    assert xfer["bytes"] == xfer["blocks"] * rig.BLOCK_BYTES > 0
    assert xfer["remote_request_id"] == rig_run["t0"].d_params["remote_request_id"]


def test_decode_retention_ends_read_when_the_next_turn_pulls(rig_run):
    t0 = rig_run["t0"]
    [ret] = _rows(rig_run["traces"], "SELECT * FROM kv_retention WHERE request_id = ?", [t0.request_id])
    assert ret["outcome"] == sc.RETENTION_READ and ret["engine_id"] == rig_run["d"].engine_id
    assert ret["blocks"] == len(t0.d_params["remote_block_ids"][0])
    assert ret["bytes"] == ret["blocks"] * rig.BLOCK_BYTES and ret["ttl_s"] == 480


def test_below_threshold_turn(rig_run):
    dec = _decision(rig_run, rig_run["t2"])
    assert (dec["outcome"], dec["pulled_tokens"]) == (sc.OUTCOME_BELOW_THRESHOLD, 0)
    assert 0 < dec["remote_tokens"] - dec["local_hit_tokens"] < 64
    assert rig_run["t2"].p_params[sc.KV_PARAMS_KEY][sc.KVT_DECISION] == sc.OUTCOME_BELOW_THRESHOLD


def test_late_turn_is_expired(rig_run):
    u0, u1 = rig_run["u0"], rig_run["u1"]
    [ret] = _rows(rig_run["traces"], "SELECT * FROM kv_retention WHERE request_id = ?", [u0.request_id])
    assert (ret["outcome"], ret["ttl_s"]) == (sc.RETENTION_EXPIRED, 10)
    dec = _decision(rig_run, u1)
    assert (dec["outcome"], dec["pulled_tokens"]) == (sc.OUTCOME_EXPIRED, 0)
    [xfer] = _rows(rig_run["traces"], "SELECT status FROM kv_transfers WHERE request_id = ?", [u1.request_id])
    assert xfer["status"] == sc.TRANSFER_EXPIRED
    # kv_load_failure_policy=fail: P fails the request, so vLLM returns no kv_transfer_params
    assert u1.p_error is not None and not (u1.p_params or {}).get(sc.KV_PARAMS_KEY)


@pytest.mark.parametrize("turn", ["t0", "tc"])  # completions and chat
def test_streaming_finish_chunk_carries_kv_transfer_params(rig_run, turn):
    t = rig_run[turn]
    finals = [c for c in t.chunks if any(ch.get("finish_reason") for ch in c.get("choices") or ())]
    assert len(finals) == 1 and finals[0]["kv_transfer_params"] == t.d_params
    assert all("kv_transfer_params" not in c or c["kv_transfer_params"] is None for c in t.chunks if c not in finals)
    params = t.d_params
    assert params["do_remote_decode"] is True and params["remote_engine_id"] == rig_run["d"].engine_id
    summary = params[sc.KV_PARAMS_KEY]
    assert (summary[sc.KVT_ROLE], summary[sc.KVT_DECISION], summary[sc.KVT_TRACE_ID]) == (
        sc.ROLE_DECODE, sc.OUTCOME_PULLED, t.trace_id)
    assert summary[sc.KVT_RETAINED_BLOCKS] == len(params["remote_block_ids"][0])
