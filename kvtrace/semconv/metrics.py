"""The metrics of the span contract: every Prometheus family kvtrace exposes (:data:`METRICS`) and the
fixed values each label takes (:data:`LABEL_VALUES`); docs/metrics.md is rendered from them."""

from __future__ import annotations

from kvtrace.semconv.names import *  # noqa: F403

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
    LABEL_MODEL_NAME: ("served model name",),
    LABEL_ENGINE: ("engine index in the server (0 unless data parallel)",),
}
