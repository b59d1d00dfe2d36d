"""``GET /metrics`` of the kvtrace proxy (prometheus_client registry, one per proxy).

Per request, once, when its SERVER span ends (:meth:`ProxyMetrics.request_finished`, called by
:class:`~kvtrace.proxy.spans.RequestTrace`): ``kvtrace_proxy_requests_total{status,
offer_reason}``, and the TTFT / latency histograms by P's decision outcome, from the values that
span records (so the counters equal counts of ``kvtrace.proxy.request`` spans); when its session
is checked, ``kvtrace_proxy_session_continuity_total{continuity}``; when D's final params are not
kept, ``kvtrace_proxy_decode_params_rejected_total{field}``.  Children are
cached per label set: a request costs a dict lookup and a counter increment or two, no
per-chunk work.  The conversation table is read at scrape time (sizes, evictions), like
``/health``, and so are the workers' connection gates (:class:`~kvtrace.proxy.upstream.Gate`: in
use, queued, refused, and the histogram of waits they keep), by role, and whether each worker is in
the routing (``kvtrace_proxy_upstream_up{role,endpoint}``);
``kvtrace_dropped_spans_total`` comes from :mod:`kvtrace.telemetry`.
"""

from __future__ import annotations

import itertools

from kvtrace import semconv as sc
from kvtrace.telemetry import exposition

# vLLM's buckets, so the proxy's TTFT compares with vLLM's
TTFT_BUCKETS = exposition.VLLM_TTFT_BUCKETS
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_OUTCOMES = frozenset(sc.OUTCOMES)


class ProxyMetrics:
    """The proxy's families; ``table`` is its :class:`~kvtrace.proxy.table.ConversationTable`, ``pool``
    its :class:`~kvtrace.proxy.upstream.Pool`."""

    def __init__(self, table, pool=None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        doc = lambda name: sc.METRICS[name]["doc"]  # noqa: E731
        self._requests = Counter(
            sc.METRIC_PROXY_REQUESTS,
            doc(sc.METRIC_PROXY_REQUESTS),
            [sc.LABEL_STATUS, sc.LABEL_OFFER_REASON],
            registry=self.registry,
        )
        self._continuity = Counter(
            sc.METRIC_PROXY_CONTINUITY, doc(sc.METRIC_PROXY_CONTINUITY), [sc.LABEL_CONTINUITY], registry=self.registry
        )
        self._rejected = Counter(
            sc.METRIC_PROXY_DECODE_PARAMS_REJECTED,
            doc(sc.METRIC_PROXY_DECODE_PARAMS_REJECTED),
            [sc.LABEL_FIELD],
            registry=self.registry,
        )
        self._ttft = Histogram(
            sc.METRIC_PROXY_TTFT,
            doc(sc.METRIC_PROXY_TTFT),
            [sc.LABEL_OUTCOME],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self._latency = Histogram(
            sc.METRIC_PROXY_LATENCY,
            doc(sc.METRIC_PROXY_LATENCY),
            [sc.LABEL_OUTCOME],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._children: dict[tuple, object] = {}
        for value in sc.CONTINUITIES:
            self._child(self._continuity, value)
        for outcome in (*sc.OUTCOMES, sc.OUTCOME_UNKNOWN):  # every series exists from the start
            self._child(self._ttft, outcome)
            self._child(self._latency, outcome)
        self.registry.register(_TableCollector(table))
        if pool is not None:
            self.registry.register(_PoolCollector(pool))
        exposition.register_dropped_spans(self.registry)

    def _child(self, family, *labels: str):
        key = (id(family), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child

    def request_finished(
        self, status: int, offer_reason: str | None, outcome: str | None, ttft_ms: float | None, latency_ms: float
    ) -> None:
        """One request answered (its span's status, offer reason, P's outcome, TTFT, latency)."""
        self._child(self._requests, str(status), offer_reason or "").inc()
        label = outcome if outcome in _OUTCOMES else sc.OUTCOME_UNKNOWN
        if ttft_ms is not None:
            self._child(self._ttft, label).observe(ttft_ms / 1000.0)
        if status == 200:
            self._child(self._latency, label).observe(latency_ms / 1000.0)

    def continuity(self, value: str) -> None:
        """A turn checked against its session's record (``sc.CONTINUITY_*``)."""
        self._child(self._continuity, value).inc()

    def decode_params_rejected(self, field: str) -> None:
        """D's final params were not kept (``field``: the key at fault)."""
        self._child(self._rejected, field).inc()

    def render(self, accept: str | None) -> tuple[bytes, str]:
        return exposition.render(self.registry, accept)


class _TableCollector:
    """Conversation-table sizes and evictions, read when scraped."""

    def __init__(self, table, pool=None) -> None:
        self.table = table

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        health = self.table.health()  # what /health reports (drops a few stale entries, O(1))
        yield GaugeMetricFamily(
            sc.METRIC_PROXY_CONVERSATIONS,
            sc.METRICS[sc.METRIC_PROXY_CONVERSATIONS]["doc"],
            value=health["conversations"],
        )
        yield GaugeMetricFamily(
            sc.METRIC_PROXY_CONVERSATIONS_OFFERABLE,
            sc.METRICS[sc.METRIC_PROXY_CONVERSATIONS_OFFERABLE]["doc"],
            value=health["cached_conversations"],
        )
        evictions = CounterMetricFamily(
            sc.METRIC_PROXY_EVICTIONS, sc.METRICS[sc.METRIC_PROXY_EVICTIONS]["doc"], labels=[sc.LABEL_REASON]
        )
        evictions.add_metric([sc.EVICTION_LRU], health["evicted_lru"])
        evictions.add_metric([sc.EVICTION_STALE], health["evicted_stale"])
        yield evictions


class _PoolCollector:
    """The P and D workers' connection gates, summed per role, read when scraped."""

    def __init__(self, pool) -> None:
        self.pool = pool

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        from kvtrace.proxy.upstream import WAIT_BUCKETS, loop_time

        doc = lambda name: sc.METRICS[name]["doc"]  # noqa: E731
        label = [sc.LABEL_ROLE]
        in_use = GaugeMetricFamily(sc.METRIC_PROXY_POOL_IN_USE, doc(sc.METRIC_PROXY_POOL_IN_USE), labels=label)
        queued = GaugeMetricFamily(sc.METRIC_PROXY_POOL_QUEUED, doc(sc.METRIC_PROXY_POOL_QUEUED), labels=label)
        rejected = CounterMetricFamily(sc.METRIC_PROXY_POOL_REJECTED, doc(sc.METRIC_PROXY_POOL_REJECTED), labels=label)
        waits = HistogramMetricFamily(sc.METRIC_PROXY_POOL_WAIT, doc(sc.METRIC_PROXY_POOL_WAIT), labels=label)
        down = GaugeMetricFamily(sc.METRIC_PROXY_WORKERS_DOWN, doc(sc.METRIC_PROXY_WORKERS_DOWN), labels=label)
        ejected = CounterMetricFamily(sc.METRIC_PROXY_EJECTIONS, doc(sc.METRIC_PROXY_EJECTIONS), labels=label)
        up = GaugeMetricFamily(
            sc.METRIC_PROXY_WORKER_UP, doc(sc.METRIC_PROXY_WORKER_UP), labels=[sc.LABEL_ROLE, sc.LABEL_ENDPOINT]
        )
        now = loop_time()
        for role in (sc.ROLE_PREFILL, sc.ROLE_DECODE):
            clients = self.pool.clients(role)
            ups = [c.health.up(now) for c in clients]
            down.add_metric([role], ups.count(False))
            for c, is_up in zip(clients, ups, strict=True):
                up.add_metric([role, c.base], 1 if is_up else 0)
            ejected.add_metric([role], sum(c.health.ejections for c in clients))
            gates = self.pool.gates(role)
            in_use.add_metric([role], sum(g.in_use for g in gates))
            queued.add_metric([role], sum(g.queued for g in gates))
            rejected.add_metric([role], sum(g.rejected for g in gates))
            counts = [sum(g.wait_counts[i] for g in gates) for i in range(len(WAIT_BUCKETS))]
            total = sum(counts) + sum(g.wait_over for g in gates)
            cumulative = list(itertools.accumulate(counts))
            buckets = [(_le(b), n) for b, n in zip(WAIT_BUCKETS, cumulative, strict=True)] + [("+Inf", total)]
            waits.add_metric([role], buckets, sum_value=sum(g.wait_sum for g in gates))
        yield from (in_use, queued, rejected, waits, down, ejected, up)


def _le(bound: float) -> str:
    return repr(float(bound))
