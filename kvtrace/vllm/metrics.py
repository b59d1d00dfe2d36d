"""The connector's metrics inside vLLM's own ``/metrics``, through the KV connector stats hook.

vLLM (0.32 and 0.33 alike) moves connector telemetry in three hops, and kvtrace rides along
exactly as NixlConnector's ``vllm:nixl_*`` (and 0.33's OffloadingConnector) do:

1. **Worker -> EngineCore.**  Each worker's ``get_kv_connector_stats()`` goes out in
   ``KVConnectorOutput.kv_connector_stats``; with several ranks ``KVOutputAggregator`` folds them
   with ``aggregate()``.  KVTraceNixlConnector wraps NIXL's worker stats in
   :class:`KVTraceConnectorStats` (same NIXL data, plus an empty kvtrace part) so every object
   that meets in an ``aggregate()`` is of this class.
2. **EngineCore, every step.**  After ``update_connector_output`` (where the probe ends spans)
   the scheduler calls the scheduler-side ``get_kv_connector_stats()`` and aggregates it into
   the workers' stats; the scheduler-side connector returns the recorder's
   :class:`~kvtrace.emit.metrics.KVMetrics` payload (deltas since the last step) under
   ``data[STATS_KEY]``, or None when nothing happened.  ``SchedulerStats.kv_connector_stats`` is
   then ``to_dict()`` of the result: plain lists and string-keyed dicts, msgpack-safe.
3. **API server.**  The Prometheus stat logger calls the class-level ``build_prom_metrics`` once
   (metric classes, ``["model_name", "engine"]`` and their values per engine index) and then
   ``observe(data, engine_idx)`` per stats update; :class:`KVTracePromMetrics` feeds NIXL's own
   ``vllm:nixl_*`` families (unchanged) and the ``vllm:kvtrace_*`` ones
   (:class:`~kvtrace.emit.metrics.KVPromMetrics`).  The logging stat logger rebuilds stats with
   ``build_kv_connector_stats`` and prints :meth:`KVTraceConnectorStats.reduce`.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats, NixlPromMetrics

from kvtrace import semconv as sc
from kvtrace.emit import metrics as km

NIXL_KEYS = tuple(NixlKVConnectorStats().data)  # the lists NixlKVConnectorStats carries


class KVTraceConnectorStats(NixlKVConnectorStats):
    """NIXL's stats lists plus kvtrace's payload under ``data[STATS_KEY]`` (None when empty).

    The scheduler's own object carries the payload alone (no empty NIXL lists to build every
    step); the lists NIXL's code reads are filled in where it reads them, in the API server
    (:meth:`reduce`, :meth:`KVTracePromMetrics.observe`)."""

    def reset(self) -> None:
        super().reset()
        self.data[sc.STATS_KEY] = None

    @classmethod
    def wrap(cls, stats: NixlKVConnectorStats | None, payload: dict | None = None) -> KVTraceConnectorStats | None:
        """NIXL worker stats and/or a kvtrace payload as one object (None if both are absent)."""
        if stats is None and payload is None:
            return None
        data = dict(stats.data) if stats is not None else {}
        data[sc.STATS_KEY] = payload
        return cls(data=data)

    def is_empty(self) -> bool:
        # NIXL's is_empty() with its lists possibly absent: no transfer, no failure of any kind
        return all(not v for k, v in self.data.items() if k != sc.STATS_KEY) and km.is_empty(
            self.data.get(sc.STATS_KEY)
        )

    def aggregate(self, other) -> KVTraceConnectorStats:
        if other.is_empty():
            return self
        for key, values in other.data.items():
            if key == sc.STATS_KEY:
                if values:
                    self.data[key] = km.merge(self.data.get(key) or km.empty_payload(), values)
            else:
                self.data.setdefault(key, []).extend(values)
        return self

    def reduce(self) -> dict[str, int | float]:
        for key in NIXL_KEYS:
            self.data.setdefault(key, [])
        out = dict(super().reduce())
        payload = self.data.get(sc.STATS_KEY) or {}
        for key, n in sorted((payload.get(km.DECISIONS) or {}).items()):
            out[f"kvtrace {key.replace(km.SEP, ' ')}"] = n
        if payload.get(km.RETAINED) is not None:
            out["kvtrace retained MiB"] = round(payload[km.RETAINED][1] / 2**20, 3)
        return out


def adopt_worker_stats(connector_output) -> None:
    """Make the workers' stats in ``connector_output`` a :class:`KVTraceConnectorStats` (in place).

    The scheduler aggregates its own stats *into* the workers' object after
    ``update_connector_output``; NIXL's ``aggregate`` cannot take kvtrace's part.  Workers of
    KVTraceNixlConnector already send this class; this covers stats built elsewhere (tests,
    mixed versions).  Never raises."""
    try:
        stats = connector_output.kv_connector_stats
        if stats is not None and not isinstance(stats, KVTraceConnectorStats):
            connector_output.kv_connector_stats = KVTraceConnectorStats.wrap(stats)
    except Exception:  # telemetry never changes what vLLM does
        pass


class KVTracePromMetrics(NixlPromMetrics):
    """``vllm:nixl_*`` (NixlConnector's families) and ``vllm:kvtrace_*``, same labels."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.kvtrace = km.KVPromMetrics(
            metric_types[Gauge], metric_types[Counter], metric_types[Histogram], labelnames, per_engine_labelvalues
        )

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        nixl = {key: transfer_stats_data.get(key) or () for key in NIXL_KEYS}
        super().observe(nixl, engine_idx)
        self.kvtrace.observe(transfer_stats_data.get(sc.STATS_KEY), engine_idx)
