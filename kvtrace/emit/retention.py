"""D's retention spans, split from :mod:`kvtrace.emit.recorder` (the recorder's request life) so
each module stays one read: D pins a finished request's blocks for the next turn
(:meth:`~Retention.retention_started`, a ``kvtrace.kv.retention`` span under the request's engine
span) until the next P reads them, they expire or are released (:meth:`~Retention.retention_ended`).

:class:`Retention` is a mixin of :class:`~kvtrace.emit.recorder.KVRecorder` with no state of its
own: its methods are the recorder's (same hot-path rules: never raise, O(1), thread-safe) and use
the recorder's attributes, declared below.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtrace import semconv as sc
from kvtrace.emit.deferred import DeferredSpans, SpanHandle, SyncSpans
from kvtrace.emit.guard import never_raise
from kvtrace.emit.metrics import KVMetrics

if TYPE_CHECKING:
    from kvtrace.emit.recorder import _Request


@dataclass(slots=True)
class _Retention:
    span: SpanHandle
    blocks: int
    nbytes: int
    start_ns: int = 0


class Retention:
    """The retention methods of :class:`~kvtrace.emit.recorder.KVRecorder`."""

    # the recorder's, set in KVRecorder.__init__
    bytes_per_block: int
    ttl_s: float
    metrics: KVMetrics | None
    _spans: DeferredSpans | SyncSpans
    _clock: Callable[[], int]
    _engine: dict[str, str]
    _lock: threading.Lock
    _retained: dict[str, _Retention]

    if TYPE_CHECKING:  # the recorder's request lookup

        def _get(self, request_id: str) -> _Request | None: ...

    @never_raise()
    def retention_started(
        self,
        request_id: str,
        *,
        blocks: int,
        tokens: int,
        expiry_deadline: float | None = None,
    ) -> dict:
        """D pinned ``blocks`` of a finished request for the next turn (call right before
        :meth:`request_finished`, while the request is still known).  Returns the retention
        fields to merge into the kvtrace summary."""
        req = self._get(request_id)
        nbytes = int(blocks * self.bytes_per_block)
        attrs = {
            **(req.base if req else {sc.GEN_AI_REQUEST_ID: request_id, **self._engine}),
            sc.KV_RETENTION_BLOCKS: int(blocks),
            sc.KV_RETENTION_TOKENS: int(tokens),
            sc.KV_RETENTION_BYTES: nbytes,
            sc.KV_RETENTION_TTL_S: float(self.ttl_s),
        }
        if expiry_deadline is not None:
            attrs[sc.KV_EXPIRY_DEADLINE] = float(expiry_deadline)
        start_ns = self._clock()
        span = self._spans.start(sc.SPAN_KV_RETENTION, req.span if req else None, attrs, start_ns)
        with self._lock:
            old = self._retained.pop(request_id, None)
            self._retained[request_id] = _Retention(span, int(blocks), nbytes, start_ns)
        if self.metrics is not None:
            self.metrics.retention_started(int(blocks), nbytes)
        if old is not None:
            self._end_retention(old, sc.RETENTION_RELEASED)
        fields = {
            sc.KVT_RETAINED_BLOCKS: int(blocks),
            sc.KVT_RETAINED_BYTES: nbytes,
            sc.KVT_RETAINED_TTL_S: float(self.ttl_s),
        }
        if req is not None:
            req.summary.update(fields)
        return fields

    @never_raise(False)
    def retention_ended(self, request_id: str, outcome: str) -> bool:
        """D's pinned blocks were read (``read``), timed out (``expired``) or freed for another
        reason (``released``).  Returns False if nothing was retained under that id."""
        with self._lock:
            ret = self._retained.pop(request_id, None)
        if ret is None:
            return False
        self._end_retention(ret, outcome)
        return True

    def retained(self) -> dict[str, tuple[int, int]]:
        """request id -> (blocks, bytes) currently pinned."""
        with self._lock:
            return {k: (v.blocks, v.nbytes) for k, v in self._retained.items()}

    def _end_retention(self, ret: _Retention, outcome: str) -> None:
        end_ns = self._clock()
        self._spans.finish(ret.span, {sc.KV_RETENTION_OUTCOME: outcome}, None, end_ns)
        if self.metrics is not None:
            self.metrics.retention_ended(outcome, ret.blocks, ret.nbytes, (end_ns - ret.start_ns) / 1e9)
