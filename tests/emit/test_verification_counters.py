"""The recorder counts P's check of D's digest beside its decisions, with the span's values."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvtrace import semconv as sc
from kvtrace.emit import metrics as km
from kvtrace.emit.recorder import KVRecorder

MISMATCH = {
    sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
    sc.KV_VERIFY_MODE: sc.VERIFY_RECORD,
    sc.KV_VERIFIED_TOKENS: 128,
    sc.KV_VERIFY_MISMATCH_TOKEN: 128,
    sc.KV_VERIFY_WRONG_TOKENS: 172,
}
MATCH = {sc.KV_VERIFIED: sc.VERIFIED_MATCH, sc.KV_VERIFY_MODE: sc.VERIFY_RECORD, sc.KV_VERIFIED_TOKENS: 300}


def _recorder(tracer_provider, metrics):
    return KVRecorder(
        tracer_provider, engine_id="p0", role=sc.ROLE_PREFILL, block_size=16, bytes_per_block=1024,
        threshold=64, ttl_s=480.0, metrics=metrics,
    )  # fmt: skip


def _decide(rec, rid: str, verification: dict | None, outcome: str | None = sc.OUTCOME_PULLED) -> dict:
    rec.request_started(rid, phase=sc.ROLE_PREFILL, prompt_tokens=400)
    rec.decision(
        rid,
        direction=sc.DIRECTION_D2P,
        outcome=outcome,
        prompt_tokens=400,
        local_hit_tokens=0,
        remote_tokens=300,
        pulled_tokens=300,
        verification=verification,
    )
    return rec.request_finished(rid, output_tokens=1)


def test_decisions_with_a_check_count_it_and_its_wrong_tokens(tracer_provider, span_exporter):
    metrics = km.KVMetrics()
    rec = _recorder(tracer_provider, metrics)
    summaries = [_decide(rec, "a", MISMATCH), _decide(rec, "b", MATCH), _decide(rec, "c", None)]
    payload = metrics.drain()
    assert payload[km.VERIFICATIONS] == {sc.VERIFIED_MISMATCH: 1, sc.VERIFIED_MATCH: 1}
    assert payload[km.WRONG] == 172
    assert payload[km.DECISIONS] == {"d2p|pulled": 3}
    assert [s.get(sc.KVT_VERIFIED) for s in summaries] == [sc.VERIFIED_MISMATCH, sc.VERIFIED_MATCH, None]
    decisions = {s.attributes[sc.GEN_AI_REQUEST_ID]: dict(s.attributes) for s in span_exporter.get_finished_spans()
                 if s.name == sc.SPAN_KV_DECISION}  # fmt: skip
    assert {k: decisions["a"][k] for k in MISMATCH} == MISMATCH
    assert not set(MISMATCH) & set(decisions["c"])


def test_a_pull_settled_later_is_counted_when_it_ends(tracer_provider):
    metrics = km.KVMetrics()
    rec = _recorder(tracer_provider, metrics)
    rec.request_started("a", phase=sc.ROLE_PREFILL, prompt_tokens=400)
    rec.decision("a", direction=sc.DIRECTION_D2P, outcome=None, prompt_tokens=400, local_hit_tokens=0,
                 remote_tokens=300, pulled_tokens=300, verification=MISMATCH)  # fmt: skip
    assert metrics.drain() is None  # the decision is still open
    rec.transfer_started("a", direction=sc.DIRECTION_D2P, tokens=300, blocks=19)
    rec.transfer_finished("a", status=sc.TRANSFER_OK)
    assert metrics.drain()[km.VERIFICATIONS] == {sc.VERIFIED_MISMATCH: 1}


def test_the_prometheus_families_show_every_verified_value():
    reg = CollectorRegistry()
    prom = km.KVPromMetrics(
        lambda **kw: Gauge(registry=reg, **kw),
        lambda **kw: Counter(registry=reg, **kw),
        lambda **kw: Histogram(registry=reg, **kw),
        ["model_name", "engine"],
        {0: ["m", "0"]},
    )
    prom.observe({**km.empty_payload(), km.VERIFICATIONS: {sc.VERIFIED_MISMATCH: 2}, km.WRONG: 344}, 0)
    labels = {"model_name": "m", "engine": "0"}
    name = sc.METRIC_KV_VERIFICATIONS + "_total"
    got = {v: reg.get_sample_value(name, {**labels, sc.LABEL_VERIFIED: v}) for v in sc.VERIFIED_VALUES}
    assert got == {sc.VERIFIED_MATCH: 0.0, sc.VERIFIED_MISMATCH: 2.0, sc.VERIFIED_UNVERIFIABLE: 0.0}
    assert reg.get_sample_value(sc.METRIC_KV_MISMATCHED_TOKENS + "_total", labels) == 344.0
