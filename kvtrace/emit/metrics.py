"""The KV spans, counted: what :class:`~kvtrace.emit.recorder.KVRecorder` records, as Prometheus
families, identical for the real connector and the simulator.

Two halves, joined by a plain, serialisable *payload* dict:

- :class:`KVMetrics` lives next to the recorder.  The recorder calls it where it ends a
  decision, transfer or retention span, with the values it puts on that span, so every counter
  equals a count (or sum) over spans by construction.  It only adds to dicts under a lock;
  :meth:`KVMetrics.drain` hands over what changed since the last drain as a payload (or None).
- :class:`KVPromMetrics` owns the ``vllm:kvtrace_*`` families and applies payloads to them
  (:meth:`KVPromMetrics.observe`).  It takes the metric classes (prometheus_client's, or the
  ones vLLM passes to a connector's ``build_prom_metrics``) and vLLM's per-engine label names and
  values, so the series look like vLLM's own.

In vLLM the payload rides inside the connector's ``KVConnectorStats`` from EngineCore to the API
server (:mod:`kvtrace.vllm.metrics`); the simulator drains it when its ``/metrics`` is scraped
(:mod:`kvtrace.sim.metrics`).  :func:`merge` combines payloads (vLLM aggregates stats across
workers and steps): counters add, histogram samples concatenate, the retained gauge keeps the
later snapshot.

Payload (string keys only, so it survives vLLM's msgpack IPC)::

    {"decisions": {"d2p|pulled": 3, ...},            # direction|outcome -> count
     "prompt_tokens": {"d2p|pulled": 143, ...},      # direction|source -> tokens
     "transfers": {"d2p|ok": [[seconds, bytes], ...]},  # direction|status -> samples
     "retention_ends": {"read": 2, ...},             # outcome -> count
     "retained_byte_seconds": 1.5e9,                 # added since the last drain
     "retained": [blocks, bytes]}                    # held now (absolute)
"""

from __future__ import annotations

import logging
import threading

from kvtrace import semconv as sc

log = logging.getLogger(__name__)
DECISIONS, TOKENS, TRANSFERS, ENDS, BYTE_SECONDS, RETAINED = (
    "decisions",
    "prompt_tokens",
    "transfers",
    "retention_ends",
    "retained_byte_seconds",
    "retained",
)
SEP = "|"
# transfer duration buckets, s: NIXL's (vllm:nixl_xfer_time_seconds) plus sub-ms and long loads
TRANSFER_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


def empty_payload() -> dict:
    return {DECISIONS: {}, TOKENS: {}, TRANSFERS: {}, ENDS: {}, BYTE_SECONDS: 0.0, RETAINED: None}


def is_empty(payload: dict | None) -> bool:
    if not payload:
        return True
    return not (
        payload.get(DECISIONS)
        or payload.get(TOKENS)
        or payload.get(TRANSFERS)
        or payload.get(ENDS)
        or payload.get(BYTE_SECONDS)
        or payload.get(RETAINED) is not None
    )


def merge(into: dict, other: dict | None) -> dict:
    """Add ``other`` (a later payload) into ``into``; returns ``into``."""
    if not other:
        return into
    for key in (DECISIONS, TOKENS, ENDS):
        acc = into.setdefault(key, {})
        for k, v in (other.get(key) or {}).items():
            acc[k] = acc.get(k, 0) + v
    acc = into.setdefault(TRANSFERS, {})
    for k, samples in (other.get(TRANSFERS) or {}).items():
        acc.setdefault(k, []).extend(samples)
    into[BYTE_SECONDS] = into.get(BYTE_SECONDS, 0.0) + (other.get(BYTE_SECONDS) or 0.0)
    if other.get(RETAINED) is not None:
        into[RETAINED] = list(other[RETAINED])
    return into


_TOKEN_KEYS: dict[str, tuple[str, str, str]] = {}


def _token_keys(direction: str) -> tuple[str, str, str]:
    local, pulled, recomputed = (direction + SEP + source for source in sc.TOKEN_SOURCES)
    keys = (local, pulled, recomputed)
    _TOKEN_KEYS[direction] = keys
    return keys


class KVMetrics:
    """Deltas of one engine's KV counters since the last :meth:`drain` (thread-safe, O(1) per call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._payload = empty_payload()
        self._blocks = 0
        self._bytes = 0
        self._dirty = False

    def decision(self, direction: str, outcome: str, local: int, pulled: int, recomputed: int) -> None:
        """A decision span ended with these attribute values."""
        keys = _TOKEN_KEYS.get(direction) or _token_keys(direction)
        key = direction + SEP + outcome
        with self._lock:
            p = self._payload
            d = p[DECISIONS]
            d[key] = d.get(key, 0) + 1
            t = p[TOKENS]
            if local:
                t[keys[0]] = t.get(keys[0], 0) + local
            if pulled:
                t[keys[1]] = t.get(keys[1], 0) + pulled
            if recomputed:
                t[keys[2]] = t.get(keys[2], 0) + recomputed
            self._dirty = True

    def transfer(self, direction: str, status: str, nbytes: int, seconds: float) -> None:
        """A transfer span ended (its duration, its bytes, its status)."""
        key = direction + SEP + status
        with self._lock:
            self._payload[TRANSFERS].setdefault(key, []).append([seconds, nbytes])
            self._dirty = True

    def retention_started(self, blocks: int, nbytes: int) -> None:
        with self._lock:
            self._blocks += blocks
            self._bytes += nbytes
            self._payload[RETAINED] = [self._blocks, self._bytes]
            self._dirty = True

    def retention_ended(self, outcome: str, blocks: int, nbytes: int, seconds: float) -> None:
        """A retention span ended after ``seconds`` holding ``blocks`` / ``nbytes``."""
        p = self._payload
        with self._lock:
            self._blocks -= blocks
            self._bytes -= nbytes
            p[RETAINED] = [self._blocks, self._bytes]
            p[ENDS][outcome] = p[ENDS].get(outcome, 0) + 1
            p[BYTE_SECONDS] += nbytes * seconds
            self._dirty = True

    def drain(self) -> dict | None:
        """The payload of everything since the last drain, or None if nothing happened."""
        if not self._dirty:  # one attribute read per scheduler step when idle
            return None
        with self._lock:
            payload, self._payload, self._dirty = self._payload, empty_payload(), False
        return payload


class KVPromMetrics:
    """The ``vllm:kvtrace_*`` families for one process, one child per engine index and label set.

    ``labelnames`` / ``per_engine_labelvalues`` are vLLM's per-engine labels (``model_name``,
    ``engine``) and their values per engine index.  Every child of the enumerated label values
    exists from the start (at 0), so a rate() or a dashboard panel has a series before the
    first event.
    """

    def __init__(
        self, gauge, counter, histogram, labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]
    ) -> None:
        names = list(labelnames)
        engines = {i: [str(v) for v in values] for i, values in per_engine_labelvalues.items()}

        def family(cls, name: str, labels: tuple, values: list[tuple], **kw):
            metric = cls(name=name, documentation=sc.METRICS[name]["doc"], labelnames=names + list(labels), **kw)
            return {(i, SEP.join(v)): metric.labels(*ev, *v) for i, ev in engines.items() for v in values}

        dirs = [(d,) for d in sc.DIRECTIONS]
        self.decisions = family(
            counter,
            sc.METRIC_KV_DECISIONS,
            (sc.LABEL_DIRECTION, sc.LABEL_OUTCOME),
            [(d, o) for d in sc.DIRECTIONS for o in sc.OUTCOMES],
        )
        self.tokens = family(
            counter,
            sc.METRIC_KV_PROMPT_TOKENS,
            (sc.LABEL_DIRECTION, sc.LABEL_SOURCE),
            [(d, s) for d in sc.DIRECTIONS for s in sc.TOKEN_SOURCES],
        )
        self.bytes = family(counter, sc.METRIC_KV_TRANSFER_BYTES, (sc.LABEL_DIRECTION,), dirs)
        self.duration = family(
            histogram,
            sc.METRIC_KV_TRANSFER_DURATION,
            (sc.LABEL_DIRECTION, sc.LABEL_STATUS),
            [(d, s) for d in sc.DIRECTIONS for s in sc.TRANSFER_STATUSES],
            buckets=list(TRANSFER_BUCKETS),
        )
        self.blocks = family(gauge, sc.METRIC_KV_RETAINED_BLOCKS, (), [()], multiprocess_mode="mostrecent")
        self.retained = family(gauge, sc.METRIC_KV_RETAINED_BYTES, (), [()], multiprocess_mode="mostrecent")
        self.ends = family(
            counter, sc.METRIC_KV_RETENTION_ENDS, (sc.LABEL_OUTCOME,), [(o,) for o in sc.RETENTION_OUTCOMES]
        )
        self.byte_seconds = family(counter, sc.METRIC_KV_RETAINED_BYTE_SECONDS, (), [()])
        self._logged = False

    def observe(self, payload: dict | None, engine_idx: int = 0) -> None:
        """Apply one payload (deltas) of engine ``engine_idx``.  Never raises (it runs in vLLM's
        stat logger): a malformed payload is logged once and skipped."""
        if not payload:
            return
        try:
            self._observe(payload, engine_idx)
        except Exception:
            if not self._logged:
                self._logged = True
                log.exception("kvtrace: could not apply a metrics payload; metrics continue without it")

    def _observe(self, payload: dict, engine_idx: int) -> None:
        for children, key in ((self.decisions, DECISIONS), (self.tokens, TOKENS), (self.ends, ENDS)):
            for k, n in (payload.get(key) or {}).items():
                child = children.get((engine_idx, k))
                if child is not None and n:
                    child.inc(n)
        for k, samples in (payload.get(TRANSFERS) or {}).items():
            hist = self.duration.get((engine_idx, k))
            if hist is None:
                continue
            for seconds, _ in samples:
                hist.observe(seconds)
            if k.endswith(SEP + sc.TRANSFER_OK):
                moved = sum(nbytes for _, nbytes in samples)
                if moved:
                    self.bytes[(engine_idx, k.split(SEP, 1)[0])].inc(moved)
        if payload.get(BYTE_SECONDS):
            self.byte_seconds[(engine_idx, "")].inc(payload[BYTE_SECONDS])
        if payload.get(RETAINED) is not None:
            blocks, nbytes = payload[RETAINED]
            self.blocks[(engine_idx, "")].set(blocks)
            self.retained[(engine_idx, "")].set(nbytes)
