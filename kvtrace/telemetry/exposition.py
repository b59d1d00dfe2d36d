"""Prometheus exposition shared by ``kvtrace proxy`` and ``kvtrace sim`` workers (``GET /metrics``).

:func:`render` serves a prometheus_client registry as OpenMetrics text to a scraper that asks
for it (Prometheus does, in its ``Accept`` header) and as the classic text format otherwise.
It does not use prometheus_client's ``choose_encoder`` for OpenMetrics: with the default
``escaping=underscores`` current prometheus_client (0.22 to at least 0.26) writes ``vllm:x`` in
``# TYPE`` but ``vllm_x`` on the samples (prometheus/client_python#1177), so Prometheus stores
the vLLM-style names of the simulator without their colon.  Every kvtrace name is valid in the
legacy character set, so writing them unescaped is what a fixed client writes.

:func:`register_dropped_spans` adds ``kvtrace_dropped_spans_total{reason}`` (spans this process
lost, :func:`kvtrace.telemetry.dropped_spans`) to a registry, read at scrape time.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace import telemetry

OPENMETRICS = "application/openmetrics-text"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: vLLM 0.32/0.33's time-to-first-token histogram buckets, s (vllm/v1/metrics/loggers.py): the
#: simulated workers' and the proxy's TTFT histograms compare with a real vLLM's
VLLM_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)


def render(registry, accept: str | None) -> tuple[bytes, str]:
    """(body, content type) of ``registry`` for a scrape with this ``Accept`` header."""
    from prometheus_client import exposition
    from prometheus_client.openmetrics import exposition as openmetrics

    wanted = [part.split(";")[0].strip() for part in (accept or "").split(",")]
    if OPENMETRICS in wanted:
        unescaped = getattr(openmetrics, "ALLOWUTF8", None)  # prometheus_client < 0.22 has no escaping
        kwargs = {"escaping": unescaped} if unescaped else {}
        return openmetrics.generate_latest(registry, **kwargs), OPENMETRICS_CONTENT_TYPE
    return exposition.generate_latest(registry), TEXT_CONTENT_TYPE


def register_dropped_spans(registry) -> None:
    """Expose :func:`kvtrace.telemetry.dropped_spans` as ``kvtrace_dropped_spans_total{reason}``
    (every reason present, 0 included)."""
    from prometheus_client.core import CounterMetricFamily

    class _DroppedSpans:
        def collect(self):
            family = CounterMetricFamily(
                sc.METRIC_DROPPED_SPANS, sc.METRICS[sc.METRIC_DROPPED_SPANS]["doc"], labels=[sc.LABEL_REASON]
            )
            counts = telemetry.dropped_spans()
            for reason in sc.DROP_REASONS:
                family.add_metric([reason], counts.get(reason, 0))
            yield family

    registry.register(_DroppedSpans())
