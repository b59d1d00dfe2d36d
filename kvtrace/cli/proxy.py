"""``kvtrace proxy``: the traced stateful P/D proxy (command module for :mod:`kvtrace.cli`)."""

from __future__ import annotations

import argparse

from kvtrace import settings
from kvtrace.proxy.config import DECODER_KV_BLOCKS_TTL_S, LOOPS, PREFILL_FAILURE_MODES, TTL_MARGIN_S
from kvtrace.routing import POLICIES

# hardening limits: flag, ProxyConfig field, type, metavar, the KVTRACE_* setting that is its default
_LIMITS = (
    ("--request-timeout", "request_timeout_s", float, "S", settings.PROXY_REQUEST_TIMEOUT),
    ("--max-upstream-bytes", "max_upstream_bytes", int, "N", settings.PROXY_MAX_UPSTREAM_BYTES),
    ("--client-header-timeout", "client_header_timeout_s", float, "S", settings.PROXY_CLIENT_HEADER_TIMEOUT),
    ("--client-body-timeout", "client_body_timeout_s", float, "S", settings.PROXY_CLIENT_BODY_TIMEOUT),
    ("--max-table-bytes", "max_table_bytes", int, "N", settings.PROXY_MAX_TABLE_BYTES),
    ("--max-id-bytes", "max_id_bytes", int, "N", settings.PROXY_MAX_ID_BYTES),
    ("--decoder-kv-ttl", "decoder_kv_ttl_s", float, "S", settings.PROXY_DECODER_KV_TTL),
    ("--max-chain-bytes", "max_chain_bytes", int, "N", settings.PROXY_MAX_CHAIN_BYTES),
    ("--max-worker-connections", "max_worker_connections", int, "N", settings.PROXY_MAX_WORKER_CONNECTIONS),
    ("--max-worker-queue", "max_worker_queue", int, "N", settings.PROXY_MAX_WORKER_QUEUE),
    ("--worker-cooldown", "worker_cooldown_s", float, "S", settings.PROXY_WORKER_COOLDOWN),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--traces", metavar="DIR", help="Parquet trace directory (else KVTRACE_TRACES_DIR)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument(
        "--prefiller-host",
        "--prefiller-hosts",
        dest="prefiller_hosts",
        nargs="+",
        default=["localhost"],
        metavar="HOST",
        help="prefill (P) workers' hosts, one per worker or one for all (default localhost)",
    )
    p.add_argument(
        "--prefiller-port",
        "--prefiller-ports",
        dest="prefiller_ports",
        type=int,
        nargs="+",
        default=[8100],
        metavar="PORT",
        help="prefill workers' ports, paired with the hosts (default 8100)",
    )
    p.add_argument(
        "--decoder-host",
        "--decoder-hosts",
        dest="decoder_hosts",
        nargs="+",
        default=["localhost"],
        metavar="HOST",
        help="decode (D) workers' hosts, one per worker or one for all (default localhost)",
    )
    p.add_argument(
        "--decoder-port",
        "--decoder-ports",
        dest="decoder_ports",
        type=int,
        nargs="+",
        default=[8200],
        metavar="PORT",
        help="decode workers' ports, paired with the hosts (default 8200)",
    )
    p.add_argument(
        "--conversation-ttl",
        type=float,
        default=DECODER_KV_BLOCKS_TTL_S - TTL_MARGIN_S,
        metavar="S",
        help=(
            "offer D's blocks only if cached less than S seconds ago (decoder_kv_blocks_ttl minus a margin; "
            "default %(default)s)"
        ),
    )
    p.add_argument("--max-conversations", type=int, default=100_000, help="conversation table size (LRU)")
    p.add_argument(
        "--routing",
        choices=POLICIES,
        default=None,
        help="which P and D serve a turn when there are several: round-robin, least-loaded (fewest in flight), "
        "session-affine (D = the one holding the session's KV), kv-aware (session-affine, and P = the one that "
        f"prefilled the session's last turn unless busier) (default {settings.PROXY_ROUTING.default}; env "
        f"{settings.PROXY_ROUTING.env})",
    )
    p.add_argument(
        "--prefill-failure",
        choices=PREFILL_FAILURE_MODES,
        default=PREFILL_FAILURE_MODES[0],
        help="P unreachable or 5xx: answer 502 (error) or let D prefill locally (decode_only)",
    )
    p.add_argument("--no-patch", action="store_true", help="do not add kv_transfer / x-kvtrace-trace-id to responses")
    p.add_argument(
        "--no-prefix-match",
        action="store_true",
        help="chat requests without a session id stay session-less, and no turn is checked for "
        f"continuity (else {settings.PROXY_PREFIX_MATCH.env}, default on)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=32 * 1024 * 1024,
        metavar="N",
        help="largest client request body accepted; larger ones get 413 (default 32 MiB)",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds one connection attempt to a worker may take (a wait for a free one does not count; default 10)",
    )
    p.add_argument("--read-timeout", type=float, default=600.0, metavar="S", help="max silence on a worker connection")
    p.add_argument(
        "--export-delay-ms",
        type=int,
        default=None,
        metavar="MS",
        help="how long ended spans wait in memory before they go to the Parquet writer: about what a "
        f"SIGKILL loses (see below) (default {settings.BATCH_DELAY_MS.default}; env {settings.BATCH_DELAY_MS.env})",
    )
    p.add_argument(
        "--loop",
        choices=LOOPS,
        default=None,
        help=(
            f"event loop (default {settings.PROXY_LOOP.default}: uvloop when installed; env {settings.PROXY_LOOP.env})"
        ),
    )
    for flag, dest, kind, metavar, setting in _LIMITS:
        doc = setting.doc.split("): ", 1)[1]
        default = "unset" if setting.default is None else setting.default
        p.add_argument(
            flag,
            dest=dest,
            type=kind,
            metavar=metavar,
            default=None,
            help=f"{doc} Default {default}; env {setting.env}.",
        )


def build_config(args: argparse.Namespace):
    """ProxyConfig from parsed flags; CLIError on bad values."""
    from kvtrace.errors import CLIError
    from kvtrace.proxy.config import ProxyConfig

    try:
        return ProxyConfig(
            prefill=ProxyConfig.workers(args.prefiller_hosts, args.prefiller_ports, "prefiller"),
            decode=ProxyConfig.workers(args.decoder_hosts, args.decoder_ports, "decoder"),
            host=args.host,
            port=args.port,
            conversation_ttl_s=args.conversation_ttl,
            max_conversations=args.max_conversations,
            prefill_failure=args.prefill_failure,
            connect_timeout_s=args.connect_timeout,
            read_timeout_s=args.read_timeout,
            max_body_bytes=args.max_body_bytes,
            **{dest: getattr(args, dest) for _, dest, *_ in _LIMITS if getattr(args, dest) is not None},
            **({"patch_responses": False} if args.no_patch else {}),
            **({"routing": args.routing} if args.routing else {}),
            **({"prefix_match": False} if args.no_prefix_match else {}),
        )
    except ValueError as exc:  # also a KVTRACE_PROXY_* setting that is not a number
        raise CLIError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Run the traced stateful P/D proxy (drop-in for vLLM's disagg_proxy_multiturn.py).

    Routes: POST /v1/completions, POST /v1/chat/completions, GET /health, GET /v1/models, and
    GET /metrics (Prometheus; KVTRACE_METRICS=0 turns it off).
    Conversation key: body `conversation_id`, else the X-Session-ID header, else W3C baggage
    `session.id`, else the OpenAI `prompt_cache_key` (at most --max-id-bytes); else, for chat
    requests, the session whose served messages (and the reply the proxy streamed) the request
    extends, or a new one the proxy names (prefix matching; --no-prefix-match turns it off).  Each
    chat turn is checked against the session's last served turn: a turn whose messages diverged
    (e.g. the client dropped the reasoning) is not offered D's blocks.  Responses carry a
    `kv_transfer` object (streaming: on the final chunk) and an x-kvtrace-trace-id header unless
    --no-patch (or KVTRACE_PATCH_RESPONSES=0).
    When P fails to read the blocks offered from D (expired), P is asked again without them.
    With several workers of a role (--routing), a leg whose worker cannot be reached goes on to
    another, and that worker gets no turns for --worker-cooldown (GET /health: *_workers_down).

    What the proxy's spans survive: SIGINT/SIGTERM flush every span of every answered request.
    A SIGKILL (or OOM kill) loses the spans still waiting in memory: those of the requests that
    ended in the last --export-delay-ms (1 s by default; at most 8192 spans, the span queue,
    4 x KVTRACE_BATCH_SIZE); what was already handed to the writer process is still written.  There is no
    durable-ack mode: a request's spans end after its last byte has gone to the client, so making
    them durable first would add a write (and an fsync) to every response.  A full trace disk
    never fails a request: the spans that cannot be written are dropped, counted as
    kvtrace_dropped_spans{reason="write_failed"} (/metrics, and dropped_spans on /health),
    logged once when writes start failing and once when they work again.
    """
    from kvtrace import telemetry
    from kvtrace.errors import CLIError
    from kvtrace.proxy import runtime

    config = build_config(args)
    factory = runtime.loop_factory(args.loop)
    try:
        telemetry.check_traces_dir(args.traces)
    except OSError as exc:  # NotWritable: one line naming the directory and the reason
        raise CLIError(str(exc)) from None
    if args.export_delay_ms is not None and args.export_delay_ms < 1:
        raise CLIError("--export-delay-ms must be >= 1")
    provider = telemetry.configure(
        "kvtrace-proxy",
        traces_dir=args.traces,
        writer_process=runtime.writer_process(),
        batch_delay_ms=args.export_delay_ms,
    )

    try:
        runtime.serve_forever(
            config, provider, factory, lambda url: print(f"kvtrace proxy listening on {url}", flush=True)
        )
    except OSError as exc:
        raise CLIError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    finally:
        telemetry.shutdown_all()
    return 0


def _say_listening(url: str) -> None:
    print(f"kvtrace proxy listening on {url}", flush=True)
