"""OTLP/gRPC trace receiver (``opentelemetry.proto.collector.trace.v1.TraceService/Export``).

Started by :class:`kvtrace.collect.server.Collector`.  Refusals carry the OTLP-specified codes:
INVALID_ARGUMENT for a request that cannot be converted, UNAVAILABLE with a ``RetryInfo`` detail
(``grpc-status-details-bin``) when the queue is full, the in-flight byte budget is spent, a
durable write failed or the collector is shutting down.  Memory: gRPC itself receives and
(``grpc-encoding: gzip``) inflates a message, refusing one over ``max_message_bytes`` after
inflation with RESOURCE_EXHAUSTED; at most ``max_concurrent`` RPCs are in progress (the excess
is refused with RESOURCE_EXHAUSTED, which OTLP exporters retry); a received message then takes
its size from the shared :class:`~kvtrace.collect.limits.ByteBudget` until its spans are queued.
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import NamedTuple

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from kvtrace.collect import otlp_convert
from kvtrace.collect.limits import ByteBudget, Hold, RequestRefused
from kvtrace.collect.queue import SpanQueue
from kvtrace.collect.receiver import (
    ACCEPTED,
    INTERNAL,
    MALFORMED,
    RETRY,
    TOO_LARGE,
    Outcome,
    ingest,
    rpc_status,
    write_failed,
)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_CODES = {
    MALFORMED: grpc.StatusCode.INVALID_ARGUMENT,
    RETRY: grpc.StatusCode.UNAVAILABLE,
    TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    INTERNAL: grpc.StatusCode.INTERNAL,
}


class _Status(NamedTuple):  # a grpc.Status (what grpcio-status builds)
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple


log = logging.getLogger(__name__)

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class _TraceService:
    """``Export`` takes the raw request bytes, so an undecodable payload is answered
    INVALID_ARGUMENT (grpcio's own deserializer would answer INTERNAL)."""

    def __init__(self, queue: SpanQueue, budget: ByteBudget, durable: bool) -> None:
        self.queue, self.budget, self.durable = queue, budget, durable

    def _receive(self, body: bytes) -> Outcome:
        with Hold(self.budget) as hold:
            hold.grow(len(body))
            outcome = ingest(self.queue, otlp_convert.parse_protobuf(body), durable=self.durable)
        if outcome.written is not None:
            try:
                outcome.written.result()
            except Exception as exc:
                return write_failed(exc)
        return outcome

    def export(self, body: bytes, context):
        try:
            outcome = self._receive(body)
        except RequestRefused as exc:
            outcome = Outcome(exc.kind, str(exc))
        except otlp_convert.MalformedPayload as exc:
            outcome = Outcome(MALFORMED, str(exc))
        except Exception as exc:  # a bug, not the sender's fault
            log.exception("kvtrace collect: internal error in OTLP/gRPC Export")
            outcome = Outcome(INTERNAL, f"internal error: {type(exc).__name__}")
        if outcome.kind == ACCEPTED:
            return outcome.response
        details = rpc_status(outcome).SerializeToString()
        context.abort_with_status(
            _Status(_CODES[outcome.kind], outcome.message, (("grpc-status-details-bin", details),))
        )


def start(
    queue: SpanQueue,
    address: str,
    *,
    workers: int = 4,
    max_concurrent: int = 8,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    budget: ByteBudget | None = None,
    durable: bool = False,
) -> tuple[grpc.Server, int]:
    """Bind ``address`` (``host:port``; port 0 = any) and start serving; returns (server, port)."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvtrace-collect-grpc"),
        options=[("grpc.max_receive_message_length", max_message_bytes), ("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=max_concurrent,
    )
    handler = grpc.unary_unary_rpc_method_handler(
        _TraceService(queue, budget or ByteBudget(4 * max_message_bytes), durable).export,
        request_deserializer=None,
        response_serializer=ExportTraceServiceResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address} (gRPC): {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {address} (gRPC): address in use or invalid")
    server.start()
    return server, port
