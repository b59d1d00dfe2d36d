"""The metrics pieces without vLLM: KVMetrics counts what KVRecorder's spans say, payloads merge
as vLLM aggregates them, KVPromMetrics exposes them, exposition keeps vLLM's colons, dropped spans
are counted, and a simulated worker's /metrics equals its spans."""

from __future__ import annotations

import threading

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.parser import text_string_to_metric_families

from kvtrace import semconv as sc
from kvtrace import telemetry
from kvtrace.emit import metrics as km
from kvtrace.emit.recorder import KVRecorder
from kvtrace.telemetry import exposition
from kvtrace.testing.wait import wait_for

BPB = 16 * 1000  # bytes per block


def _recorder(provider, metrics):
    return KVRecorder(
        provider,
        engine_id="e",
        role=sc.ROLE_PREFILL,
        block_size=16,
        bytes_per_block=BPB,
        threshold=64,
        ttl_s=480.0,
        metrics=metrics,
    )


def _families(registry=None, payloads=(), engines=None):
    registry = registry or CollectorRegistry()
    bound = [lambda cls=cls, **kw: cls(registry=registry, **kw) for cls in (Gauge, Counter, Histogram)]
    prom = km.KVPromMetrics(*bound, ["model_name", "engine"], engines or {0: ["m", "0"]})
    for payload in payloads:
        prom.observe(payload)
    return registry, prom


def samples(registry, name: str) -> dict[tuple, float]:
    """{(sorted label items minus model/engine): value} of sample ``name``."""
    out = {}
    for fam in registry.collect():
        for s in fam.samples:
            if s.name == name:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine", "le")))
                if "le" not in s.labels:
                    out[key] = s.value
    return out


def _pull_turn(rec, rid="r1", pulled=160, status=sc.TRANSFER_OK):
    rec.request_started(rid, phase=sc.ROLE_PREFILL, prompt_tokens=300)
    rec.decision(
        rid,
        direction=sc.DIRECTION_D2P,
        outcome=None,
        prompt_tokens=300,
        local_hit_tokens=96,
        remote_tokens=260,
        pulled_tokens=pulled,
    )
    rec.transfer_started(rid, direction=sc.DIRECTION_D2P, tokens=pulled, blocks=10)
    rec.transfer_finished(rid, status=status, error_type=None if status == sc.TRANSFER_OK else status)
    rec.request_finished(rid, output_tokens=1)


def test_recorder_counts_exactly_what_its_spans_say(tracer_provider, span_exporter):
    kv = km.KVMetrics()
    rec = _recorder(tracer_provider, kv)
    _pull_turn(rec, "r1")
    _pull_turn(rec, "r2", status=sc.TRANSFER_EXPIRED)
    rec.request_started("r3", phase=sc.ROLE_PREFILL, prompt_tokens=200)
    rec.decision(
        "r3",
        direction=sc.DIRECTION_D2P,
        outcome=sc.OUTCOME_BELOW_THRESHOLD,
        prompt_tokens=200,
        local_hit_tokens=160,
        remote_tokens=190,
    )
    rec.retention_started("r3", blocks=12, tokens=190)
    rec.request_finished("r3")
    payload = kv.drain()
    assert kv.drain() is None  # nothing new since
    spans = span_exporter.get_finished_spans()
    decisions = [s.attributes for s in spans if s.name == sc.SPAN_KV_DECISION]
    assert payload[km.DECISIONS] == {"d2p|pulled": 1, "d2p|expired": 1, "d2p|below_threshold": 1}
    assert payload[km.TOKENS] == {
        f"d2p|{src}": sum(d[attr] for d in decisions)
        for src, attr in (
            (sc.SOURCE_LOCAL_HIT, sc.KV_LOCAL_HIT_TOKENS),
            (sc.SOURCE_PULLED, sc.KV_PULLED_TOKENS),
            (sc.SOURCE_RECOMPUTED, sc.KV_RECOMPUTED_TOKENS),
        )
    }
    assert payload[km.TOKENS] == {"d2p|local_hit": 352, "d2p|pulled": 160, "d2p|recomputed": 44 + 204 + 40}
    transfers = {s.attributes[sc.KV_TRANSFER_STATUS]: s for s in spans if s.name == sc.SPAN_KV_TRANSFER}
    assert {k: [[round(sec, 9), b] for sec, b in v] for k, v in payload[km.TRANSFERS].items()} == {
        f"d2p|{st}": [[round((t.end_time - t.start_time) / 1e9, 9), 10 * BPB]] for st, t in transfers.items()
    }
    assert payload[km.RETAINED] == [12, 12 * BPB] and payload[km.ENDS] == {}
    rec.retention_ended("r3", sc.RETENTION_READ)
    [ret] = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_RETENTION]
    later = kv.drain()
    assert later[km.ENDS] == {sc.RETENTION_READ: 1} and later[km.RETAINED] == [0, 0]
    assert later[km.BYTE_SECONDS] == pytest.approx(12 * BPB * (ret.end_time - ret.start_time) / 1e9, rel=1e-12)
    assert later[km.DECISIONS] == {}


def test_no_metrics_no_cost():
    rec = _recorder(TracerProvider(), None)
    _pull_turn(rec)
    assert rec.metrics is None


def test_merge_adds_counters_concatenates_samples_keeps_latest_gauge():
    a = {
        **km.empty_payload(),
        km.DECISIONS: {"d2p|pulled": 1},
        km.TRANSFERS: {"d2p|ok": [[0.1, 10]]},
        km.BYTE_SECONDS: 2.0,
        km.RETAINED: [5, 50],
        km.VERIFICATIONS: {"match": 1},
    }
    b = {
        **km.empty_payload(),
        km.DECISIONS: {"d2p|pulled": 2, "p2d|pulled": 1},
        km.TRANSFERS: {"d2p|ok": [[0.2, 20]]},
        km.ENDS: {"read": 1},
        km.BYTE_SECONDS: 1.5,
        km.RETAINED: [1, 10],
        km.VERIFICATIONS: {"match": 1, "mismatch": 1},
        km.WRONG: 172,
    }
    merged = km.merge(km.merge(km.empty_payload(), a), b)
    assert merged == {
        km.DECISIONS: {"d2p|pulled": 3, "p2d|pulled": 1},
        km.TOKENS: {},
        km.TRANSFERS: {"d2p|ok": [[0.1, 10], [0.2, 20]]},
        km.ENDS: {"read": 1},
        km.BYTE_SECONDS: 3.5,
        km.RETAINED: [1, 10],
        km.VERIFICATIONS: {"match": 2, "mismatch": 1},
        km.WRONG: 172,
    }
    assert km.merge(dict(merged), None) == merged
    assert km.is_empty(km.empty_payload()) and km.is_empty(None) and not km.is_empty(b)
    assert not km.is_empty({**km.empty_payload(), km.RETAINED: [0, 0]})  # the gauge going to 0 is news


def test_prom_families_exist_at_zero_and_apply_payloads():
    registry, prom = _families()
    decisions = samples(registry, f"{sc.METRIC_KV_DECISIONS}_total")
    assert len(decisions) == len(sc.DIRECTIONS) * len(sc.OUTCOMES) and set(decisions.values()) == {0.0}
    prom.observe(
        {
            **km.empty_payload(),
            km.DECISIONS: {"d2p|pulled": 2},
            km.TOKENS: {"d2p|pulled": 300},
            km.TRANSFERS: {"d2p|ok": [[0.01, 1000], [0.02, 3000]], "d2p|failed": [[0.5, 999]]},
            km.ENDS: {"expired": 1},
            km.BYTE_SECONDS: 7.5,
            km.RETAINED: [3, 300],
        }
    )
    prom.observe({**km.empty_payload(), km.DECISIONS: {"d2p|pulled": 1}, km.RETAINED: [1, 100]})
    nz = lambda name: {k: v for k, v in samples(registry, name).items() if v}  # noqa: E731
    assert nz(f"{sc.METRIC_KV_DECISIONS}_total") == {(("direction", "d2p"), ("outcome", "pulled")): 3.0}
    assert nz(f"{sc.METRIC_KV_PROMPT_TOKENS}_total") == {(("direction", "d2p"), ("source", "pulled")): 300.0}
    assert nz(f"{sc.METRIC_KV_TRANSFER_BYTES}_total") == {(("direction", "d2p"),): 4000.0}  # ok loads only
    assert nz(f"{sc.METRIC_KV_TRANSFER_DURATION}_count") == {
        (("direction", "d2p"), ("status", "ok")): 2.0,
        (("direction", "d2p"), ("status", "failed")): 1.0,
    }
    assert nz(f"{sc.METRIC_KV_RETENTION_ENDS}_total") == {(("outcome", "expired"),): 1.0}
    assert nz(f"{sc.METRIC_KV_RETAINED_BYTE_SECONDS}_total") == {(): 7.5}
    assert (nz(sc.METRIC_KV_RETAINED_BLOCKS), nz(sc.METRIC_KV_RETAINED_BYTES)) == ({(): 1.0}, {(): 100.0})


def test_a_malformed_payload_is_logged_not_raised(caplog):
    registry, prom = _families()
    prom.observe({km.DECISIONS: {"d2p|pulled": "x"}, km.RETAINED: [1]})
    prom.observe({km.TRANSFERS: {"d2p|ok": [[0.1]]}})
    prom.observe({km.DECISIONS: {"d2p|pulled": 1}})
    assert len([r for r in caplog.records if "metrics payload" in r.getMessage()]) == 1
    assert samples(registry, f"{sc.METRIC_KV_DECISIONS}_total")[(("direction", "d2p"), ("outcome", "pulled"))] == 1.0


def test_prom_families_per_engine_index():
    registry, prom = _families(engines={0: ["m", "0"], 1: ["m", "1"]})
    prom.observe({**km.empty_payload(), km.DECISIONS: {"p2d|pulled": 4}}, engine_idx=1)
    got = {
        (s.labels["engine"]): s.value
        for fam in registry.collect()
        for s in fam.samples
        if s.name == f"{sc.METRIC_KV_DECISIONS}_total"
        and s.labels["outcome"] == "pulled"
        and s.labels["direction"] == "p2d"
    }
    assert got == {"0": 0.0, "1": 4.0}


def test_exposition_keeps_vllm_colons_for_prometheus():
    registry, prom = _families()
    prom.observe({**km.empty_payload(), km.DECISIONS: {"d2p|pulled": 1}})
    accept = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
        "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )  # what Prometheus 2.x sends
    body, ctype = exposition.render(registry, accept)
    text = body.decode()
    assert ctype == exposition.OPENMETRICS_CONTENT_TYPE and text.endswith("# EOF\n")
    line = 'vllm:kvtrace_decisions_total{direction="d2p",engine="0",model_name="m",outcome="pulled"} 1.0'
    assert line in text.splitlines()
    assert "vllm_kvtrace" not in text
    body, ctype = exposition.render(registry, None)
    assert ctype == exposition.TEXT_CONTENT_TYPE and line in body.decode().splitlines()
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {sc.METRIC_KV_DECISIONS, sc.METRIC_KV_RETAINED_BYTES} <= names


def test_dropped_spans_are_counted_queue_full_and_export_failed(monkeypatch):
    monkeypatch.setenv("KVTRACE_BATCH_SIZE", "2")  # queue = 8 spans
    monkeypatch.setenv("KVTRACE_BATCH_DELAY_MS", "60000")
    gate = threading.Event()

    class Stuck:
        calls = 0

        def export(self, spans):
            Stuck.calls += 1
            gate.wait(30)
            return SpanExportResult.FAILURE

        def shutdown(self):
            pass

    before = telemetry.dropped_spans()
    provider = telemetry.configure("drop-test", exporters=[Stuck()], otlp="off", handle_sigterm=False)
    tracer = provider.get_tracer("t")
    for i in range(2):  # one full batch wakes the export thread, which then hangs in export()
        tracer.start_span(f"s{i}").end()
    wait_for(lambda: Stuck.calls, 30, "the export thread inside export()", interval=0.01)
    for i in range(38):  # 8 fit in the queue, 30 are dropped
        tracer.start_span(f"t{i}").end()
    after = telemetry.dropped_spans()
    assert after.get(sc.DROP_QUEUE_FULL, 0) - before.get(sc.DROP_QUEUE_FULL, 0) == 30
    gate.set()
    provider.shutdown()
    failed = telemetry.dropped_spans().get(sc.DROP_EXPORT_FAILED, 0) - before.get(sc.DROP_EXPORT_FAILED, 0)
    assert failed == 2 + 8  # every span not dropped went to the failing exporter
    registry = CollectorRegistry()
    exposition.register_dropped_spans(registry)
    got = samples(registry, f"{sc.METRIC_DROPPED_SPANS}_total")
    assert got == {(("reason", r),): float(telemetry.dropped_spans().get(r, 0)) for r in sc.DROP_REASONS}


async def test_sim_worker_metrics_equal_its_spans(tracer_provider, span_exporter):
    from kvtrace.sim.cluster import SimCluster

    async with SimCluster(1, 1, cost=False, tracer_provider=tracer_provider, model="m", metrics=True) as c:
        async with aiohttp.ClientSession() as http:
            body = {
                "model": "m",
                "prompt": "hello " * 200,
                "max_tokens": 20,
                "kv_transfer_params": {"do_remote_decode": True},
            }
            p = (await (await http.post(c.prefill_urls[0] + "/v1/completions", json=body)).json())["kv_transfer_params"]
            p.pop(sc.KV_PARAMS_KEY)
            d_body = {**body, "max_tokens": 100, "kv_transfer_params": p}  # D offers 100 more tokens than P has
            d = await (await http.post(c.decode_urls[0] + "/v1/completions", json=d_body)).json()
            dp = d["kv_transfer_params"]
            dp.pop(sc.KV_PARAMS_KEY)
            turn2 = {
                **body,
                "prompt": body["prompt"] + d["choices"][0]["text"] + " more" * 150,
                "kv_transfer_params": dp,
            }
            await (await http.post(c.prefill_urls[0] + "/v1/completions", json=turn2)).json()
            texts = {}
            for role, url in (("p", c.prefill_urls[0]), ("d", c.decode_urls[0])):
                async with http.get(url + "/metrics") as r:
                    assert r.headers["Content-Type"] == exposition.TEXT_CONTENT_TYPE
                    texts[role] = await r.text()
            async with http.get(c.prefill_urls[0] + "/metrics", headers={"Accept": exposition.OPENMETRICS}) as r:
                assert r.headers["Content-Type"] == exposition.OPENMETRICS_CONTENT_TYPE
    spans = span_exporter.get_finished_spans()

    def values(text, name):
        return {
            tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine"))): s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == name and s.value
        }

    p_decisions = [
        s.attributes[sc.KV_OUTCOME]
        for s in spans
        if s.name == sc.SPAN_KV_DECISION and s.attributes[sc.KV_DIRECTION] == sc.DIRECTION_D2P
    ]
    assert sorted(p_decisions) == [sc.OUTCOME_NO_REMOTE, sc.OUTCOME_PULLED]
    assert values(texts["p"], f"{sc.METRIC_KV_DECISIONS}_total") == {
        (("direction", "d2p"), ("outcome", o)): float(p_decisions.count(o)) for o in p_decisions
    }
    [pull] = [s for s in spans if s.name == sc.SPAN_KV_TRANSFER and s.attributes[sc.KV_DIRECTION] == "d2p"]
    assert values(texts["p"], f"{sc.METRIC_KV_TRANSFER_BYTES}_total") == {
        (("direction", "d2p"),): float(pull.attributes[sc.KV_TRANSFER_BYTES])
    }
    assert values(texts["p"], f"{sc.VLLM_METRIC_NIXL_XFER_TIME}_count") == {(): 1.0}
    assert values(texts["p"], f"{sc.VLLM_METRIC_TTFT}_count") == {(): 2.0}
    assert values(texts["d"], f"{sc.METRIC_KV_RETENTION_ENDS}_total") == {(("outcome", "read"),): 1.0}
    assert values(texts["d"], f"{sc.METRIC_KV_DECISIONS}_total") == {(("direction", "p2d"), ("outcome", "pulled")): 1.0}
    assert sc.METRIC_DROPPED_SPANS in {f.name for f in text_string_to_metric_families(texts["d"])}


async def test_sim_metrics_off_has_no_route(tracer_provider):
    from kvtrace.sim.cluster import SimCluster

    async with SimCluster(1, 0, cost=False, tracer_provider=tracer_provider, metrics=False) as c:
        assert c.prefill[0].engine.recorder.metrics is None
        async with aiohttp.ClientSession() as http:
            async with http.get(c.prefill_urls[0] + "/metrics") as r:
                assert r.status == 404
