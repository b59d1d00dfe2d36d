"""KVTraceNixlConnector inside vLLM's real Scheduler (scheduler role, no workers, no NIXL I/O).

The worker side is played by hand-made ModelRunnerOutputs, as vLLM's own connector tests do.
"""

from __future__ import annotations

import inspect

import pytest

from kvtrace import semconv as sc

from support.require import require_vllm

pytestmark = pytest.mark.vllm
require_vllm()
require_vllm("nixl")

from support import vllm_rig as rig  # noqa: E402
from support.connector_turns import (  # noqa: E402
    BLOCK_BYTES,
    BS,
    D_ENGINE,
    P_ENGINE,
    TRACEPARENT,
    d_params,
    decode_turn,
    finished_params,
    make_scheduler,
    nixl_stats,
    prefill_turn,
    run_step,
)


def _spans(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


# ------------------------------------------------------------------------------ contract
def test_every_base_method_is_forwarded_explicitly(connector_cls):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA

    public = {n for cls in (KVConnectorBase_V1, SupportsHMA) for n in vars(cls) if not n.startswith("_")}
    missing = sorted(n for n in public if n not in vars(connector_cls))
    assert missing == [], f"vLLM hooks not forwarded by KVTraceNixlConnector: {missing}"
    for name in public:
        raw = inspect.getattr_static(connector_cls, name)
        base = inspect.getattr_static(KVConnectorBase_V1 if name in vars(KVConnectorBase_V1) else SupportsHMA, name)
        assert type(raw) is type(base), f"{name}: {type(raw).__name__} vs vLLM's {type(base).__name__}"
        target = raw.fget if isinstance(raw, property) else getattr(raw, "__func__", raw)
        assert target.__doc__, f"{name} has no docstring saying who calls it"


def test_class_level_contract_is_nixls(connector_cls, model_dir):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats

    cfg = rig.vllm_config(model_dir, extra={})
    assert KVConnectorFactory.get_connector_class(cfg.kv_transfer_config) is connector_cls
    assert supports_hma(connector_cls)
    assert connector_cls._cache_hit_source == NixlConnector._cache_hit_source
    assert connector_cls.get_required_kvcache_layout(cfg) == NixlConnector.get_required_kvcache_layout(cfg)
    assert isinstance(connector_cls.build_kv_connector_stats({"transfer_duration": []}), NixlKVConnectorStats)


@pytest.mark.parametrize(
    "internal, public",
    [
        ("chatcmpl-req-42-1a2b3c4d", "req-42"),
        ("cmpl-abc-0-deadbeef", "abc"),
        ("plain", "plain"),
        ("chatcmpl-9f1e-2-0011aabb", "9f1e-2"),
    ],
)
def test_public_request_id(internal, public):
    from kvtrace.vllm.config import public_request_id

    assert public_request_id(internal) == public


# ------------------------------------------------------------------------------ P side
def test_turn1_prefill_no_remote_and_summary_in_params(connector_cls, model_dir, span_exporter):
    sched = make_scheduler(model_dir)
    ctx = {sc.CTX_TRACEPARENT: TRACEPARENT, sc.CTX_SESSION_ID: "s1", sc.CTX_TURN: 0}
    req, eo = prefill_turn(sched, list(range(1, 201)), {"do_remote_decode": True, sc.KV_PARAMS_KEY: ctx})
    params = finished_params(eo, req.request_id)
    assert params["do_remote_prefill"] is True and params["remote_engine_id"] == P_ENGINE
    [decision] = _spans(span_exporter, sc.SPAN_KV_DECISION)
    [engine] = _spans(span_exporter, sc.SPAN_ENGINE_PREFILL)
    ident = {
        sc.GEN_AI_REQUEST_ID: req.request_id.split("-")[1],
        sc.SESSION_ID: "s1",
        sc.GEN_AI_CONVERSATION_ID: "s1",
        sc.TURN_INDEX: 0,
        sc.ENGINE_ID: P_ENGINE,
        sc.ENGINE_ROLE: sc.ROLE_PREFILL,
    }
    assert dict(decision.attributes) == {
        **ident,
        sc.KV_DIRECTION: sc.DIRECTION_D2P,
        sc.KV_OUTCOME: sc.OUTCOME_NO_REMOTE,
        sc.KV_PROMPT_TOKENS: 200,
        sc.KV_LOCAL_HIT_TOKENS: 0,
        sc.KV_REMOTE_TOKENS: 0,
        sc.KV_PULLED_TOKENS: 0,
        sc.KV_RECOMPUTED_TOKENS: 200,
        sc.KV_THRESHOLD: 64,
        sc.KV_LOAD_FAILURE_POLICY: "fail",
    }
    assert dict(engine.attributes) == {
        **ident,
        sc.KV_PROMPT_TOKENS: 200,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 1,
        sc.REQUEST_CACHED_TOKENS: 0,
    }
    assert format(engine.context.trace_id, "032x") == TRACEPARENT[3:35]
    assert format(engine.parent.span_id, "016x") == TRACEPARENT[36:52]
    assert decision.parent.span_id == engine.context.span_id
    assert params[sc.KV_PARAMS_KEY] == {
        sc.KVT_TRACE_ID: TRACEPARENT[3:35],
        sc.KVT_REQUEST_ID: ident[sc.GEN_AI_REQUEST_ID],
        sc.KVT_SESSION_ID: "s1",
        sc.KVT_TURN: 0,
        sc.KVT_ENGINE_ID: P_ENGINE,
        sc.KVT_ROLE: sc.ROLE_PREFILL,
        sc.KVT_PROMPT_TOKENS: 200,
        sc.KVT_DECISION: sc.OUTCOME_NO_REMOTE,
        sc.KVT_LOCAL_HIT_TOKENS: 0,
        sc.KVT_REMOTE_TOKENS: 0,
        sc.KVT_PULLED_TOKENS: 0,
        sc.KVT_RECOMPUTED_TOKENS: 200,
        sc.KVT_PEER_ENGINE_ID: None,
    }


def test_turn2_pull_decision_transfer_and_stats(connector_cls, model_dir, span_exporter):
    sched = make_scheduler(model_dir)
    prefill_turn(sched, list(range(1, 101)), {"do_remote_decode": True})  # 96 tokens now cached on P
    prompt = list(range(1, 301))
    req, eo = prefill_turn(sched, prompt, d_params(260, 17))
    assert req.request_id not in sched.running  # waiting for the remote KV
    stats = nixl_stats(transfer_duration=[0.004], post_duration=[0.001], bytes_transferred=[123], num_descriptors=[4])
    run_step(sched, req, finished_recving={req.request_id}, stats=stats)
    eo, _ = run_step(sched, req)
    params = finished_params(eo, req.request_id)
    decision = [s for s in _spans(span_exporter, sc.SPAN_KV_DECISION) if s.attributes[sc.KV_OUTCOME] == "pulled"]
    [transfer] = _spans(span_exporter, sc.SPAN_KV_TRANSFER)
    assert len(decision) == 1
    d = decision[0].attributes
    assert (d[sc.KV_LOCAL_HIT_TOKENS], d[sc.KV_REMOTE_TOKENS], d[sc.KV_PULLED_TOKENS], d[sc.KV_RECOMPUTED_TOKENS]) == (
        96,
        260,
        164,
        40,
    )
    assert d[sc.KV_PEER_ENGINE_ID] == D_ENGINE and d[sc.KV_REMOTE_REQUEST_ID] == "chatcmpl-prev-0000abcd"
    assert 290 < d[sc.KV_EXPIRY_REMAINING_S] <= 300
    t = dict(transfer.attributes)
    blocks = -(-260 // BS) - 96 // BS  # blocks allocated past the local hit
    assert {
        k: t[k]
        for k in (
            sc.KV_DIRECTION,
            sc.KV_TRANSFER_TOKENS,
            sc.KV_TRANSFER_BLOCKS,
            sc.KV_TRANSFER_BYTES,
            sc.KV_TRANSFER_STATUS,
            sc.KV_TRANSFER_XFER_MS,
            sc.KV_TRANSFER_POST_MS,
            sc.KV_PEER_ENGINE_ID,
        )
    } == {
        sc.KV_DIRECTION: sc.DIRECTION_D2P,
        sc.KV_TRANSFER_TOKENS: 164,
        sc.KV_TRANSFER_BLOCKS: blocks,
        sc.KV_TRANSFER_BYTES: blocks * BLOCK_BYTES,
        sc.KV_TRANSFER_STATUS: sc.TRANSFER_OK,
        sc.KV_TRANSFER_XFER_MS: 4.0,
        sc.KV_TRANSFER_POST_MS: 1.0,
        sc.KV_PEER_ENGINE_ID: D_ENGINE,
    }
    assert transfer.parent.span_id == decision[0].context.span_id
    summary = params[sc.KV_PARAMS_KEY]
    assert (summary[sc.KVT_DECISION], summary[sc.KVT_PULLED_TOKENS], summary[sc.KVT_BYTES]) == (
        "pulled",
        164,
        blocks * BLOCK_BYTES,
    )
    assert summary[sc.KVT_TRANSFER_MS] >= 0


@pytest.mark.parametrize(
    "remote_tokens, outcome",
    [(96 + 40, sc.OUTCOME_BELOW_THRESHOLD), (90, sc.OUTCOME_LOCAL_HIT)],
)
def test_no_pull_outcomes(connector_cls, model_dir, span_exporter, remote_tokens, outcome):
    sched = make_scheduler(model_dir)
    prefill_turn(sched, list(range(1, 101)), {"do_remote_decode": True})
    req, eo = prefill_turn(sched, list(range(1, 201)), d_params(remote_tokens, 9))
    params = finished_params(eo, req.request_id)
    assert params[sc.KV_PARAMS_KEY][sc.KVT_DECISION] == outcome
    [d] = [s for s in _spans(span_exporter, sc.SPAN_KV_DECISION) if s.attributes[sc.KV_REMOTE_TOKENS]]
    assert (
        d.attributes[sc.KV_OUTCOME],
        d.attributes[sc.KV_PULLED_TOKENS],
        d.attributes[sc.KV_LOCAL_HIT_TOKENS],
        d.attributes[sc.KV_RECOMPUTED_TOKENS],
    ) == (outcome, 0, 96, 104)
    assert _spans(span_exporter, sc.SPAN_KV_TRANSFER) == []


@pytest.mark.parametrize(
    "expired_stats, outcome, status",
    [([1], sc.OUTCOME_EXPIRED, sc.TRANSFER_EXPIRED), ([], sc.OUTCOME_FAILED, sc.TRANSFER_FAILED)],
)
def test_failed_pull_is_expired_or_failed(connector_cls, model_dir, span_exporter, expired_stats, outcome, status):
    sched = make_scheduler(model_dir)
    req, _ = prefill_turn(sched, list(range(1, 201)), d_params(180, 12, expiry_in=2.0))
    stats = nixl_stats(num_kv_expired_reqs=expired_stats, num_failed_transfers=[] if expired_stats else [1])
    run_step(sched, req, finished_recving={req.request_id}, failed_recving={req.request_id}, stats=stats)
    [d] = _spans(span_exporter, sc.SPAN_KV_DECISION)
    [t] = _spans(span_exporter, sc.SPAN_KV_TRANSFER)
    assert (d.attributes[sc.KV_OUTCOME], d.attributes[sc.KV_PULLED_TOKENS], d.attributes[sc.KV_RECOMPUTED_TOKENS]) == (
        outcome,
        0,
        200,
    )
    assert (t.attributes[sc.KV_TRANSFER_STATUS], t.attributes[sc.ERROR_TYPE]) == (status, status)
    assert t.status.status_code.name == "ERROR"


def test_unattributable_stats_become_events(connector_cls, model_dir, span_exporter):
    sched = make_scheduler(model_dir)
    a, _ = prefill_turn(sched, list(range(1, 201)), d_params(180, 12))
    b = rig.request(list(range(500, 700)), params=d_params(180, 12), max_tokens=1, block_size=BS)
    sched.add_request(b)
    run_step(sched, b)
    stats = nixl_stats(transfer_duration=[0.002, 0.003], post_duration=[0.001, 0.001], bytes_transferred=[10, 20])
    out = sched.schedule()
    sched.update_from_output(out, rig.runner_output([], finished_recving={a.request_id, b.request_id}, stats=stats))
    sched.finish_requests(
        [a.request_id, b.request_id], __import__("vllm.v1.request", fromlist=["x"]).RequestStatus.FINISHED_ABORTED
    )
    engines = _spans(span_exporter, sc.SPAN_ENGINE_PREFILL)
    assert len(engines) == 2
    for span in engines:
        [event] = [e for e in span.events if e.name == sc.EVENT_NIXL_STATS]
        assert dict(event.attributes) == {
            sc.NIXL_NUM_TRANSFERS: 2,
            sc.NIXL_BYTES: 30,
            sc.NIXL_XFER_MS: 5.0,
            sc.NIXL_POST_MS: 2.0,
            sc.NIXL_NUM_FAILED: 0,
            sc.NIXL_NUM_EXPIRED: 0,
        }
    assert {t.attributes[sc.KV_TRANSFER_STATUS] for t in _spans(span_exporter, sc.SPAN_KV_TRANSFER)} == {"ok"}


# ------------------------------------------------------------------------------ D side
@pytest.mark.parametrize("ttl, outcome", [(480, sc.RETENTION_READ), (0, sc.RETENTION_EXPIRED)])
def test_decode_pull_and_retention(connector_cls, model_dir, span_exporter, ttl, outcome):
    sched = make_scheduler(model_dir, role="decode", engine=D_ENGINE, ttl=ttl)
    req, params = decode_turn(sched, list(range(1, 161)))
    assert params["do_remote_decode"] is True and params["remote_engine_id"] == D_ENGINE
    [d] = _spans(span_exporter, sc.SPAN_KV_DECISION)
    assert (d.attributes[sc.KV_DIRECTION], d.attributes[sc.KV_OUTCOME], d.attributes[sc.KV_PULLED_TOKENS]) == (
        sc.DIRECTION_P2D,
        sc.OUTCOME_PULLED,
        160,
    )
    [engine] = _spans(span_exporter, sc.SPAN_ENGINE_DECODE)
    assert format(engine.context.trace_id, "032x") == TRACEPARENT[3:35]  # from the trace headers
    summary = params[sc.KV_PARAMS_KEY]
    blocks = len(params["remote_block_ids"][0])
    assert (summary[sc.KVT_RETAINED_BLOCKS], summary[sc.KVT_RETAINED_BYTES], summary[sc.KVT_RETAINED_TTL_S]) == (
        blocks,
        blocks * BLOCK_BYTES,
        float(ttl),
    )
    assert _spans(span_exporter, sc.SPAN_KV_RETENTION) == []  # held until the next turn reads it
    run_step(sched, req, finished_sending={req.request_id})
    [ret] = _spans(span_exporter, sc.SPAN_KV_RETENTION)
    assert {
        k: ret.attributes[k]
        for k in (
            sc.KV_RETENTION_BLOCKS,
            sc.KV_RETENTION_TOKENS,
            sc.KV_RETENTION_BYTES,
            sc.KV_RETENTION_OUTCOME,
            sc.KV_EXPIRY_DEADLINE,
        )
    } == {
        sc.KV_RETENTION_BLOCKS: blocks,
        sc.KV_RETENTION_TOKENS: params["remote_num_tokens"],
        sc.KV_RETENTION_BYTES: blocks * BLOCK_BYTES,
        sc.KV_RETENTION_OUTCOME: outcome,
        sc.KV_EXPIRY_DEADLINE: params["remote_blocks_expiry_time"],
    }
    assert ret.parent.span_id == engine.context.span_id
    assert sched.connector._probe._retained == {}


def test_echoed_worker_summary_is_not_a_context(connector_cls, model_dir, span_exporter):
    sched = make_scheduler(model_dir)
    echoed = {sc.KVT_ENGINE_ID: D_ENGINE, sc.KVT_SESSION_ID: "old", sc.KVT_TURN: 3, sc.KVT_DECISION: "pulled"}
    req, eo = prefill_turn(sched, list(range(1, 201)), d_params(40, 3, ctx=echoed))
    assert finished_params(eo, req.request_id)[sc.KV_PARAMS_KEY][sc.KVT_SESSION_ID] is None
    for span in _spans(span_exporter, sc.SPAN_ENGINE_PREFILL) + _spans(span_exporter, sc.SPAN_KV_DECISION):
        assert sc.SESSION_ID not in span.attributes and sc.TURN_INDEX not in span.attributes
    assert _spans(span_exporter, sc.SPAN_ENGINE_PREFILL)[0].parent is None


# ------------------------------------------------------------------------------ never changes vLLM
def _conversation(sched):
    """Turn 1 then a pulling turn 2 on P; returns what vLLM hands back (params sans kvtrace, tokens)."""
    seen = []
    r1, eo = prefill_turn(sched, list(range(1, 101)), {"do_remote_decode": True})
    seen.append(finished_params(eo, r1.request_id))
    r2, _ = prefill_turn(sched, list(range(1, 301)), d_params(260, 17))
    run_step(sched, r2, finished_recving={r2.request_id}, stats=nixl_stats(transfer_duration=[0.001]))
    eo, out = run_step(sched, r2)
    seen.append(finished_params(eo, r2.request_id))
    for p in seen:
        p.pop(sc.KV_PARAMS_KEY, None)
        p.pop("remote_request_id")
        p.pop("remote_engine_id")
    return seen, sched.make_stats()


class _Raising:
    def __getattr__(self, name):
        if name in ("shutdown", "force_flush"):  # let the process exit quietly
            return lambda *a, **k: True

        def boom(*a, **k):
            raise RuntimeError(f"exporter {name} exploded")

        return boom


def test_raising_telemetry_does_not_change_vllm(monkeypatch, model_dir, caplog):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from kvtrace.vllm.connector import KVTraceNixlConnector

    bare, bare_stats = _conversation(make_scheduler(model_dir, connector="NixlConnector"))
    provider = TracerProvider()
    provider.add_span_processor(_Raising())  # on_start / on_end raise inside the SDK
    provider.add_span_processor(SimpleSpanProcessor(_Raising()))  # export raises
    monkeypatch.setattr(KVTraceNixlConnector, "tracer_provider", provider)
    sched = make_scheduler(model_dir)
    wrapped, wrapped_stats = _conversation(sched)
    assert wrapped == bare
    assert wrapped_stats.prefix_cache_stats == bare_stats.prefix_cache_stats
    assert wrapped_stats.connector_prefix_cache_stats == bare_stats.connector_prefix_cache_stats
    assert "exploded" in caplog.text


def test_kv_pool_size_is_a_resource_attribute(monkeypatch, model_dir):
    """The what-if advisor reports memory held as a share of D's KV pool: the connector records the
    pool's size (KVCacheConfig.num_blocks x bytes per block) on its resource."""
    from opentelemetry.sdk.trace import TracerProvider

    from kvtrace.vllm import config
    from kvtrace.vllm.connector import KVTraceNixlConnector

    seen = []
    monkeypatch.setattr(KVTraceNixlConnector, "tracer_provider", None)
    monkeypatch.setattr(config, "_providers", {})
    monkeypatch.setattr(
        config, "configure", lambda service, **kw: seen.append((service, kw["resource_attributes"])) or TracerProvider()
    )
    sched = make_scheduler(model_dir, role="decode", engine=D_ENGINE)
    blocks = sched.kv_cache_config.num_blocks
    assert blocks > 0
    assert seen == [
        (
            "vllm-decode",
            {
                sc.SUBSTRATE: sc.SUBSTRATE_VLLM,
                sc.ENGINE_ID: D_ENGINE,
                sc.ENGINE_ROLE: sc.ROLE_DECODE,
                sc.ENGINE_KV_POOL_BYTES: blocks * BLOCK_BYTES,
            },
        )
    ]


def test_whatif_reproduces_the_connectors_recorded_decisions(connector_cls, model_dir, span_exporter, tmp_path):
    """``kvtrace whatif``'s recorded row from spans vLLM's real scheduler made through the connector:
    applied to each recorded decision's inputs, kvtrace.kvrules gives back what vLLM decided (no
    remote, pulled, below threshold, local hit, expired)."""
    from kvtrace.store.convert import spans_to_table
    from kvtrace.testing.synth import write_table

    from support.whatif_check import check_recorded_row

    sched = make_scheduler(model_dir)
    prefill_turn(sched, list(range(1, 101)), {"do_remote_decode": True})  # no remote
    for base, remote, blocks in ((1000, 260, 17), (2000, 136, 9), (3000, 90, 9)):  # pulled, below, local hit
        prefill_turn(sched, list(range(base + 1, base + 101)), {"do_remote_decode": True})  # 96 tokens cached
        req, _ = prefill_turn(sched, list(range(base + 1, base + 301)), d_params(remote, blocks))
        if req.request_id not in sched.running:
            run_step(sched, req, finished_recving={req.request_id})
            run_step(sched, req)
    req, _ = prefill_turn(sched, list(range(4001, 4201)), d_params(180, 12, expiry_in=2.0))
    run_step(
        sched,
        req,
        finished_recving={req.request_id},
        failed_recving={req.request_id},
        stats=nixl_stats(num_kv_expired_reqs=[1]),
    )
    d_sched = make_scheduler(model_dir, role="decode", engine=D_ENGINE)
    d_req, _ = decode_turn(d_sched, list(range(5001, 5161)))
    run_step(d_sched, d_req, finished_sending={d_req.request_id})
    spans = span_exporter.get_finished_spans()
    outcomes = sorted(
        s.attributes[sc.KV_OUTCOME]
        for s in spans
        if s.name == sc.SPAN_KV_DECISION and s.attributes[sc.KV_DIRECTION] == sc.DIRECTION_D2P
    )
    assert outcomes == sorted(
        [sc.OUTCOME_NO_REMOTE] * 4
        + [sc.OUTCOME_PULLED, sc.OUTCOME_BELOW_THRESHOLD, sc.OUTCOME_LOCAL_HIT, sc.OUTCOME_EXPIRED]
    )
    write_table(spans_to_table(list(spans)), tmp_path)
    row = check_recorded_row(tmp_path)
    assert (row["pulled"], row["below_threshold"], row["local_hit"], row["expired"], row["no_remote"]) == (
        1,
        1,
        1,
        1,
        4,
    )
