"""Real P/D end to end: three vLLM CPU servers (P, D, D2) with NIXL and the kvtrace connector
on loopback; the conversations are described in vllm_scenario.py.

Assertions are on kv_transfer_params, spans (Parquet, via kvtrace.store views), P's Prometheus
counters and which process made the connector's spans -- never on latency.  Every wait of the rig
is bounded and fails with every vLLM process's stacks and log tail (vllm_pd.RigError).
"""

from __future__ import annotations

import os

import pytest

from kvtrace import semconv as sc

from support.require import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
require_vllm()
require_vllm("nixl")

from opentelemetry.semconv.resource import ResourceAttributes  # noqa: E402
from opentelemetry.trace import SpanKind  # noqa: E402

from kvtrace.agent import kv_transfer_of  # noqa: E402
from kvtrace.store.schema import SPAN_KINDS  # noqa: E402
from kvtrace.vllm.config import public_request_id  # noqa: E402

from support import vllm_pd as pd  # noqa: E402
from support import vllm_rig as rig  # noqa: E402
from support import vllm_scenario as scenario  # noqa: E402

AGENT_SESSION = scenario.AGENT_SESSION
AGENT_MAX_TOKENS = scenario.AGENT_MAX_TOKENS
_rows = scenario.rows


@pytest.fixture(scope="module")
def rig_run(tmp_path_factory):
    return scenario.run(tmp_path_factory.mktemp("pd"))


def _decision(run, turn, role=sc.ROLE_PREFILL):
    return _decision_of(run, turn.request_id, role)


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
    [xfer] = _rows(
        rig_run["traces"],
        "SELECT * FROM kv_transfers WHERE request_id = ? AND direction = ?",
        [t1.request_id, sc.DIRECTION_D2P],
    )
    assert xfer["trace_id"] == t1.trace_id == dec["trace_id"]
    assert xfer["parent_span_id"] == dec["span_id"]
    assert (xfer["status"], xfer["tokens"], xfer["peer_engine_id"]) == (
        sc.TRANSFER_OK,
        dec["pulled_tokens"],
        rig_run["d"].engine_id,
    )
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
        sc.ROLE_DECODE,
        sc.OUTCOME_PULLED,
        t.trace_id,
    )
    assert summary[sc.KVT_RETAINED_BLOCKS] == len(params["remote_block_ids"][0])


# ---------------------------------------------------------------------------- agent -> proxy -> P/D
@pytest.fixture
def agent_run(rig_run):
    if "agent_error" in rig_run:
        pytest.fail(f"the agent session through the kvtrace proxy failed:\n{rig_run['agent_error']}")
    return rig_run


def _decision_of(run, request_id, role=sc.ROLE_PREFILL):
    rows = _rows(
        run["traces"], "SELECT * FROM kv_decisions WHERE request_id = ? AND engine_role = ?", [request_id, role]
    )
    assert len(rows) == 1, rows
    return rows[0]


def _d2p_transfer(run, request_id):
    [xfer] = _rows(
        run["traces"],
        "SELECT * FROM kv_transfers WHERE request_id = ? AND direction = ?",
        [request_id, sc.DIRECTION_D2P],
    )
    return xfer


@pytest.mark.parametrize("index", [0, 1])
def test_agent_stream_last_chunk_carries_kv_transfer(agent_run, index):
    t = agent_run["agent"][index]
    carrying = [n for n, chunk in enumerate(t.chunks) if kv_transfer_of(chunk) is not None]
    assert carrying == [len(t.chunks) - 1]  # only the last chunk: the usage chunk (include_usage)
    last = t.chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == AGENT_MAX_TOKENS[index]
    kvt = kv_transfer_of(last)
    assert t.kv_transfer == t.last_kv_transfer == t.result.kv_transfer == kvt
    assert (kvt[sc.KVT_TRACE_ID], kvt[sc.KVT_SESSION_ID], kvt[sc.KVT_TURN]) == (
        t.result.trace_id,
        AGENT_SESSION,
        t.proxy_turn,
    )
    assert (t.result.session_id, t.result.turn, t.result.error) == (AGENT_SESSION, index, None)
    assert kvt[sc.KVT_FALLBACK] == sc.FALLBACK_NONE
    assert kvt[sc.KVT_DECODE][sc.KVT_ROLE] == sc.ROLE_DECODE and kvt[sc.KVT_PREFILL][sc.KVT_ROLE] == sc.ROLE_PREFILL


def test_agent_turn_0_is_not_offered(agent_run):
    t0 = agent_run["agent"][0]
    kvt = t0.kv_transfer
    fields = (sc.KVT_OFFERED, sc.KVT_OFFER_REASON, sc.KVT_DECISION, sc.KVT_PULLED_TOKENS, sc.KVT_REMOTE_TOKENS)
    assert {k: kvt[k] for k in fields} == {
        sc.KVT_OFFERED: False,
        sc.KVT_OFFER_REASON: sc.OFFER_NO_ENTRY,
        sc.KVT_DECISION: sc.OUTCOME_NO_REMOTE,
        sc.KVT_PULLED_TOKENS: 0,
        sc.KVT_REMOTE_TOKENS: 0,
    }
    dec = _decision_of(agent_run, kvt[sc.KVT_REQUEST_ID])
    assert (dec["outcome"], dec["direction"], dec["pulled_tokens"], dec["remote_tokens"]) == (
        sc.OUTCOME_NO_REMOTE,
        sc.DIRECTION_D2P,
        0,
        0,
    )
    assert (dec["session_id"], dec["turn"], dec["trace_id"]) == (AGENT_SESSION, t0.proxy_turn, t0.result.trace_id)
    [req] = _rows(agent_run["traces"], "SELECT * FROM requests WHERE request_id = ?", [kvt[sc.KVT_REQUEST_ID]])
    assert (req["offered"], req["offer_reason"], req["outcome"], req["pulled_tokens"], req["http_status"]) == (
        False,
        sc.OFFER_NO_ENTRY,
        sc.OUTCOME_NO_REMOTE,
        0,
        200,
    )


def test_agent_turn_1_pulls_from_decode(agent_run):
    t0, t1 = agent_run["agent"]
    assert agent_run["agent_new_tokens"] >= 100
    kvt = t1.kv_transfer
    # turn 1's prompt = turn 0's prompt + the reply + the new user message (template tokens aside)
    assert kvt[sc.KVT_PROMPT_TOKENS] - t0.kv_transfer[sc.KVT_PROMPT_TOKENS] >= agent_run["agent_new_tokens"]
    dec = _decision_of(agent_run, kvt[sc.KVT_REQUEST_ID])
    assert (dec["outcome"], dec["direction"], dec["peer_engine_id"]) == (
        sc.OUTCOME_PULLED,
        sc.DIRECTION_D2P,
        agent_run["d"].engine_id,
    )
    assert kvt[sc.KVT_PULLED_TOKENS] == dec["pulled_tokens"] == agent_run["agent_metric_delta"] >= 64
    assert {
        k: kvt[k]
        for k in (
            sc.KVT_OFFERED,
            sc.KVT_OFFER_REASON,
            sc.KVT_DECISION,
            sc.KVT_PEER_ENGINE_ID,
            sc.KVT_LOCAL_HIT_TOKENS,
            sc.KVT_REMOTE_TOKENS,
            sc.KVT_PROMPT_TOKENS,
        )
    } == {
        sc.KVT_OFFERED: True,
        sc.KVT_OFFER_REASON: sc.OFFER_OFFERED,
        sc.KVT_DECISION: sc.OUTCOME_PULLED,
        sc.KVT_PEER_ENGINE_ID: agent_run["d"].engine_id,
        sc.KVT_LOCAL_HIT_TOKENS: dec["local_hit_tokens"],
        sc.KVT_REMOTE_TOKENS: dec["remote_tokens"],
        sc.KVT_PROMPT_TOKENS: dec["prompt_tokens"],
    }
    xfer = _d2p_transfer(agent_run, kvt[sc.KVT_REQUEST_ID])
    assert (xfer["status"], xfer["tokens"], kvt[sc.KVT_BYTES]) == (sc.TRANSFER_OK, dec["pulled_tokens"], xfer["bytes"])
    assert xfer["bytes"] == xfer["blocks"] * rig.BLOCK_BYTES > 0
    assert public_request_id(xfer["remote_request_id"]) == t0.kv_transfer[sc.KVT_REQUEST_ID]
    [req] = _rows(agent_run["traces"], "SELECT * FROM requests WHERE request_id = ?", [kvt[sc.KVT_REQUEST_ID]])
    assert (req["offered"], req["offer_reason"], req["outcome"], req["pulled_tokens"], req["http_status"]) == (
        True,
        sc.OFFER_OFFERED,
        sc.OUTCOME_PULLED,
        dec["pulled_tokens"],
        200,
    )
    [llm] = _rows(agent_run["traces"], "SELECT * FROM llm_calls WHERE request_id = ?", [kvt[sc.KVT_REQUEST_ID]])
    assert (llm["outcome"], llm["pulled_tokens"], llm["session_id"], llm["turn"], llm["trace_id"]) == (
        sc.OUTCOME_PULLED,
        dec["pulled_tokens"],
        AGENT_SESSION,
        1,
        t1.result.trace_id,
    )


def _kind(kind: SpanKind) -> str:
    return SPAN_KINDS[kind.value]


def test_agent_proxy_connector_trace_tree(agent_run):
    t1 = agent_run["agent"][1]
    rid, trace_id = t1.kv_transfer[sc.KVT_REQUEST_ID], t1.result.trace_id
    spans = {
        r["span_id"]: r
        for r in _rows(
            agent_run["traces"],
            "SELECT span_id, parent_span_id, name, kind, service_name, session_id, turn, request_id, engine_id "
            "FROM spans WHERE trace_id = ?",
            [trace_id],
        )
    }
    chain = [spans[_d2p_transfer(agent_run, rid)["span_id"]]]
    while chain[-1]["parent_span_id"] and chain[-1]["parent_span_id"] in spans:
        chain.append(spans[chain[-1]["parent_span_id"]])
    internal, client, server = _kind(SpanKind.INTERNAL), _kind(SpanKind.CLIENT), _kind(SpanKind.SERVER)
    p_service = agent_run["p"].service_name
    assert [(s["name"], s["kind"], s["service_name"]) for s in chain] == [
        (sc.SPAN_KV_TRANSFER, internal, p_service),
        (sc.SPAN_KV_DECISION, internal, p_service),
        (sc.SPAN_ENGINE_PREFILL, internal, p_service),
        (sc.SPAN_PROXY_PREFILL, client, pd.PROXY_SERVICE),
        (sc.SPAN_PROXY_REQUEST, server, pd.PROXY_SERVICE),
        (sc.SPAN_AGENT_LLM_CALL, client, pd.AGENT_SERVICE),
        (sc.SPAN_AGENT_TURN, internal, pd.AGENT_SERVICE),
        (sc.SPAN_AGENT_SESSION, internal, pd.AGENT_SERVICE),
    ]
    assert chain[-1]["parent_span_id"] == ""  # the agent session is the trace's root
    assert chain[1]["span_id"] == _decision_of(agent_run, rid)["span_id"]
    assert [s["request_id"] for s in chain[:6]] == [rid] * 6
    assert [s["turn"] for s in chain] == [t1.proxy_turn] * 5 + [1, 1, None]
    assert [s["engine_id"] for s in chain[:3]] == [agent_run["p"].engine_id] * 3
    # D's side of the same request hangs off the proxy's D leg
    [leg] = [
        s for s in spans.values() if s["parent_span_id"] == chain[4]["span_id"] and s["name"] == sc.SPAN_PROXY_DECODE
    ]
    [engine_d] = [s for s in spans.values() if s["parent_span_id"] == leg["span_id"]]
    assert (engine_d["name"], engine_d["engine_id"], engine_d["request_id"], leg["kind"]) == (
        sc.SPAN_ENGINE_DECODE,
        agent_run["d"].engine_id,
        rid,
        client,
    )


def test_agent_session_id_on_agent_proxy_and_connector_spans(agent_run):
    t0, t1 = agent_run["agent"]
    assert t0.result.trace_id == t1.result.trace_id  # one agent session = one trace
    rows = _rows(
        agent_run["traces"], "SELECT service_name, name, session_id FROM spans WHERE trace_id = ?", [t1.result.trace_id]
    )
    assert {r["service_name"] for r in rows} == {
        pd.AGENT_SERVICE,
        pd.PROXY_SERVICE,
        agent_run["p"].service_name,
        agent_run["d"].service_name,
    }
    assert {r["session_id"] for r in rows} == {AGENT_SESSION}
    assert {r["name"] for r in rows} >= {
        sc.SPAN_AGENT_SESSION,
        sc.SPAN_AGENT_TURN,
        sc.SPAN_AGENT_LLM_CALL,
        sc.SPAN_PROXY_REQUEST,
        sc.SPAN_PROXY_PREFILL,
        sc.SPAN_PROXY_DECODE,
        sc.SPAN_ENGINE_PREFILL,
        sc.SPAN_ENGINE_DECODE,
        sc.SPAN_KV_DECISION,
        sc.SPAN_KV_TRANSFER,
        sc.SPAN_KV_RETENTION,
    }


def test_agent_turn_0_retention_on_decode_ends_read(agent_run):
    t0 = agent_run["agent"][0]
    kvt = t0.kv_transfer
    [ret] = _rows(agent_run["traces"], "SELECT * FROM kv_retention WHERE request_id = ?", [kvt[sc.KVT_REQUEST_ID]])
    assert (ret["outcome"], ret["engine_id"], ret["session_id"], ret["turn"], ret["trace_id"], ret["ttl_s"]) == (
        sc.RETENTION_READ,
        agent_run["d"].engine_id,
        AGENT_SESSION,
        t0.proxy_turn,
        t0.result.trace_id,
        480,
    )
    assert (ret["blocks"], ret["bytes"]) == (kvt[sc.KVT_RETAINED_BLOCKS], kvt[sc.KVT_RETAINED_BYTES])
    assert ret["bytes"] == ret["blocks"] * rig.BLOCK_BYTES > 0


# ---------------------------------------------------------------------------- which process made the spans
def test_connector_spans_come_from_each_engines_scheduler_process(rig_run):
    """The connector records in the scheduler role only, i.e. in the EngineCore process; its
    worker role (inside EngineCore with the uni executor, a VLLM::Worker process with mp) only
    forwards.  Each server's spans carry its EngineCore's pid, engine id and role."""
    servers = [rig_run[name] for name in ("p", "d", "d2")]
    layout = servers[0].layout
    titles = ["VLLM::EngineCore"] if layout == "uni" else ["VLLM::EngineCore", "VLLM::Worker"]
    pids = rig_run["pids"]
    assert {s.name: sorted(pids[s.name]) for s in servers} == {s.name: titles for s in servers}
    assert all(len(found) == 1 for s in servers for found in pids[s.name].values())
    got = _rows(
        rig_run["traces"],
        "SELECT DISTINCT service_name, engine_id, engine_role, ResourceAttributes[?] AS pid "
        "FROM spans WHERE substrate = ?",
        [ResourceAttributes.PROCESS_PID, sc.SUBSTRATE_VLLM],
    )
    assert {tuple(r.values()) for r in got} == {
        (s.service_name, s.engine_id, s.role, str(pids[s.name]["VLLM::EngineCore"][0])) for s in servers
    }


def test_every_engine_thread_may_use_every_cpu(rig_run):
    """vLLM pins its NIXL worker's thread (and what it starts) to the last core; the rig undoes it
    so the three engines do not queue on one core (docs/troubleshooting.md)."""
    wide = frozenset(os.sched_getaffinity(0))
    assert rig_run["affinities"] == {name: {wide} for name in ("p", "d", "d2")}


# ---------------------------------------------------------------------------- what-if on real traces
def test_whatif_recorded_row_equals_the_run(rig_run):
    """``kvtrace whatif`` on this run's traces: its recorded row (D at TTL 480 s and D2 at 10 s,
    each its own) gives back, exactly, the d2p outcomes, tokens, GiB·s held and mean TTFT vLLM
    recorded; the 480 s row applies 480 s to both Ds, so D2's expired turn is pulled there."""
    from support.whatif_check import check_recorded_row, recorded_outcomes

    row = check_recorded_row(rig_run["traces"])
    assert row["ttl_s"] is None and row["expired"] == 1 and row["pulled"] >= 2
    from kvtrace.analysis.whatif.replay import load, replay
    from kvtrace.store import connect

    rec = load(connect(rig_run["traces"]))
    assert rec.ttls == [10.0, 480.0]
    at_480 = replay(rec, 480.0, 64).row
    recorded = recorded_outcomes(rig_run["traces"])
    assert (at_480["expired"], at_480["pulled"]) == (0, recorded["pulled"] + 1)


# ---------------------------------------------------------------------------- the same views on ClickHouse
def test_every_view_is_equal_on_clickhouse(rig_run):
    """This run's spans loaded into chDB as the OTel Collector's ClickHouse exporter writes them:
    every view of the registry gives DuckDB's rows (tests/store/clickhouse/test_views_match_duckdb.py's check; chDB is
    in the dev extra, so a missing chDB fails here rather than skipping)."""
    from kvtrace.store.views import VIEWS

    from support import clickhouse_check

    counts = clickhouse_check.check_views(rig_run["traces"])
    assert set(counts) == {v.name for v in VIEWS}
    assert counts["kv_decisions"] > 0 and counts["kv_retention"] >= 4 and counts["turn_gaps"] == counts["kv_retention"]
