"""What the span contract's events, resource attributes and wire fields mean (:data:`EVENTS`,
:data:`RESOURCE`, :data:`KV_TRANSFER_FIELDS`, :data:`CONTEXT_FIELDS`), beside the spans of
:mod:`.spec`, which re-exports them.  :mod:`.render` turns them into docs/semconv.md."""

from __future__ import annotations

from kvtrace.semconv.names import *  # noqa: F403

EVENTS: dict[str, dict] = {
    EVENT_FIRST_TOKEN: {"on": SPAN_PROXY_REQUEST, "doc": "First generated token reached the proxy.", "attributes": {}},
    EVENT_LAST_TOKEN: {"on": SPAN_PROXY_REQUEST, "doc": "Last generated token reached the proxy.", "attributes": {}},
    EVENT_UPSTREAM_ERROR: {
        "on": SPAN_PROXY_REQUEST,
        "doc": "A worker failed (connect, 5xx, stream cut).",
        "attributes": {ERROR_TYPE: "Error class.", SERVER_ADDRESS: "Worker host.", SERVER_PORT: "Worker port."},
    },
    EVENT_CLIENT_DISCONNECT: {
        "on": SPAN_PROXY_REQUEST,
        "doc": "The client went away; upstream requests were cancelled.",
        "attributes": {},
    },
    EVENT_NIXL_STATS: {
        "on": "connector worker spans / engine spans",
        "doc": "NIXL transfer telemetry that could not be attributed to one request.",
        "attributes": {
            NIXL_NUM_TRANSFERS: "Transfers in the interval (int).",
            NIXL_BYTES: "Bytes moved (int).",
            NIXL_XFER_MS: "Summed transfer time, ms (float).",
            NIXL_POST_MS: "Summed post time, ms (float).",
            NIXL_NUM_FAILED: "Failed transfers (int).",
            NIXL_NUM_EXPIRED: "Reads declined as expired (int).",
        },
    },
}

RESOURCE: dict[str, str] = {
    SERVICE_NAME: (
        "kvtrace-proxy, kvtrace-sim-prefill, kvtrace-sim-decode, vllm-prefill, vllm-decode, kvtrace-agent, "
        "kvtrace-bench."
    ),
    SERVICE_INSTANCE_ID: "Unique per process.",
    HOST_NAME: "Host name.",
    SUBSTRATE: f"{SUBSTRATE_SIM} or {SUBSTRATE_VLLM} (connector / simulator processes).",
    ENGINE_ID: "vLLM engine id (connector / simulator processes).",
    ENGINE_ROLE: f"{', '.join(ROLES)} (connector / simulator processes).",
    SIM_TIME_SCALE: "Simulator time compression factor (float; 1.0 = real time).",
    SIM_PRESET: "Simulator cost-model preset.",
    SIM_CLOCK: f"The simulator's clock: {CLOCK_WALL} (served workers sleeping in wall time: timestamps and "
    f"durations are the host's) or {CLOCK_VIRTUAL} (kvtrace bench --clock virtual: every process of the run "
    "on one discrete-event loop, timestamps and durations simulated, the run starting at 2026-01-01T00:00:00Z).",
    ENGINE_PREFIX_CACHING: "The worker's prefix cache is on (bool; vLLM's --enable-prefix-caching / "
    "--no-enable-prefix-caching).",
    KV_BIDIRECTIONAL: "bidirectional_kv_xfer is on (bool).",
    ENGINE_KV_POOL_BYTES: "Size of the engine's KV cache pool, bytes: blocks x bytes per block (int as a string; "
    "simulator: capacity_blocks, vLLM: KVCacheConfig.num_blocks).",
}

KV_TRANSFER_FIELDS: dict[str, str] = {
    KVT_TRACE_ID: "Trace id (32 hex) of the request; also in the x-kvtrace-trace-id header.",
    KVT_REQUEST_ID: "X-Request-Id shared with the workers.",
    KVT_SESSION_ID: "Conversation id, or null.",
    KVT_TURN: "Turn index the proxy assigned (int), or null.",
    KVT_OFFERED: "The proxy offered D's retained blocks to P (bool).",
    KVT_OFFER_REASON: f"Why (or why not): {', '.join(OFFER_REASONS)}.",
    KVT_DECISION: f"P's outcome: {', '.join(OUTCOMES)}, or null when P is not instrumented.",
    KVT_PROMPT_TOKENS: "Prompt tokens (int).",
    KVT_LOCAL_HIT_TOKENS: "Tokens P found in its own prefix cache (int).",
    KVT_REMOTE_TOKENS: "Reusable tokens D offered (int).",
    KVT_PULLED_TOKENS: "Tokens P pulled from D (int).",
    KVT_RECOMPUTED_TOKENS: "Prompt tokens P computed (int).",
    KVT_BYTES: "Bytes P pulled (int).",
    KVT_TRANSFER_MS: "Pull duration, ms (float).",
    KVT_PEER_ENGINE_ID: "Engine P pulled from.",
    KVT_ENGINE_ID: "Engine that produced the object (connector/simulator objects only).",
    KVT_ROLE: "Role of that engine (connector/simulator objects only).",
    KVT_RETAINED_BLOCKS: "Blocks D now holds for the next turn (int).",
    KVT_RETAINED_BYTES: "Bytes D now holds for the next turn (int).",
    KVT_RETAINED_TTL_S: "How long D holds them, s (float).",
    KVT_PREFILL: "P's own kvtrace object, unmerged (proxy only).",
    KVT_DECODE: "D's own kvtrace object, unmerged (proxy only).",
    KVT_FALLBACK: f"Fault handling applied: {', '.join(FALLBACKS)}.",
    KVT_TTFT_MS: "TTFT measured at the proxy, ms (float).",
    KVT_VERIFIED: f"P's {KV_VERIFIED} (connector/simulator objects only; null when nothing was offered).",
    KVT_DIGEST: f"D's keyed digest of the tokens its retained blocks hold (connector/simulator objects only): "
    f"`{DIGEST_VERSION}` (1), `{DIGEST_CHUNK}` (tokens per chunk), `{DIGEST_TOKENS}` (tokens covered = "
    f"remote_num_tokens), `{DIGEST_TAGS}` (base64 of 4 bytes per chunk boundary and one for a partial last "
    "chunk: BLAKE2b keyed with KVTRACE_KV_DIGEST_KEY over D's engine id, request id, block ids and the tokens "
    "up to the boundary). At most 86 bytes per 1,000 tokens (+ 60): about 11 KB for 128k tokens. "
    f"`{DIGEST_VERSION}` 2 (a vLLM D with block hashes): the tags are over vLLM's chained block hash at each "
    f"boundary instead of the tokens, `{DIGEST_CHUNK}` = lcm(64, hash_block_size), and `{DIGEST_FINGERPRINT}` "
    "(16 hex digits) is the keyed hash of (prefix_caching_hash_algo, NONE_HASH, hash_block_size): P treats an "
    "offer with another fingerprint as unverifiable.",
}

CONTEXT_FIELDS: dict[str, str] = {
    CTX_TRACEPARENT: "W3C traceparent of the proxy leg; the connector parents its spans on it.",
    CTX_SESSION_ID: "Conversation id.",
    CTX_TURN: "Turn index (int).",
}
