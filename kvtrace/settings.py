"""Every ``KVTRACE_*`` environment variable, with its default, in one place.

Explicit arguments (CLI flags, ``configure(...)`` keywords, ``kv_connector_extra_config``)
always beat the environment.  Standard ``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ...) are read by the OpenTelemetry SDK itself, as it always does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    env: str
    default: object
    doc: str
    kind: type = str

    # Any: the value is a ``kind`` (or the default, or the caller's override), which one table of
    # mixed settings cannot express to a type checker; callers convert or pass it on
    def get(self, override: object = None) -> Any:
        """``override`` if given, else the environment, else the default, as ``kind``."""
        if override is not None:
            return override
        raw = os.environ.get(self.env)
        if raw is None or raw == "":
            return self.default
        if self.kind is bool:
            return raw.strip().lower() in ("1", "true", "yes", "on")
        try:
            return self.kind(raw)
        except ValueError as exc:
            raise ValueError(f"{self.env}={raw!r} is not a valid {self.kind.__name__}") from exc


TRACES_DIR = Setting("KVTRACE_TRACES_DIR", None, "Parquet trace directory; unset = no Parquet export.")
SERVICE_NAME = Setting(
    "KVTRACE_SERVICE_NAME", None, "service.name override (else OTEL_SERVICE_NAME, else the component's name)."
)
OTLP = Setting("KVTRACE_OTLP", "auto", "OTLP export: auto (on when OTEL_EXPORTER_OTLP_*ENDPOINT is set), on, off.")
CAPTURE_CONTENT = Setting("KVTRACE_CAPTURE_CONTENT", False, "Record prompt/completion text in spans (opt-in).", bool)
ROLL_BYTES = Setting(
    "KVTRACE_ROLL_BYTES", 64 * 1024 * 1024, "Parquet segment is rolled when its batch files reach this many bytes.", int
)
ROLL_SECONDS = Setting("KVTRACE_ROLL_SECONDS", 60.0, "Parquet segment is rolled when it is this old, s.", float)
ROLL_GRACE_SECONDS = Setting(
    "KVTRACE_ROLL_GRACE_SECONDS",
    5.0,
    (
        "Batch files a roll merged into a segment are deleted this long after it (readers holding an older listing "
        "finish; a plain glob may count them twice meanwhile), s; at shutdown at once."
    ),
    float,
)
SCAN_INDEX_MIN_BYTES = Setting(
    "KVTRACE_SCAN_INDEX_MIN_BYTES",
    1024 * 1024,
    (
        "Trace files of at least this many bytes get a per-file index of the breakdown's scan "
        "(kvtrace.store.scan_index), built by `kvtrace.store.connect` (not read-only), `kvtrace compact` "
        "and `kvtrace dashboard` at start; "
        "-1: none is built (existing ones are still read)."
    ),
    int,
)
SCAN_INDEX_SECONDS = Setting(
    "KVTRACE_SCAN_INDEX_SECONDS",
    60.0,
    "While `kvtrace dashboard` serves, it builds the scan indexes of trace files written since every this many "
    "seconds (the pages read them after a Refresh); 0: only at start.",
    float,
)
BATCH_DELAY_MS = Setting("KVTRACE_BATCH_DELAY_MS", 1000, "BatchSpanProcessor schedule delay, ms.", int)
BATCH_SIZE = Setting(
    "KVTRACE_BATCH_SIZE",
    2048,
    (
        "BatchSpanProcessor max_export_batch_size (queue = 4x); bigger batches export faster but hold the GIL longer "
        "per export (in-process export)."
    ),
    int,
)
WRITER_PROCESS = Setting(
    "KVTRACE_WRITER_PROCESS",
    None,
    (
        "Parquet export converts and writes spans in a writer process fed through a pipe, so the exporting process "
        "never holds the GIL for it: 1 = everywhere, 0 = nowhere (conversion and writes in the exporting process's own "
        "export thread); unset = on in `kvtrace proxy` only (measured there: benchmarks/proxy), off elsewhere (vLLM "
        "connector, simulator, bench, demo)."
    ),
    bool,
)
WRITER_TIMEOUT_S = Setting(
    "KVTRACE_WRITER_TIMEOUT_S",
    30.0,
    (
        "A Parquet writer process that takes longer to accept or write a batch is killed and restarted (that batch "
        "counts as dropped); also its limit to finish at shutdown, s."
    ),
    float,
)
MIN_FREE_MIB = Setting(
    "KVTRACE_MIN_FREE_MIB",
    64,
    (
        "MiB the Parquet writers leave free on the trace directory's disk: kvtrace collect answers retry later "
        "(503) to spans that would not fit above it, the exporters drop them (counted as write_failed)."
    ),
    int,
)
DISK_REFRESH_MS = Setting(
    "KVTRACE_DISK_REFRESH_MS",
    500,
    (
        "How often the writers read the trace disk's free space again (statvfs), ms; writes in between are "
        "counted against the last reading."
    ),
    int,
)
METRICS = Setting(
    "KVTRACE_METRICS",
    True,
    (
        "Prometheus metrics: the connector's vllm:kvtrace_* families in vLLM's /metrics, /metrics on kvtrace proxy and "
        "sim workers (0 = off)."
    ),
    bool,
)
PROMETHEUS_BIN = Setting(
    "KVTRACE_PROMETHEUS_BIN",
    None,
    "Tests: the Prometheus server binary for the metrics tests (else `prometheus` on PATH).",
)
DISABLE = Setting(
    "KVTRACE_DISABLE", False, "Turn all kvtrace telemetry off (the connector still forwards to vLLM).", bool
)
PROXY_LOOP = Setting(
    "KVTRACE_PROXY_LOOP",
    "auto",
    "Proxy event loop: uvloop, asyncio, or auto (uvloop when installed: pip install 'kvtrace[proxy-fast]').",
)
PROXY_FASTSPANS = Setting(
    "KVTRACE_PROXY_FASTSPANS",
    True,
    (
        "Proxy spans made by kvtrace.telemetry.fastspans (the SDK's ReadableSpans, handed to the SDK's span "
        "processors, without the SDK tracer's per-span machinery) where the provider allows it; 0 = the SDK's own "
        "tracer."
    ),
    bool,
)
PATCH_RESPONSES = Setting("KVTRACE_PATCH_RESPONSES", True, "Proxy adds the kv_transfer object to responses.", bool)
PROXY_REQUEST_TIMEOUT = Setting(
    "KVTRACE_PROXY_REQUEST_TIMEOUT",
    1800.0,
    (
        "Proxy (--request-timeout): total deadline of one request, s, P and D legs and the client's reads included; a "
        "stream past it ends with an SSE error event and [DONE]."
    ),
    float,
)
PROXY_MAX_UPSTREAM_BYTES = Setting(
    "KVTRACE_PROXY_MAX_UPSTREAM_BYTES",
    64 * 1024 * 1024,
    (
        "Proxy (--max-upstream-bytes): largest response read from one P or D request, bytes (a 32k-token answer with "
        "top-20 logprobs is ~50 MB); past it the request fails with response_too_large."
    ),
    int,
)
PROXY_CLIENT_HEADER_TIMEOUT = Setting(
    "KVTRACE_PROXY_CLIENT_HEADER_TIMEOUT",
    60.0,
    (
        "Proxy (--client-header-timeout): a client connection must deliver a complete request head within this many s "
        "of opening (or of its last response, keep-alive); else it is closed."
    ),
    float,
)
PROXY_CLIENT_BODY_TIMEOUT = Setting(
    "KVTRACE_PROXY_CLIENT_BODY_TIMEOUT",
    60.0,
    "Proxy (--client-body-timeout): a request body must arrive within this many s of its head; else 408.",
    float,
)
PROXY_MAX_TABLE_BYTES = Setting(
    "KVTRACE_PROXY_MAX_TABLE_BYTES",
    256 * 1024 * 1024,
    (
        "Proxy (--max-table-bytes): memory bound of the conversation table, bytes (least recently used conversations "
        "are evicted)."
    ),
    int,
)
PROXY_MAX_ID_BYTES = Setting(
    "KVTRACE_PROXY_MAX_ID_BYTES",
    256,
    (
        "Proxy (--max-id-bytes): longest conversation_id / X-Session-ID / baggage session.id / X-Request-Id, UTF-8 "
        "bytes; longer is a 400."
    ),
    int,
)
PROXY_DECODER_KV_TTL = Setting(
    "KVTRACE_PROXY_DECODER_KV_TTL",
    None,
    (
        "Proxy (--decoder-kv-ttl): D's decoder_kv_blocks_ttl, s, when D does not report it (an instrumented D does); "
        "used to warn when --conversation-ttl can outlive it and to name a failed offered read `expired`."
    ),
    float,
)
PROXY_PREFIX_MATCH = Setting(
    "KVTRACE_PROXY_PREFIX_MATCH",
    True,
    (
        "Proxy (--no-prefix-match turns it off): chat requests that carry no session id continue the session whose "
        "served messages (plus the reply the proxy streamed) they extend, and every chat turn of a known session is "
        "checked for continuity (extends / diverged / new); the proxy then keeps a hash per message of each session's "
        "last turn, never the text."
    ),
    bool,
)
PROXY_MAX_CHAIN_BYTES = Setting(
    "KVTRACE_PROXY_MAX_CHAIN_BYTES",
    64 * 1024 * 1024,
    (
        "Proxy (--max-chain-bytes): memory bound of the prefix-matching table (message hashes of each session's last "
        "turn), bytes; least recently used sessions are evicted (it also holds at most --max-conversations sessions)."
    ),
    int,
)
PROXY_MAX_WORKER_CONNECTIONS = Setting(
    "KVTRACE_PROXY_MAX_WORKER_CONNECTIONS",
    1024,
    "Proxy (--max-worker-connections): most requests in flight to one P or D worker, each on its own connection "
    "(kept alive); more wait for one in a FIFO queue. 1024 = vLLM's max_num_seqs on large GPUs, half the accept "
    "backlog of vLLM's API server (uvicorn's 2048), so a burst never overflows it (a worker with a smaller "
    "backlog needs a smaller value).",
    int,
)
PROXY_MAX_WORKER_QUEUE = Setting(
    "KVTRACE_PROXY_MAX_WORKER_QUEUE",
    4096,
    "Proxy (--max-worker-queue): most requests waiting for a connection to one worker; past it a request is "
    "answered 503 (error type pool_full) with Retry-After (the recent queue wait, rounded up, at least 1 s). "
    "A wait is also bounded by --request-timeout (504).",
    int,
)
PROXY_WORKER_COOLDOWN = Setting(
    "KVTRACE_PROXY_WORKER_COOLDOWN",
    5.0,
    "Proxy (--worker-cooldown): seconds a P or D worker that could not be reached (its connection "
    "failed) gets no new turns; doubled at each failure in a row, up to 16 times. The turn goes to "
    "another worker of the role at once. 0: no cooldown (a turn still goes on to another worker).",
    float,
)
PROXY_ROUTING = Setting(
    "KVTRACE_PROXY_ROUTING",
    "round-robin",
    "Proxy (--routing): which P and D serve a turn when there are several: round-robin, least-loaded (fewest "
    "requests in flight), session-affine (D = the one holding the session's KV) or kv-aware (session-affine, "
    "and P = the one that prefilled the session's last turn unless it is busier). kvtrace.routing.",
    str,
)
VLLM_STREAM_PATCH = Setting(
    "KVTRACE_VLLM_STREAM_PATCH",
    True,
    "vLLM plugin: add kv_transfer_params to the streaming finish chunk where vLLM does not.",
    bool,
)
NIXL_PROGRESS_DELAY_US = Setting(
    "KVTRACE_NIXL_PROGRESS_DELAY_US",
    0,
    "vLLM plugin, CPU-only rigs: NIXL agent progress-thread delay, us (0 = NIXL default).",
    int,
)
COMPARE_DIR = Setting(
    "KVTRACE_COMPARE_DIR",
    None,
    "Dashboard: second trace directory for the run comparison page (kvtrace dashboard --compare).",
)
CLICKHOUSE = Setting(
    "KVTRACE_CLICKHOUSE",
    None,
    (
        "query / report / dashboard / whatif read an otel_traces table instead of --traces: "
        "http(s)://[user[:password]@]host[:port][/database] (clickhouse-connect) or chdb:PATH (chDB in process); "
        "docs/clickhouse.md."
    ),
)
CLICKHOUSE_TABLE = Setting(
    "KVTRACE_CLICKHOUSE_TABLE", "otel_traces", "The table (name or database.name) --clickhouse reads."
)
PHOENIX_BIN = Setting(
    "KVTRACE_PHOENIX_BIN", None, "Tests: the `phoenix` command for the Phoenix OTLP test (else the importable one)."
)
AGENT_STACKS_PYTHON = Setting(
    "KVTRACE_AGENT_STACKS_PYTHON",
    None,
    (
        "Tests: the python of the side venv holding the real agent stacks (tests/agent/stacks/requirements.txt) "
        "for tests/agent/test_real_stacks.py; unset = ./.venv-agents/bin/python (scripts/install-dev.sh makes it)."
    ),
)
TEST_CLICKHOUSE_URL = Setting(
    "KVTRACE_TEST_CLICKHOUSE_URL",
    None,
    (
        "Tests: a ClickHouse server (http(s)://...) for the clickhouse-connect tests "
        "(tests/store/clickhouse/test_server.py); unset = those tests skip."
    ),
)
KV_DIGEST_KEY = Setting(
    "KVTRACE_KV_DIGEST_KEY",
    None,
    "Secret key of the digest D's connector puts in kv_transfer_params and P's connector checks "
    "before a pull (kvtrace.kvdigest); set the same value on P and D. Unset = a built-in public key: "
    "honest mismatches (a reused id, a rewritten history) are still found, but anyone who sees the "
    "params can test a guessed text against them and forge a digest for an offer.",
)
REQUIRE_VLLM = Setting("KVTRACE_REQUIRE_VLLM", False, "Tests that need vLLM/NIXL fail instead of skipping.", bool)

ALL: tuple[Setting, ...] = tuple(v for v in globals().values() if isinstance(v, Setting))


def render_markdown() -> str:
    """docs/settings.md (``python -m kvtrace.settings > docs/settings.md``)."""
    rows = ["# kvtrace settings", "", "Generated from `kvtrace/settings.py`. Arguments beat the environment.", ""]
    rows += ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{s.env}` | `{s.default}` | {s.doc} |" for s in ALL]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render_markdown(), end="")
