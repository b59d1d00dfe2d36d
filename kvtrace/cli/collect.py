"""``kvtrace collect``: the command-line face of :class:`kvtrace.collect.server.Collector`."""

from __future__ import annotations

import argparse
import signal
import threading

from kvtrace import settings

DEFAULT_GRPC = "127.0.0.1:4317"
DEFAULT_HTTP = "127.0.0.1:4318"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--otlp-grpc",
        metavar="HOST:PORT",
        default=None,
        help=f"OTLP/gRPC listen address (e.g. {DEFAULT_GRPC}); 'off' to disable",
    )
    parser.add_argument(
        "--otlp-http",
        metavar="HOST:PORT",
        default=None,
        help=f"OTLP/HTTP listen address for POST /v1/traces (e.g. {DEFAULT_HTTP}); 'off' to disable",
    )
    parser.add_argument(
        "--traces", metavar="DIR", default=None, help="Parquet trace directory (default: $KVTRACE_TRACES_DIR)"
    )
    parser.add_argument(
        "--max-queue-spans",
        type=int,
        default=None,
        metavar="N",
        help="spans held in memory before senders are told to retry later (default 200000)",
    )
    parser.add_argument(
        "--max-queue-mib",
        type=int,
        default=None,
        metavar="MIB",
        help="MiB of converted spans held in memory before senders are told to retry later (default 256)",
    )
    parser.add_argument(
        "--max-request-mib",
        type=int,
        default=None,
        metavar="MIB",
        help="largest request body, after decompression; larger ones get 413 (gRPC RESOURCE_EXHAUSTED) (default 64)",
    )
    parser.add_argument(
        "--max-inflight-mib",
        type=int,
        default=None,
        metavar="MIB",
        help="MiB that all requests being received and converted may hold together; beyond it "
        "senders are told to retry later (default 256)",
    )
    parser.add_argument(
        "--batch-delay-ms",
        type=int,
        default=None,
        metavar="MS",
        help="how long the writer gathers requests into one file (default 200); not used with --durable-ack",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="S",
        help="at SIGINT/SIGTERM, how long to keep retrying writes that fail (full disk) before giving up on "
        "the acknowledged spans still queued (exit 1) (default 30)",
    )
    parser.add_argument(
        "--min-free-mib",
        type=int,
        default=None,
        metavar="MIB",
        help="MiB to leave free on the trace directory's disk: a request whose spans would not fit above it is "
        "told to retry later (default $KVTRACE_MIN_FREE_MIB, 64)",
    )
    parser.add_argument(
        "--durable-ack",
        action="store_true",
        help="answer a request only once its spans are in an fsynced file (see 'What a crash can lose' above)",
    )


def _addresses(args) -> tuple[str | None, str | None]:
    from kvtrace.collect.server import split_address
    from kvtrace.errors import CLIError

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


def _limits(args) -> dict:
    """Collector keyword arguments from the size/delay flags given (the rest keep their defaults)."""
    from kvtrace.errors import CLIError

    flags = [
        ("max_queue_spans", "max_queue_spans", 1, 1),
        ("max_queue_mib", "max_queue_bytes", 1, 1 << 20),
        ("max_request_mib", "max_request_bytes", 1, 1 << 20),
        ("max_inflight_mib", "max_inflight_bytes", 1, 1 << 20),
        ("batch_delay_ms", "batch_delay_s", 0, 1e-3),
        ("drain_timeout", "drain_timeout_s", 0, 1),
    ]
    out = {}
    for flag, kwarg, minimum, unit in flags:
        value = getattr(args, flag)
        if value is None:
            continue
        if value < minimum:
            raise CLIError(f"--{flag.replace('_', '-')} must be >= {minimum}")
        out[kwarg] = value * unit
    return out


def run(args) -> int:
    """Receive OTLP traces (gRPC and/or HTTP) into a Parquet trace directory.

    Accepts spans from anything that speaks OTLP: kvtrace's own processes, vLLM's
    --otlp-traces-endpoint (its llm_request spans), an OpenTelemetry Collector, other SDKs.
    Binds 127.0.0.1:4317 (gRPC) and 127.0.0.1:4318 (HTTP, POST /v1/traces, protobuf or JSON,
    optionally gzip) unless told otherwise.  When the in-memory queue or the in-flight byte
    budget is full, or the spans would not fit on the disk (below), senders get "retry later"
    (gRPC UNAVAILABLE with RetryInfo, HTTP 503 with Retry-After).  SIGINT/SIGTERM: stop
    accepting, write everything queued, exit 0.  GET /health (on the HTTP listener) answers
    JSON: status ok or unwritable, the write error, what is queued, counters (accepted,
    written, refused, refused while unwritable, refused for lack of disk space, lost) and the
    disk's free, reserved and kept-free bytes.

    What a crash can lose (SIGINT/SIGTERM lose nothing acknowledged):
      default: a request is acknowledged once its spans are queued in memory; the writer
        writes the queue every --batch-delay-ms.  A crash of the collector process (SIGKILL,
        OOM kill) loses the acknowledged spans not yet in a file: those of the last
        batch delay plus the write under way, at most --max-queue-spans / --max-queue-mib.
        Files already written survive a process crash; an OS crash or power loss can also
        lose files written in the last ~30 s (not fsynced).
      --durable-ack: a request is acknowledged only after the file holding its spans (and
        its directory entry) is fsynced, so no crash, of the process or of the machine,
        loses an acknowledged span.  A crash loses only unacknowledged requests, which the
        sender retries; a crash between the fsync and the answer makes the sender resend
        spans already stored (duplicates, never loss).  Costs one fsync per written file;
        requests arriving during a write share the next file.

    A full disk, in both modes: nothing acknowledged is lost, even if the disk stays full.
      A request is admitted only while its spans, as they will be written (the compression
      ratio seen so far), fit in the disk's free space (statvfs, re-read every
      $KVTRACE_DISK_REFRESH_MS and whenever it would refuse) less --min-free-mib, less what
      is admitted and not written yet; otherwise "retry later" (503 + Retry-After, gRPC
      UNAVAILABLE) before anything is acknowledged.  When space returns the next request is
      admitted.  /health counts these refusals (disk_refused_requests, disk_refused_spans).

    A write that fails all the same (another process filled the disk within one reading,
    an I/O error), in both modes: no failed write is ever acknowledged.
      From the first failed write until a write succeeds, every new request is answered
      "retry later" (503 + Retry-After, gRPC UNAVAILABLE), so senders keep their spans; the
      acknowledged spans already queued stay in memory (within --max-queue-spans and
      --max-queue-mib) and are retried with a back-off (0.25 s doubling to 5 s); when space
      returns the collector resumes by itself.  With --durable-ack the failed request is
      answered "retry later" and, after the back-off, one request at a time probes the disk.
      One log line when writes start failing and one when they succeed again; /health counts
      the refusals.  Not guaranteed in that case: if the disk is still full at SIGINT/SIGTERM
      after --drain-timeout, the acknowledged spans still queued are lost (counted, logged,
      exit 1); a crash while unwritable loses them as any crash does in the default mode.

    Example: kvtrace collect --otlp-grpc 127.0.0.1:4317 --otlp-http 127.0.0.1:4318 --traces ./traces
    """
    from kvtrace.collect.server import Collector
    from kvtrace.errors import CLIError

    traces = settings.TRACES_DIR.get(args.traces)
    if not traces:
        raise CLIError("no trace directory: give --traces DIR or set KVTRACE_TRACES_DIR")
    grpc_addr, http_addr = _addresses(args)
    try:
        min_free_mib = int(settings.MIN_FREE_MIB.get(args.min_free_mib))
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if min_free_mib < 0:
        raise CLIError("--min-free-mib must be >= 0")
    collector = Collector(
        traces,
        grpc_address=grpc_addr,
        http_address=http_addr,
        durable_ack=args.durable_ack,
        min_free_bytes=min_free_mib << 20,
        **_limits(args),
    )
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
        print(
            f"kvtrace collect: OTLP/HTTP on http://{http_addr.rpartition(':')[0]}:{collector.http_port}/v1/traces",
            flush=True,
        )
    print(f"kvtrace collect: writing {traces}", flush=True)
    stop.wait()
    collector.stop()
    st = collector.queue.stats
    print(
        f"kvtrace collect: stopped; {st.written_spans} spans written, {st.lost_spans} lost, "
        f"{st.unwritable_refused_spans} refused while unwritable, {st.disk_refused_spans} refused for lack of "
        "disk space",
        flush=True,
    )
    return 0 if st.lost_spans == 0 else 1
