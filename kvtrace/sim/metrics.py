"""``GET /metrics`` of one simulated worker, shaped like a real vLLM server's.

Each :class:`~kvtrace.sim.worker.SimWorker` has its own registry, as each vLLM server has its
own ``/metrics``: Prometheus scrapes every worker as a target and the Prometheus ``instance``
label tells them apart, exactly as for a real cluster.  Labels are vLLM's per-engine
``model_name`` (the served model name) and ``engine`` (``"0"``).

- ``vllm:kvtrace_*``: the connector's families, by the same code
  (:class:`~kvtrace.emit.metrics.KVPromMetrics`) from the same payload: the engine's
  :class:`~kvtrace.emit.recorder.KVRecorder` counts into a
  :class:`~kvtrace.emit.metrics.KVMetrics`, drained when ``/metrics`` is scraped (vLLM drains it
  every scheduler step; the totals are the same).
- vLLM's own families that a dashboard puts beside them, with vLLM's names and buckets:
  ``vllm:time_to_first_token_seconds`` (arrival to first token on this worker) and NixlConnector's
  ``vllm:nixl_xfer_time_seconds`` / ``vllm:nixl_bytes_transferred`` (per successful load) /
  ``vllm:nixl_num_failed_transfers`` / ``vllm:nixl_num_kv_expired_reqs`` (from the same transfers).
- ``kvtrace_dropped_spans`` of the process (:func:`kvtrace.telemetry.dropped_spans`).

Served by :func:`kvtrace.telemetry.exposition.render`: OpenMetrics text to Prometheus, classic text
otherwise.
"""

from __future__ import annotations

from functools import partial

from kvtrace import semconv as sc
from kvtrace.emit import metrics as km
from kvtrace.telemetry import exposition

# vLLM 0.32/0.33 buckets (vllm/v1/metrics/loggers.py, .../nixl/stats.py)
TTFT_BUCKETS = exposition.VLLM_TTFT_BUCKETS
NIXL_XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))


class WorkerMetrics:
    """Registry and families of one simulated worker; ``kv`` is its recorder's KVMetrics."""

    def __init__(self, model_name: str, kv: km.KVMetrics) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.source = kv
        self.registry = CollectorRegistry()
        gauge, counter, histogram = (partial(cls, registry=self.registry) for cls in (Gauge, Counter, Histogram))
        labelnames = [sc.LABEL_MODEL_NAME, sc.LABEL_ENGINE]
        values = [model_name, "0"]
        self.kv = km.KVPromMetrics(gauge, counter, histogram, labelnames, {0: values})

        def make(cls, name: str, **kw):
            return cls(name=name, documentation=sc.METRICS[name]["doc"], labelnames=labelnames, **kw).labels(*values)

        self.ttft = make(histogram, sc.VLLM_METRIC_TTFT, buckets=list(TTFT_BUCKETS))
        self.nixl_xfer = make(histogram, sc.VLLM_METRIC_NIXL_XFER_TIME, buckets=list(NIXL_XFER_BUCKETS))
        self.nixl_bytes = make(histogram, sc.VLLM_METRIC_NIXL_BYTES, buckets=list(NIXL_BYTES_BUCKETS))
        self.nixl_failed = make(counter, sc.VLLM_METRIC_NIXL_FAILED)
        self.nixl_expired = make(counter, sc.VLLM_METRIC_NIXL_EXPIRED)
        exposition.register_dropped_spans(self.registry)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def collect(self) -> None:
        """Apply what the recorder counted since the last call."""
        payload = self.source.drain()
        if payload is None:
            return
        self.kv.observe(payload)
        for key, samples in payload[km.TRANSFERS].items():
            status = key.rsplit(km.SEP, 1)[1]
            if status == sc.TRANSFER_OK:
                for seconds, nbytes in samples:
                    self.nixl_xfer.observe(seconds)
                    self.nixl_bytes.observe(nbytes)
            elif status == sc.TRANSFER_EXPIRED:
                self.nixl_expired.inc(len(samples))
            else:
                self.nixl_failed.inc(len(samples))

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """(body, content type) for a scrape with this ``Accept`` header."""
        self.collect()
        return exposition.render(self.registry, accept)
