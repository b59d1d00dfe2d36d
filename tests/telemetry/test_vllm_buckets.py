"""The histograms that say they use vLLM's buckets use the installed vLLM's: a proxy or simulated
TTFT histogram compares bucket for bucket with a real worker's ``vllm:time_to_first_token_seconds``
only while the two lists are equal, so this fails when vLLM changes its buckets."""

from __future__ import annotations

from kvtrace.proxy import metrics as proxy_metrics
from kvtrace.sim import metrics as sim_metrics
from kvtrace.telemetry import exposition

from support.require import require_vllm

loggers = require_vllm("vllm.v1.metrics.loggers")  # skipped without vLLM, failed under KVTRACE_REQUIRE_VLLM=1


def test_ttft_buckets_are_vllms():
    assert list(exposition.VLLM_TTFT_BUCKETS) == loggers.histogram_buckets("time_to_first_token")
    assert proxy_metrics.TTFT_BUCKETS is exposition.VLLM_TTFT_BUCKETS
    assert sim_metrics.TTFT_BUCKETS is exposition.VLLM_TTFT_BUCKETS


def test_proxy_latency_buckets_are_vllms_request_latency():
    assert list(proxy_metrics.LATENCY_BUCKETS) == loggers.histogram_buckets("request_latency")
