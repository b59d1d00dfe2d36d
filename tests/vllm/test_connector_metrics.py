"""The connector's vllm:kvtrace_* metrics through vLLM's own machinery (scheduler role, no workers).

vLLM's real Scheduler runs KVTraceNixlConnector; its SchedulerStats (what EngineCore sends to the
API server) go through vLLM's msgpack encoder and decoder, then into vLLM's own
KVConnectorProm (the Prometheus stat logger's connector hook, here on a private registry) and
KVConnectorLogging.  The resulting series must equal the spans of the same run, and NIXL's
vllm:nixl_* families must still see the workers' stats.
"""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc

from support.require import require_vllm

pytestmark = pytest.mark.vllm
require_vllm()
require_vllm("nixl")

from support import vllm_rig as rig  # noqa: E402
from support.connector_turns import BS, d_params, decode_turn, make_scheduler, nixl_stats, prefill_turn, run_step  # noqa: E402


def _capture(sched) -> list[dict]:
    """Every SchedulerStats.kv_connector_stats the scheduler emits, after vLLM's IPC encoding."""
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    seen: list[dict] = []
    original = sched.update_from_output
    enc, dec = MsgpackEncoder(), MsgpackDecoder(EngineCoreOutputs)

    def update(*args, **kwargs):
        outputs = original(*args, **kwargs)
        for eco in outputs.values():
            if eco.scheduler_stats is not None and eco.scheduler_stats.kv_connector_stats:
                seen.append(dec.decode(enc.encode(eco)).scheduler_stats.kv_connector_stats)
        return outputs

    sched.update_from_output = update
    return seen


def _prom(vllm_config):
    """vLLM's KVConnectorProm with its metric classes bound to a private registry."""
    from functools import partial

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm

    registry = CollectorRegistry()

    class Prom(KVConnectorProm):
        _gauge_cls = partial(Gauge, registry=registry)
        _counter_cls = partial(Counter, registry=registry)
        _histogram_cls = partial(Histogram, registry=registry)

    return Prom(vllm_config, ["model_name", "engine"], {0: ["tiny", "0"]}), registry


def _series(registry, name: str) -> dict[tuple, float]:
    return {
        tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))): s.value
        for fam in registry.collect()
        for s in fam.samples
        if s.name == name and s.value
    }


def _spans(exporter, name):
    return [s.attributes for s in exporter.get_finished_spans() if s.name == name]


def test_p_side_metrics_equal_spans_through_vllms_stats_path(connector_cls, model_dir, span_exporter):
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging

    sched = make_scheduler(model_dir)
    stats = _capture(sched)
    prefill_turn(sched, list(range(1, 101)), {"do_remote_decode": True})  # no_remote; 96 tokens cached
    req, _ = prefill_turn(sched, list(range(1, 301)), d_params(260, 17))  # pulls 164 from D
    nixl = nixl_stats(transfer_duration=[0.004], post_duration=[0.001], bytes_transferred=[123], num_descriptors=[4])
    run_step(sched, req, finished_recving={req.request_id}, stats=nixl)
    run_step(sched, req)
    prefill_turn(sched, list(range(2001, 2101)), {"do_remote_decode": True})  # no_remote; 96 more cached
    prefill_turn(sched, list(range(2001, 2201)), d_params(96 + 40, 9))  # 40 < 64: below_threshold
    assert stats, "the scheduler sent no connector stats"

    prom, registry = _prom(sched.vllm_config)
    logging = KVConnectorLogging(sched.vllm_config.kv_transfer_config)
    for data in stats:
        prom.observe(data, 0)
        logging.observe(data)
    decisions = _spans(span_exporter, sc.SPAN_KV_DECISION)
    outcomes = sorted(d[sc.KV_OUTCOME] for d in decisions)
    assert outcomes == ["below_threshold", "no_remote", "no_remote", "pulled"]
    assert _series(registry, f"{sc.METRIC_KV_DECISIONS}_total") == {
        (("direction", "d2p"), ("outcome", o)): float(outcomes.count(o)) for o in outcomes
    }
    want_tokens = {}
    for d in decisions:
        for source, attr in (
            (sc.SOURCE_LOCAL_HIT, sc.KV_LOCAL_HIT_TOKENS),
            (sc.SOURCE_PULLED, sc.KV_PULLED_TOKENS),
            (sc.SOURCE_RECOMPUTED, sc.KV_RECOMPUTED_TOKENS),
        ):
            key = (("direction", "d2p"), ("source", source))
            want_tokens[key] = want_tokens.get(key, 0) + d[attr]
    assert _series(registry, f"{sc.METRIC_KV_PROMPT_TOKENS}_total") == {
        k: float(v) for k, v in want_tokens.items() if v
    }
    assert want_tokens[(("direction", "d2p"), ("source", "pulled"))] == 164
    [transfer] = _spans(span_exporter, sc.SPAN_KV_TRANSFER)
    assert _series(registry, f"{sc.METRIC_KV_TRANSFER_BYTES}_total") == {
        (("direction", "d2p"),): float(transfer[sc.KV_TRANSFER_BYTES])
    }
    assert _series(registry, f"{sc.METRIC_KV_TRANSFER_DURATION}_count") == {
        (("direction", "d2p"), ("status", "ok")): 1.0
    }
    # NIXL's own families still see the workers' stats
    assert _series(registry, f"{sc.VLLM_METRIC_NIXL_XFER_TIME}_count") == {(): 1.0}
    assert _series(registry, f"{sc.VLLM_METRIC_NIXL_BYTES}_sum") == {(): 123.0}
    lines: list[str] = []
    logging.log(log_fn=lambda fmt, *args: lines.append(fmt % args))  # vLLM's periodic log line
    assert len(lines) == 1 and "Num successful transfers=1" in lines[0] and "kvtrace d2p pulled=1" in lines[0]
    assert logging.transfer_stats_accumulator is None


def test_d_side_retention_gauge_ends_and_byte_seconds(connector_cls, model_dir, span_exporter):
    sched = make_scheduler(model_dir, role="decode", engine="engine-d", ttl=480)
    stats = _capture(sched)
    prom, registry = _prom(sched.vllm_config)
    req, params = decode_turn(sched, list(range(1, 161)))
    for data in stats:
        prom.observe(data, 0)
    blocks = len(params["remote_block_ids"][0])
    retained_bytes = params[sc.KV_PARAMS_KEY][sc.KVT_RETAINED_BYTES]
    assert _series(registry, sc.METRIC_KV_RETAINED_BLOCKS) == {(): float(blocks)}
    assert _series(registry, sc.METRIC_KV_RETAINED_BYTES) == {(): float(retained_bytes)}
    assert _series(registry, f"{sc.METRIC_KV_DECISIONS}_total") == {(("direction", "p2d"), ("outcome", "pulled")): 1.0}
    stats.clear()
    run_step(sched, req, finished_sending={req.request_id})  # the next turn's P read the blocks
    for data in stats:
        prom.observe(data, 0)
    [ret] = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_RETENTION]
    assert _series(registry, sc.METRIC_KV_RETAINED_BLOCKS) == {}  # back to 0
    assert _series(registry, f"{sc.METRIC_KV_RETENTION_ENDS}_total") == {(("outcome", "read"),): 1.0}
    [(_, byte_s)] = _series(registry, f"{sc.METRIC_KV_RETAINED_BYTE_SECONDS}_total").items()
    assert byte_s == pytest.approx(retained_bytes * (ret.end_time - ret.start_time) / 1e9, rel=1e-9)


def test_worker_stats_of_several_ranks_aggregate(connector_cls):
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator

    from kvtrace.emit import metrics as km
    from kvtrace.vllm.metrics import KVTraceConnectorStats

    ranks = [
        KVTraceConnectorStats.wrap(
            nixl_stats(
                transfer_duration=[0.001 * (i + 1)], post_duration=[0.0], bytes_transferred=[100], num_descriptors=[1]
            )
        )
        for i in range(2)
    ]
    outputs = [rig.runner_output([], stats=s) for s in ranks]
    merged = KVOutputAggregator(expected_finished_count=2).aggregate(outputs).kv_connector_output.kv_connector_stats
    assert isinstance(merged, KVTraceConnectorStats)
    assert merged.data["transfer_duration"] == [0.001, 0.002] and merged.data["bytes_transferred"] == [100, 100]
    scheduler_part = KVTraceConnectorStats.wrap(None, {**km.empty_payload(), km.DECISIONS: {"d2p|pulled": 1}})
    merged.aggregate(scheduler_part)  # what the scheduler does after update_connector_output
    assert merged.data[sc.STATS_KEY][km.DECISIONS] == {"d2p|pulled": 1}
    assert not merged.is_empty() and not scheduler_part.is_empty()
    assert KVTraceConnectorStats().is_empty() and KVTraceConnectorStats.wrap(None, None) is None
    reduced = merged.reduce()
    assert reduced["Num successful transfers"] == 2 and reduced["kvtrace d2p pulled"] == 1


def test_metrics_off_keeps_nixl_only(connector_cls, model_dir, span_exporter):
    from kvtrace.vllm.metrics import KVTracePromMetrics

    extra = {"bidirectional_kv_xfer": True, sc.KV_PARAMS_KEY: {"role": "prefill", "metrics": False}}
    sched = rig.scheduler(rig.vllm_config(model_dir, extra=extra, block_size=BS))
    stats = _capture(sched)
    prefill_turn(sched, list(range(1, 101)), {"do_remote_decode": True})
    assert stats == [] and sched.connector._probe.recorder.metrics is None
    assert len(_spans(span_exporter, sc.SPAN_KV_DECISION)) == 1  # spans as before
    prom, registry = _prom(sched.vllm_config)
    assert not isinstance(prom.prom_metrics, KVTracePromMetrics)
    names = {fam.name for fam in registry.collect()}
    assert sc.VLLM_METRIC_NIXL_XFER_TIME in names and sc.METRIC_KV_DECISIONS not in names
