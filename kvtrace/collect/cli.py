"""``kvtrace collect``: the command-line face of :class:`kvtrace.collect.server.Collector`."""

from __future__ import annotations

import argparse
import signal
import threading

from kvtrace import settings

DEFAULT_GRPC = "127.0.0.1:4317"
DEFAULT_HTTP = "127.0.0.1:4318"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--otlp-grpc", metavar="HOST:PORT", default=None,
                        help=f"OTLP/gRPC listen address (e.g. {DEFAULT_GRPC}); 'off' to disable")
    parser.add_argument("--otlp-http", metavar="HOST:PORT", default=None,
                        help=f"OTLP/HTTP listen address for POST /v1/traces (e.g. {DEFAULT_HTTP}); 'off' to disable")
    parser.add_argument("--traces", metavar="DIR", default=None,
                        help="Parquet trace directory (default: $KVTRACE_TRACES_DIR)")
    parser.add_argument("--max-queue-spans", type=int, default=None, metavar="N",
                        help="spans held in memory before senders are told to retry later (default 200000)")


def _addresses(args) -> tuple[str | None, str | None]:
    from kvtrace.errors import CLIError
    from kvtrace.collect.server import split_address

    grpc_addr, http_addr = args.otlp_grpc, args.otlp_http
    if grpc_addr is None and http_addr is None:
        grpc_addr, http_addr = DEFAULT_GRPC, DEFAULT_HTTP
    grpc_addr = None if grpc_addr in (None, "off") else grpc_addr
    http_addr = None if http_addr in (None, "off") else http_addr
    if not grpc_addr and not http_addr:
        raise CLIError("nothing to listen on: give --otlp-grpc and/or --otlp-http")
    for addr in (grpc_addr, http_addr):
        if addr:
            try:
                split_address(addr)
            except ValueError as exc:
                raise CLIError(str(exc)) from None
    return grpc_addr, http_addr


def run(args) -> int:
    """Receive OTLP traces (gRPC and/or HTTP) into a Parquet trace directory.

    Accepts spans from anything that speaks OTLP: kvtrace's own processes, vLLM's
    --otlp-traces-endpoint (its llm_request spans), an OpenTelemetry Collector, other SDKs.
    Binds 127.0.0.1:4317 (gRPC) and 127.0.0.1:4318 (HTTP, POST /v1/traces, protobuf or JSON)
    unless told otherwise.  When the in-memory queue is full senders get "retry later"
    (gRPC UNAVAILABLE with RetryInfo, HTTP 503 with Retry-After).  SIGINT/SIGTERM: stop
    accepting, write everything queued, exit 0.

    Example: kvtrace collect --otlp-grpc 127.0.0.1:4317 --otlp-http 127.0.0.1:4318 --traces ./traces
    """
    from kvtrace.errors import CLIError
    from kvtrace.collect.server import DEFAULT_MAX_QUEUE_SPANS, Collector

    traces = settings.TRACES_DIR.get(args.traces)
    if not traces:
        raise CLIError("no trace directory: give --traces DIR or set KVTRACE_TRACES_DIR")
    max_spans = args.max_queue_spans if args.max_queue_spans is not None else DEFAULT_MAX_QUEUE_SPANS
    if max_spans < 1:
        raise CLIError("--max-queue-spans must be >= 1")
    grpc_addr, http_addr = _addresses(args)
    collector = Collector(traces, grpc_address=grpc_addr, http_address=http_addr, max_queue_spans=max_spans)
    try:
        collector.start()
    except (OSError, ValueError) as exc:
        raise CLIError(str(exc).splitlines()[0]) from None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if collector.grpc_port:
        print(f"kvtrace collect: OTLP/gRPC on {grpc_addr.rpartition(':')[0]}:{collector.grpc_port}", flush=True)
    if collector.http_port:
        print(f"kvtrace collect: OTLP/HTTP on http://{http_addr.rpartition(':')[0]}:{collector.http_port}/v1/traces",
              flush=True)
    print(f"kvtrace collect: writing {traces}", flush=True)
    stop.wait()
    collector.stop()
    st = collector.queue.stats
    print(f"kvtrace collect: stopped; {st.written_spans} spans written, {st.lost_spans} lost", flush=True)
    return 0 if st.lost_spans == 0 else 1
