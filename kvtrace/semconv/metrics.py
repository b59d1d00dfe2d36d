"""The metrics of the span contract: the names of every Prometheus family kvtrace exposes, of its
labels and their values, what each family means (:data:`METRICS`) and the fixed values each label
takes (:data:`LABEL_VALUES`); docs/metrics.md is rendered from them."""

from __future__ import annotations

from kvtrace.semconv.names import *  # noqa: F403

# --------------------------------------------------------------------------------------------
# Prometheus family, label and label-value names (docs/metrics.md is generated from METRICS below)
# --------------------------------------------------------------------------------------------
# KV families: the connector exports them inside vLLM's own /metrics (the KV connector's
# Prometheus hook, next to vllm:nixl_*), each simulated worker on its /metrics.  vLLM's
# per-engine labels (model_name, engine) come first; counters are exposed with a _total suffix.
METRIC_KV_DECISIONS = "vllm:kvtrace_decisions"
METRIC_KV_PROMPT_TOKENS = "vllm:kvtrace_prompt_tokens"
METRIC_KV_TRANSFER_BYTES = "vllm:kvtrace_transfer_bytes"
METRIC_KV_TRANSFER_DURATION = "vllm:kvtrace_transfer_duration_seconds"
METRIC_KV_RETAINED_BLOCKS = "vllm:kvtrace_retained_blocks"
METRIC_KV_RETAINED_BYTES = "vllm:kvtrace_retained_bytes"
METRIC_KV_RETENTION_ENDS = "vllm:kvtrace_retention_ends"
METRIC_KV_RETAINED_BYTE_SECONDS = "vllm:kvtrace_retained_byte_seconds"
METRIC_KV_VERIFICATIONS = "vllm:kvtrace_verifications"
METRIC_KV_MISMATCHED_TOKENS = "vllm:kvtrace_mismatched_tokens"
# proxy (kvtrace proxy's /metrics) and every kvtrace process that exports spans
METRIC_PROXY_REQUESTS = "kvtrace_proxy_requests"
METRIC_PROXY_CONTINUITY = "kvtrace_proxy_session_continuity"
METRIC_PROXY_DECODE_PARAMS_REJECTED = "kvtrace_proxy_decode_params_rejected"
METRIC_PROXY_TTFT = "kvtrace_proxy_time_to_first_token_seconds"
METRIC_PROXY_LATENCY = "kvtrace_proxy_request_latency_seconds"
METRIC_PROXY_CONVERSATIONS = "kvtrace_proxy_conversations"
METRIC_PROXY_CONVERSATIONS_OFFERABLE = "kvtrace_proxy_conversations_with_blocks"
METRIC_PROXY_EVICTIONS = "kvtrace_proxy_conversation_evictions"
METRIC_PROXY_POOL_WAIT = "kvtrace_proxy_upstream_pool_wait_seconds"
METRIC_PROXY_POOL_IN_USE = "kvtrace_proxy_upstream_connections"
METRIC_PROXY_POOL_QUEUED = "kvtrace_proxy_upstream_queued"
METRIC_PROXY_POOL_REJECTED = "kvtrace_proxy_upstream_rejected"
METRIC_PROXY_WORKERS_DOWN = "kvtrace_proxy_upstream_down"
METRIC_PROXY_EJECTIONS = "kvtrace_proxy_upstream_ejected"
METRIC_PROXY_WORKER_UP = "kvtrace_proxy_upstream_up"
METRIC_DROPPED_SPANS = "kvtrace_dropped_spans"
# vLLM's own families (names and buckets of vLLM 0.32/0.33): the simulator emits them too, so a
# simulated cluster fills the same dashboard panels as a real one
VLLM_METRIC_TTFT = "vllm:time_to_first_token_seconds"
VLLM_METRIC_NIXL_XFER_TIME = "vllm:nixl_xfer_time_seconds"
VLLM_METRIC_NIXL_BYTES = "vllm:nixl_bytes_transferred"
VLLM_METRIC_NIXL_FAILED = "vllm:nixl_num_failed_transfers"
VLLM_METRIC_NIXL_EXPIRED = "vllm:nixl_num_kv_expired_reqs"

# label names
LABEL_MODEL_NAME = "model_name"  # vLLM's per-engine labels
LABEL_ENGINE = "engine"
LABEL_DIRECTION = "direction"
LABEL_OUTCOME = "outcome"
LABEL_SOURCE = "source"
LABEL_STATUS = "status"
LABEL_OFFER_REASON = "offer_reason"
LABEL_CONTINUITY = "continuity"
LABEL_FIELD = "field"  # proxy: the kv_transfer_params key D got wrong
LABEL_REASON = "reason"
LABEL_ROLE = "role"  # proxy: the worker's role, prefill or decode
LABEL_ENDPOINT = "endpoint"  # proxy: a configured worker's base URL (a fleet's size: bounded)
LABEL_VERIFIED = "verified"

# label values not enumerated above
SOURCE_LOCAL_HIT = "local_hit"
SOURCE_PULLED = "pulled"
SOURCE_RECOMPUTED = "recomputed"
TOKEN_SOURCES = (SOURCE_LOCAL_HIT, SOURCE_PULLED, SOURCE_RECOMPUTED)
OUTCOME_UNKNOWN = "unknown"  # proxy: P reported no decision (not instrumented, or it failed)
EVICTION_LRU = "lru"
EVICTION_STALE = "stale"
EVICTION_REASONS = (EVICTION_LRU, EVICTION_STALE)
DECODE_PARAMS_OBJECT = "object"  # field label: D's kv_transfer_params (or its kvtrace entry) is not an object
DECODE_PARAMS_NON_FINITE = "non_finite"  # field label: a NaN / infinity somewhere in them
DROP_QUEUE_FULL = "queue_full"
DROP_EXPORT_FAILED = "export_failed"
DROP_WRITE_FAILED = "write_failed"  # the Parquet store could not write the batch (full disk, I/O error)
DROP_REASONS = (DROP_QUEUE_FULL, DROP_EXPORT_FAILED, DROP_WRITE_FAILED)
# key of kvtrace's part of the connector stats payload (KVConnectorStats.data) vLLM carries from
# the EngineCore to the API server
STATS_KEY = "kvtrace"


_kv_emitter = "connector (vLLM /metrics) / simulator worker"
_ENGINE_LABELS = (LABEL_MODEL_NAME, LABEL_ENGINE)
METRICS: dict[str, dict] = {
    METRIC_KV_DECISIONS: {
        "type": "counter",
        "emitter": _kv_emitter,
        "labels": _ENGINE_LABELS + (LABEL_DIRECTION, LABEL_OUTCOME),
        "span": SPAN_KV_DECISION,
        "doc": f"Decisions that ended, by direction and outcome (= {SPAN_KV_DECISION} spans by "
        f"{KV_DIRECTION} and {KV_OUTCOME}).",
    },
    METRIC_KV_PROMPT_TOKENS: {
        "type": "counter",
        "emitter": _kv_emitter,
        "labels": _ENGINE_LABELS + (LABEL_DIRECTION, LABEL_SOURCE),
        "span": SPAN_KV_DECISION,
        "doc": f"Prompt tokens of those decisions by source: {SOURCE_LOCAL_HIT} (= {KV_LOCAL_HIT_TOKENS}), "
        f"{SOURCE_PULLED} ({KV_PULLED_TOKENS}), {SOURCE_RECOMPUTED} ({KV_RECOMPUTED_TOKENS}).",
    },
    METRIC_KV_TRANSFER_BYTES: {
        "type": "counter",
        "emitter": _kv_emitter,
        "labels": _ENGINE_LABELS + (LABEL_DIRECTION,),
        "span": SPAN_KV_TRANSFER,
        "doc": f"Bytes of KV loads that finished {TRANSFER_OK} (= {KV_TRANSFER_BYTES}); rate() is the pull bandwidth.",
    },
    METRIC_KV_TRANSFER_DURATION: {
        "type": "histogram",
        "emitter": _kv_emitter,
        "labels": _ENGINE_LABELS + (LABEL_DIRECTION, LABEL_STATUS),
        "span": SPAN_KV_TRANSFER,
        "doc": f"KV load duration (the {SPAN_KV_TRANSFER} span), s, by direction and {KV_TRANSFER_STATUS}.",
    },
    METRIC_KV_RETAINED_BLOCKS: {
        "type": "gauge",
        "emitter": _kv_emitter,
        "labels": _ENGINE_LABELS,
        "span": SPAN_KV_RETENTION,
        "doc": "KV blocks D holds now for next turns (open retention spans).",
    },
    METRIC_KV_RETAINED_BYTES: {
        "type": "gauge",
        "emitter": _kv_emitter,
        "labels": _ENGINE_LABELS,
        "span": SPAN_KV_RETENTION,
        "doc": f"Bytes D holds now for next turns (sum of {KV_RETENTION_BYTES} of open retention spans).",
    },
    METRIC_KV_RETENTION_ENDS: {
        "type": "counter",
        "emitter": _kv_emitter,
        "labels": _ENGINE_LABELS + (LABEL_OUTCOME,),
        "span": SPAN_KV_RETENTION,
        "doc": f"Retentions that ended, by {KV_RETENTION_OUTCOME}.",
    },
    METRIC_KV_RETAINED_BYTE_SECONDS: {
        "type": "counter",
        "emitter": _kv_emitter,
        "labels": _ENGINE_LABELS,
        "span": SPAN_KV_RETENTION,
        "doc": f"Bytes x seconds held, added when a retention ends ({KV_RETENTION_BYTES} x span duration); "
        "the memory cost of keeping KV for next turns.",
    },
    METRIC_KV_VERIFICATIONS: {
        "type": "counter",
        "emitter": _kv_emitter,
        "labels": _ENGINE_LABELS + (LABEL_VERIFIED,),
        "span": SPAN_KV_DECISION,
        "doc": f"d2p decisions with D's blocks offered, by {KV_VERIFIED} (= {SPAN_KV_DECISION} spans by it).",
    },
    METRIC_KV_MISMATCHED_TOKENS: {
        "type": "counter",
        "emitter": _kv_emitter,
        "labels": _ENGINE_LABELS,
        "span": SPAN_KV_DECISION,
        "doc": f"Tokens vLLM's rule loads (under verify=enforce: would have loaded) from KV of other tokens "
        f"(sum of {KV_VERIFY_WRONG_TOKENS}).",
    },
    METRIC_PROXY_REQUESTS: {
        "type": "counter",
        "emitter": "proxy",
        "labels": (LABEL_STATUS, LABEL_OFFER_REASON),
        "span": SPAN_PROXY_REQUEST,
        "doc": f"Requests answered, by HTTP status ({HTTP_RESPONSE_STATUS_CODE}) and {PROXY_OFFER_REASON}.",
    },
    METRIC_PROXY_CONTINUITY: {
        "type": "counter",
        "emitter": "proxy",
        "labels": (LABEL_CONTINUITY,),
        "span": SPAN_PROXY_REQUEST,
        "doc": f"Turns checked against their session's last served turn (prefix matching on), by "
        f"{SESSION_CONTINUITY}; {CONTINUITY_REUSED_ID} counts session ids reused by another conversation.",
    },
    METRIC_PROXY_DECODE_PARAMS_REJECTED: {
        "type": "counter",
        "emitter": "proxy",
        "labels": (LABEL_FIELD,),
        "span": SPAN_PROXY_REQUEST,
        "doc": f"D's kv_transfer_params not kept for the next turn's offer because they were invalid "
        f"({PROXY_DECODE_PARAMS_INVALID}), by the first field at fault.",
    },
    METRIC_PROXY_TTFT: {
        "type": "histogram",
        "emitter": "proxy",
        "labels": (LABEL_OUTCOME,),
        "span": SPAN_PROXY_REQUEST,
        "doc": f"Time to first token seen by the proxy ({REQUEST_TTFT_MS} / 1000), s, by P's decision "
        f"outcome ({OUTCOME_UNKNOWN} when P reported none); vLLM's TTFT buckets.",
    },
    METRIC_PROXY_LATENCY: {
        "type": "histogram",
        "emitter": "proxy",
        "labels": (LABEL_OUTCOME,),
        "span": SPAN_PROXY_REQUEST,
        "doc": f"Latency of requests answered 200 ({REQUEST_LATENCY_MS} / 1000), s, by P's decision outcome; "
        "vLLM's request latency buckets.",
    },
    METRIC_PROXY_CONVERSATIONS: {
        "type": "gauge",
        "emitter": "proxy",
        "labels": (),
        "span": None,
        "doc": "Conversations in the proxy's table (LRU-bounded by --max-conversations).",
    },
    METRIC_PROXY_CONVERSATIONS_OFFERABLE: {
        "type": "gauge",
        "emitter": "proxy",
        "labels": (),
        "span": None,
        "doc": "Conversations whose table entry holds D's blocks for the next turn.",
    },
    METRIC_PROXY_EVICTIONS: {
        "type": "counter",
        "emitter": "proxy",
        "labels": (LABEL_REASON,),
        "span": None,
        "doc": f"Conversation-table entries dropped: {EVICTION_LRU} (table full), {EVICTION_STALE} "
        "(older than the conversation TTL, on /health).",
    },
    METRIC_PROXY_POOL_WAIT: {
        "type": "histogram",
        "emitter": "proxy",
        "labels": (LABEL_ROLE,),
        "span": None,
        "doc": f"Time each P / D leg waited for a connection to its worker, s (0 when one was free; "
        f"{PROXY_POOL_WAIT_MS} / 1000 on the legs that waited).",
    },
    METRIC_PROXY_POOL_IN_USE: {
        "type": "gauge",
        "emitter": "proxy",
        "labels": (LABEL_ROLE,),
        "span": None,
        "doc": "Requests in flight to the workers of a role now (each holds one connection; at most "
        "--max-worker-connections per worker).",
    },
    METRIC_PROXY_POOL_QUEUED: {
        "type": "gauge",
        "emitter": "proxy",
        "labels": (LABEL_ROLE,),
        "span": None,
        "doc": "Legs waiting for a connection to a worker of a role now (at most --max-worker-queue per worker).",
    },
    METRIC_PROXY_POOL_REJECTED: {
        "type": "counter",
        "emitter": "proxy",
        "labels": (LABEL_ROLE,),
        "span": None,
        "doc": f"Requests answered 503 ({ERROR_POOL_FULL}) because a worker's connection queue was full.",
    },
    METRIC_PROXY_WORKERS_DOWN: {
        "type": "gauge",
        "emitter": "proxy",
        "labels": (LABEL_ROLE,),
        "span": None,
        "doc": "Workers of a role out of the routing now: their last connection failed, and their "
        "--worker-cooldown has not run out.",
    },
    METRIC_PROXY_EJECTIONS: {
        "type": "counter",
        "emitter": "proxy",
        "labels": (LABEL_ROLE,),
        "span": None,
        "doc": "Times a worker of a role was taken out of the routing because a connection to it failed "
        "(each time its turns went on to another worker).",
    },
    METRIC_PROXY_WORKER_UP: {
        "type": "gauge",
        "emitter": "proxy",
        "labels": (LABEL_ROLE, LABEL_ENDPOINT),
        "span": None,
        "doc": "1 while the worker is in the routing, 0 while it is out (its last connection failed and its "
        "--worker-cooldown has not run out); one series per configured worker.",
    },
    METRIC_DROPPED_SPANS: {
        "type": "counter",
        "emitter": "proxy / simulator worker",
        "labels": (LABEL_REASON,),
        "span": None,
        "doc": f"Spans lost by this process: {DROP_QUEUE_FULL} (batch processor queue full), "
        f"{DROP_EXPORT_FAILED} (an exporter failed: OTLP send, Parquet writer process lost or "
        f"spans not convertible), {DROP_WRITE_FAILED} (the Parquet trace directory refused the write: "
        "full disk, I/O error).",
    },
    VLLM_METRIC_TTFT: {
        "type": "histogram",
        "emitter": "vLLM; simulator worker",
        "labels": _ENGINE_LABELS,
        "span": None,
        "doc": "vLLM's time to first token per engine, s.",
    },
    VLLM_METRIC_NIXL_XFER_TIME: {
        "type": "histogram",
        "emitter": "vLLM (NixlConnector); simulator worker",
        "labels": _ENGINE_LABELS,
        "span": None,
        "doc": "vLLM's NIXL transfer duration, s (no direction).",
    },
    VLLM_METRIC_NIXL_BYTES: {
        "type": "histogram",
        "emitter": "vLLM (NixlConnector); simulator worker",
        "labels": _ENGINE_LABELS,
        "span": None,
        "doc": "vLLM's bytes per NIXL transfer (no direction).",
    },
    VLLM_METRIC_NIXL_FAILED: {
        "type": "counter",
        "emitter": "vLLM (NixlConnector); simulator worker",
        "labels": _ENGINE_LABELS,
        "span": None,
        "doc": "vLLM's failed NIXL transfers.",
    },
    VLLM_METRIC_NIXL_EXPIRED: {
        "type": "counter",
        "emitter": "vLLM (NixlConnector); simulator worker",
        "labels": _ENGINE_LABELS,
        "span": None,
        "doc": "vLLM's reads declined because D's blocks expired (counted on P).",
    },
}
LABEL_VALUES: dict[str, tuple[str, ...]] = {
    LABEL_DIRECTION: DIRECTIONS,
    LABEL_OUTCOME: OUTCOMES + RETENTION_OUTCOMES + (OUTCOME_UNKNOWN,),
    LABEL_SOURCE: TOKEN_SOURCES,
    LABEL_VERIFIED: VERIFIED_VALUES,
    LABEL_STATUS: TRANSFER_STATUSES + ("HTTP status code",),
    LABEL_OFFER_REASON: OFFER_REASONS,
    LABEL_CONTINUITY: CONTINUITIES,
    LABEL_FIELD: ("a kv_transfer_params key", DECODE_PARAMS_OBJECT, DECODE_PARAMS_NON_FINITE),
    LABEL_REASON: EVICTION_REASONS + DROP_REASONS,
    LABEL_ROLE: (ROLE_PREFILL, ROLE_DECODE),
    LABEL_ENDPOINT: ("a configured worker's base URL",),
    LABEL_MODEL_NAME: ("served model name",),
    LABEL_ENGINE: ("engine index in the server (0 unless data parallel)",),
}
