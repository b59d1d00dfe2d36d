"""OTLP/gRPC trace receiver (``opentelemetry.proto.collector.trace.v1.TraceService/Export``).

Started by :class:`kvtrace.collect.server.Collector`.  Refusals carry the OTLP-specified codes:
INVALID_ARGUMENT for a request that cannot be converted, UNAVAILABLE with a ``RetryInfo`` detail
(``grpc-status-details-bin``) when the queue is full or the collector is shutting down.
"""

from __future__ import annotations

from concurrent import futures
from typing import NamedTuple

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from kvtrace.collect import otlp_convert
from kvtrace.collect.queue import SpanQueue
from kvtrace.collect.receiver import MALFORMED, Outcome, ingest, rpc_status

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class _Status(NamedTuple):  # a grpc.Status (what grpcio-status builds)
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple


SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class _TraceService:
    """``Export`` takes the raw request bytes, so an undecodable payload is answered
    INVALID_ARGUMENT (grpcio's own deserializer would answer INTERNAL)."""

    def __init__(self, queue: SpanQueue) -> None:
        self.queue = queue

    def export(self, body: bytes, context):
        try:
            outcome = ingest(self.queue, otlp_convert.parse_protobuf(body))
        except otlp_convert.MalformedPayload as exc:
            outcome = Outcome(MALFORMED, str(exc))
        if outcome.response is not None:
            return outcome.response
        code = grpc.StatusCode.INVALID_ARGUMENT if outcome.kind == MALFORMED else grpc.StatusCode.UNAVAILABLE
        details = rpc_status(outcome).SerializeToString()
        context.abort_with_status(
            _Status(code, outcome.message, (("grpc-status-details-bin", details),))
        )


def start(queue: SpanQueue, address: str, *, workers: int = 4) -> tuple[grpc.Server, int]:
    """Bind ``address`` (``host:port``; port 0 = any) and start serving; returns (server, port)."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvtrace-collect-grpc"),
        options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)],
    )
    handler = grpc.unary_unary_rpc_method_handler(
        _TraceService(queue).export,
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
