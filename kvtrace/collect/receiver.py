"""What both OTLP receivers do with one export request, independent of the transport.

:func:`ingest` converts a decoded request, offers it to the :class:`~kvtrace.collect.queue.SpanQueue`
and says how to answer.  The gRPC and HTTP receivers only map :class:`Outcome` to their status
codes (OTLP spec, "OTLP/gRPC Throttling" and "OTLP/HTTP Throttling"):

=================  =========================  ==================================
outcome            gRPC                        HTTP
=================  =========================  ==================================
accepted           OK (+ partial_success)      200 (+ partial_success)
malformed          INVALID_ARGUMENT            400 + google.rpc.Status
too large          RESOURCE_EXHAUSTED (grpc)   413 + google.rpc.Status
unsupported        (n/a)                       415 + google.rpc.Status (Content-Encoding)
full / busy /      UNAVAILABLE + RetryInfo     503 + Retry-After + google.rpc.Status
closing /
unwritable /
disk full /
durable write
failed
=================  =========================  ==================================

With ``durable`` (``kvtrace collect --durable-ack``) :func:`ingest` returns the queue's future in
``Outcome.written``; the receiver answers "accepted" only once it resolves (the spans are in an
fsynced file) and "retry later" if it fails.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass

from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from kvtrace.collect.otlp_convert import MalformedPayload, request_to_table
from kvtrace.collect.queue import Refused, SpanQueue

log = logging.getLogger(__name__)

ACCEPTED, MALFORMED, RETRY = "accepted", "malformed", "retry"
TOO_LARGE, UNSUPPORTED, INTERNAL = "too_large", "unsupported", "internal"


@dataclass
class Outcome:
    kind: str
    message: str = ""
    response: ExportTraceServiceResponse | None = None
    retry_after_s: int = 1
    written: Future | None = None  # durable mode: resolved once the spans are fsynced


def ingest(queue: SpanQueue, request, *, retry_after_s: int = 1, durable: bool = False) -> Outcome:
    """Convert ``request`` (an ExportTraceServiceRequest) and queue it; never raises."""
    try:
        table, rejected, reason = request_to_table(request)
    except MalformedPayload as exc:
        return Outcome(MALFORMED, str(exc))
    except Exception as exc:  # a payload the converter cannot represent
        log.warning("kvtrace collect: rejecting export request: %s", exc, exc_info=True)
        return Outcome(MALFORMED, f"cannot convert spans: {exc}")
    queued = queue.offer(table, durable=durable)
    if isinstance(queued, Refused):
        return Outcome(RETRY, f"{queued.reason}; retry later", retry_after_s=max(retry_after_s, queued.retry_after_s))
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = reason
    return Outcome(ACCEPTED, response=response, written=queued if durable else None)


def write_failed(exc: BaseException) -> Outcome:
    """The answer to a durable request whose write failed: its spans are not stored; resend."""
    return Outcome(RETRY, f"writing the spans failed ({exc}); nothing was stored, retry later")


_CODES = {
    MALFORMED: code_pb2.INVALID_ARGUMENT,
    UNSUPPORTED: code_pb2.INVALID_ARGUMENT,
    TOO_LARGE: code_pb2.RESOURCE_EXHAUSTED,
    INTERNAL: code_pb2.INTERNAL,
}


def rpc_status(outcome: Outcome) -> status_pb2.Status:
    """The google.rpc.Status describing a refused request (HTTP bodies, gRPC status details)."""
    code = _CODES.get(outcome.kind, code_pb2.UNAVAILABLE)
    status = status_pb2.Status(code=code, message=outcome.message)
    if outcome.kind == RETRY:
        info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=outcome.retry_after_s))
        status.details.add().Pack(info)
    return status
