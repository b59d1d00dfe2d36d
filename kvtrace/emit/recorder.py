"""Connector-side span recording, shared by the real vLLM connector and the simulator.

:class:`KVRecorder` turns the facts a KV connector sees (a request arrives, the scheduler decides
to pull or recompute, a load starts and finishes, D pins blocks after a turn, the blocks are read
or expire) into the ``kvtrace.engine.*`` / ``kvtrace.kv.*`` spans of :mod:`kvtrace.semconv`.
It imports nothing from vLLM, so the simulator emits byte-for-byte the same spans as the
instrumented NixlConnector and the analysis cannot tell them apart except by resource.

Every public method is safe to call from vLLM's hot paths: it never raises (errors are logged
once per kind) and does O(1) work.  One recorder per engine process; thread-safe.

Spans reach the SDK through :mod:`kvtrace.emit.deferred`: synchronously by default (the
simulator, whose tests read spans right after each call), or with ``deferred=True`` (the vLLM
connector) from a background thread, so a scheduler hook pays for a few dicts and a queue put
instead of SDK span starts/ends.  Both modes take every timestamp here, on the caller's thread,
and make the same spans; request ids, summaries and trace ids are known immediately in both.

D's retention spans (``retention_started`` / ``retention_ended`` / ``retained``) are methods of
:class:`~kvtrace.emit.retention.Retention`, which the recorder inherits.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from kvtrace import semconv as sc
from kvtrace.emit.deferred import DeferredSpans, SpanHandle, SyncSpans
from kvtrace.emit.guard import never_raise, parent_span_context
from kvtrace.emit.metrics import KVMetrics
from kvtrace.emit.retention import Retention, _Retention
from kvtrace.telemetry import fastspans

log = logging.getLogger(__name__)
_OUTCOME_BY_STATUS = {
    sc.TRANSFER_OK: sc.OUTCOME_PULLED,
    sc.TRANSFER_EXPIRED: sc.OUTCOME_EXPIRED,
    sc.TRANSFER_FAILED: sc.OUTCOME_FAILED,
}


@dataclass(slots=True)
class _Request:
    """A request's open spans, as handles of the recorder's span applier."""

    request_id: str
    role: str
    span: SpanHandle
    base: dict  # identity + engine attributes: what every span of the request carries
    summary: dict = field(default_factory=dict)
    decision: SpanHandle = None  # None until started, as is transfer
    transfer: SpanHandle = None
    transfer_start_ns: int = 0
    direction: str = ""  # of the decision (metrics): set with ``decision``
    transfer_direction: str = ""  # set with ``transfer``
    transfer_bytes: int = 0
    verified: str | None = None  # kvtrace.kv.verified of the decision (metrics)
    wrong_tokens: int = 0
    queued: dict | None = None  # kvtrace.engine.queue.* of a request that waited for KV blocks


class KVRecorder(Retention):
    """Records one engine's KV spans.

    ``bytes_per_block`` is the KV-cache page size summed over layers (what one block of one
    request costs in memory and on the wire); ``block_size`` is tokens per block.
    ``deferred=True`` applies spans on a background thread (SDK tracers only; other tracers,
    e.g. a no-op provider's, stay synchronous): call :meth:`flush` before reading them.
    ``metrics``: a :class:`~kvtrace.emit.metrics.KVMetrics` that counts every decision, transfer
    and retention span as it ends, with the span's own values (None: no metrics).
    ``fast_spans``: spans through :func:`kvtrace.telemetry.fastspans.tracer` (the same spans, less
    CPU; one thread only: the simulator's workers).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None,
        *,
        engine_id: str,
        role: str,
        block_size: int,
        bytes_per_block: int,
        threshold: int,
        ttl_s: float,
        load_failure_policy: str = "fail",
        deferred: bool = False,
        metrics: KVMetrics | None = None,
        fast_spans: bool = False,
    ) -> None:
        self.engine_id = engine_id
        self.role = role
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        self.threshold = threshold
        self.ttl_s = ttl_s
        self.load_failure_policy = load_failure_policy
        self.metrics = metrics
        provider = tracer_provider or trace.get_tracer_provider()
        # fast_spans (the simulator's, one loop thread): kvtrace.telemetry.fastspans where it reproduces the provider
        tracer = fastspans.tracer(provider, "kvtrace.vllm") if fast_spans else provider.get_tracer("kvtrace.vllm")
        self._spans = DeferredSpans(tracer) if deferred and DeferredSpans.supports(tracer) else SyncSpans(tracer)
        self._clock = time.time_ns
        self._engine = {sc.ENGINE_ID: engine_id, sc.ENGINE_ROLE: role}
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._retained: dict[str, _Retention] = {}

    @property
    def deferred(self) -> bool:
        """True when spans are applied on a background thread (see :meth:`flush`)."""
        return self._spans.deferred

    # ------------------------------------------------------------------ request life
    @never_raise()
    def request_started(
        self,
        request_id: str,
        *,
        phase: str,
        prompt_tokens: int,
        kv_params: dict | None = None,
        headers: dict | None = None,
        public_id: str | None = None,
    ) -> None:
        """A request reached this engine's scheduler (first call for it). ``phase`` is
        ``prefill`` (P leg), ``decode`` (D leg) or ``both`` (not disaggregated).
        ``public_id`` is the id recorded as gen_ai.request.id / the summary's request_id when
        it differs from the key (vLLM keys requests by an internal id derived from the
        X-Request-Id); every other method takes the key."""
        if request_id in self._requests:
            return
        entry = (kv_params or {}).get(sc.KV_PARAMS_KEY) or {}
        identity: dict[str, object] = {sc.GEN_AI_REQUEST_ID: public_id or request_id}
        session = entry.get(sc.CTX_SESSION_ID) if isinstance(entry, dict) else None
        turn = entry.get(sc.CTX_TURN) if isinstance(entry, dict) else None
        if session is not None:
            identity[sc.SESSION_ID] = str(session)
            identity[sc.GEN_AI_CONVERSATION_ID] = str(session)
        if isinstance(turn, int):
            identity[sc.TURN_INDEX] = turn
        name = sc.SPAN_ENGINE_DECODE if phase == sc.ROLE_DECODE else sc.SPAN_ENGINE_PREFILL
        base = {**identity, **self._engine}
        parent = parent_span_context(kv_params, headers)
        attrs = {**base, sc.KV_PROMPT_TOKENS: int(prompt_tokens)}
        span = self._spans.start(name, parent, attrs, self._clock(), SpanKind.INTERNAL)
        req = _Request(request_id, phase, span, base)
        req.summary = {
            sc.KVT_TRACE_ID: format(self._spans.trace_id(span), "032x"),
            sc.KVT_REQUEST_ID: public_id or request_id,
            sc.KVT_SESSION_ID: identity.get(sc.SESSION_ID),
            sc.KVT_TURN: identity.get(sc.TURN_INDEX),
            sc.KVT_ENGINE_ID: self.engine_id,
            sc.KVT_ROLE: phase,
            sc.KVT_PROMPT_TOKENS: int(prompt_tokens),
        }
        with self._lock:
            self._requests[request_id] = req

    @never_raise()
    def decision(
        self,
        request_id: str,
        *,
        direction: str,
        outcome: str | None,
        prompt_tokens: int,
        local_hit_tokens: int,
        remote_tokens: int = 0,
        pulled_tokens: int = 0,
        recomputed_tokens: int | None = None,
        threshold: int | None = None,
        expiry_deadline: float | None = None,
        expiry_remaining_s: float | None = None,
        peer_engine_id: str | None = None,
        remote_request_id: str | None = None,
        verification: dict | None = None,
    ) -> None:
        """The scheduler decided.  ``outcome=None`` means a pull was scheduled and its outcome
        (pulled / expired / failed) is settled by :meth:`transfer_finished`.  ``verification``:
        the ``kvtrace.kv.verified`` / ``kvtrace.kv.verify.*`` attributes of a checked offer."""
        req = self._get(request_id)
        if req is None or req.decision is not None:
            return
        if recomputed_tokens is None:
            recomputed_tokens = max(0, prompt_tokens - local_hit_tokens - pulled_tokens)
        attrs = {
            **req.base,
            sc.KV_DIRECTION: direction,
            sc.KV_PROMPT_TOKENS: int(prompt_tokens),
            sc.KV_LOCAL_HIT_TOKENS: int(local_hit_tokens),
            sc.KV_REMOTE_TOKENS: int(remote_tokens),
            sc.KV_PULLED_TOKENS: int(pulled_tokens),
            sc.KV_RECOMPUTED_TOKENS: int(recomputed_tokens),
            sc.KV_THRESHOLD: int(self.threshold if threshold is None else threshold),
            sc.KV_LOAD_FAILURE_POLICY: self.load_failure_policy,
        }
        if expiry_deadline is not None:
            attrs[sc.KV_EXPIRY_DEADLINE] = expiry_deadline
        if expiry_remaining_s is not None:
            attrs[sc.KV_EXPIRY_REMAINING_S] = expiry_remaining_s
        if peer_engine_id is not None:
            attrs[sc.KV_PEER_ENGINE_ID] = peer_engine_id
        if remote_request_id is not None:
            attrs[sc.KV_REMOTE_REQUEST_ID] = remote_request_id
        if verification:
            attrs.update(verification)
            req.verified = verification.get(sc.KV_VERIFIED)
            req.wrong_tokens = int(verification.get(sc.KV_VERIFY_WRONG_TOKENS) or 0)
            req.summary[sc.KVT_VERIFIED] = req.verified
        req.decision = self._spans.start(sc.SPAN_KV_DECISION, req.span, attrs, self._clock())
        req.direction = direction
        summary = req.summary
        summary[sc.KVT_LOCAL_HIT_TOKENS] = attrs[sc.KV_LOCAL_HIT_TOKENS]
        summary[sc.KVT_REMOTE_TOKENS] = attrs[sc.KV_REMOTE_TOKENS]
        summary[sc.KVT_PULLED_TOKENS] = attrs[sc.KV_PULLED_TOKENS]
        summary[sc.KVT_RECOMPUTED_TOKENS] = attrs[sc.KV_RECOMPUTED_TOKENS]
        summary[sc.KVT_PEER_ENGINE_ID] = peer_engine_id
        if outcome is not None:
            self._end_decision(req, outcome)

    @never_raise()
    def transfer_started(
        self,
        request_id: str,
        *,
        direction: str,
        tokens: int,
        blocks: int,
        peer_engine_id: str | None = None,
        remote_request_id: str | None = None,
        nbytes: int | None = None,
    ) -> None:
        """An asynchronous load was scheduled (update_state_after_alloc)."""
        req = self._get(request_id)
        if req is None or req.transfer is not None:
            return
        nbytes = int(blocks * self.bytes_per_block if nbytes is None else nbytes)
        attrs = {
            **req.base,
            sc.KV_DIRECTION: direction,
            sc.KV_TRANSFER_TOKENS: int(tokens),
            sc.KV_TRANSFER_BLOCKS: int(blocks),
            sc.KV_TRANSFER_BYTES: nbytes,
        }
        if peer_engine_id is not None:
            attrs[sc.KV_PEER_ENGINE_ID] = peer_engine_id
        if remote_request_id is not None:
            attrs[sc.KV_REMOTE_REQUEST_ID] = remote_request_id
        req.transfer_start_ns = self._clock()
        req.transfer = self._spans.start(sc.SPAN_KV_TRANSFER, req.decision or req.span, attrs, req.transfer_start_ns)
        req.transfer_direction, req.transfer_bytes = direction, nbytes
        req.summary[sc.KVT_BYTES] = nbytes

    @never_raise()
    def transfer_finished(
        self,
        request_id: str,
        *,
        status: str = sc.TRANSFER_OK,
        xfer_ms: float | None = None,
        post_ms: float | None = None,
        error_type: str | None = None,
    ) -> None:
        """The load finished (or failed / was declined as expired)."""
        req = self._get(request_id)
        if req is None:
            return
        span = req.transfer
        if span is not None:
            req.transfer = None
            attrs: dict[str, object] = {sc.KV_TRANSFER_STATUS: status}
            if xfer_ms is not None:
                attrs[sc.KV_TRANSFER_XFER_MS] = float(xfer_ms)
            if post_ms is not None:
                attrs[sc.KV_TRANSFER_POST_MS] = float(post_ms)
            if status != sc.TRANSFER_OK:
                attrs[sc.ERROR_TYPE] = error_type or status
            end_ns = self._clock()
            self._spans.finish(span, attrs, None if status == sc.TRANSFER_OK else status, end_ns)
            req.summary[sc.KVT_TRANSFER_MS] = round((end_ns - req.transfer_start_ns) / 1e6, 3)
            self._count_transfer(req, status, end_ns)
        if req.decision is not None:
            attrs = {}
            if status != sc.TRANSFER_OK:
                pulled = 0
                recomputed = req.summary.get(sc.KVT_PROMPT_TOKENS, 0) - req.summary.get(sc.KVT_LOCAL_HIT_TOKENS, 0)
                attrs = {sc.KV_PULLED_TOKENS: pulled, sc.KV_RECOMPUTED_TOKENS: recomputed}
                req.summary.update(
                    {sc.KVT_PULLED_TOKENS: pulled, sc.KVT_RECOMPUTED_TOKENS: recomputed, sc.KVT_BYTES: 0}
                )
                if error_type:
                    attrs[sc.ERROR_TYPE] = error_type
            self._end_decision(req, _OUTCOME_BY_STATUS.get(status, sc.OUTCOME_FAILED), attrs)

    @never_raise(dict)
    def request_finished(
        self,
        request_id: str,
        *,
        output_tokens: int | None = None,
        cached_tokens: int | None = None,
        error_type: str | None = None,
    ) -> dict:
        """The request left the engine.  Returns the ``kvtrace`` object for kv_transfer_params."""
        with self._lock:
            req = self._requests.pop(request_id, None)
        if req is None:
            return {}
        now = self._clock()
        if req.transfer is not None:  # never finished: the request was aborted mid-load
            span, req.transfer = req.transfer, None
            self._spans.finish(span, {sc.KV_TRANSFER_STATUS: sc.TRANSFER_FAILED}, "aborted", now)
            self._count_transfer(req, sc.TRANSFER_FAILED, now)
        if req.decision is not None and sc.KVT_DECISION not in req.summary:
            self._end_decision(req, sc.OUTCOME_FAILED, end_ns=now)
        attrs: dict[str, object] = {}
        if output_tokens is not None:
            attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = int(output_tokens)
        if cached_tokens is not None:
            attrs[sc.REQUEST_CACHED_TOKENS] = int(cached_tokens)
        if error_type:
            attrs[sc.ERROR_TYPE] = error_type
        if req.queued:
            attrs.update(req.queued)
        self._spans.finish(req.span, attrs, error_type or None, now)
        return dict(req.summary)

    @never_raise()
    def queued(self, request_id: str, attributes: dict) -> None:
        """The request waited for KV blocks before the scheduler could take it: the
        ``kvtrace.engine.queue.*`` attributes, put on its engine span when it ends."""
        req = self._get(request_id)
        if req is not None:
            req.queued = dict(attributes)

    @never_raise()
    def nixl_stats(self, request_id: str, attributes: dict) -> None:
        """Attach worker NIXL telemetry that could not be attributed to one transfer (an
        ``kvtrace.nixl.stats`` event with ``kvtrace.nixl.*`` attributes) to the request's
        engine span."""
        req = self._get(request_id)
        if req is not None:
            self._spans.event(req.span, sc.EVENT_NIXL_STATS, dict(attributes), self._clock())

    @never_raise()
    def shutdown(self, timeout: float | None = 10.0) -> None:
        """End every open span (engine shutting down): retention ends ``released``.  In
        deferred mode, then wait up to ``timeout`` s for the spans to be applied and stop the
        applier thread (spans of later calls are dropped)."""
        with self._lock:
            retained, self._retained = self._retained, {}
            requests, self._requests = self._requests, {}
        for ret in retained.values():
            self._end_retention(ret, sc.RETENTION_RELEASED)
        now = self._clock()
        for req in requests.values():
            for span in (req.transfer, req.decision, req.span):
                if span is not None:
                    self._spans.abort(span, "engine shutdown", now)
        self._spans.close(timeout)

    @never_raise(False)
    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every span operation so far reached the SDK (deferred mode; immediate in
        sync mode).  False if ``timeout`` s passed first."""
        return self._spans.flush(timeout)

    # ------------------------------------------------------------------ helpers
    def summary(self, request_id: str) -> dict:
        req = self._get(request_id)
        return dict(req.summary) if req else {}

    def _get(self, request_id: str) -> _Request | None:
        return self._requests.get(request_id)  # one dict read: atomic, no lock needed

    def _end_decision(self, req: _Request, outcome: str, attrs: dict | None = None, end_ns: int | None = None) -> None:
        attrs = {**(attrs or {}), sc.KV_OUTCOME: outcome}
        error = outcome if outcome == sc.OUTCOME_FAILED else None
        self._spans.finish(req.decision, attrs, error, self._clock() if end_ns is None else end_ns)
        summary = req.summary
        summary[sc.KVT_DECISION] = outcome
        if self.metrics is not None:  # the span's final token attributes, mirrored in the summary
            self.metrics.decision(
                req.direction,
                outcome,
                summary[sc.KVT_LOCAL_HIT_TOKENS],
                summary[sc.KVT_PULLED_TOKENS],
                summary[sc.KVT_RECOMPUTED_TOKENS],
                req.verified,
                req.wrong_tokens,
            )

    def _count_transfer(self, req: _Request, status: str, end_ns: int) -> None:
        if self.metrics is not None:
            self.metrics.transfer(
                req.transfer_direction, status, req.transfer_bytes, (end_ns - req.transfer_start_ns) / 1e9
            )
