"""The kvtrace span contract: every span name, attribute key, event name and enumerated value.

Nothing else in kvtrace types one of these strings.  OpenTelemetry names are reused where one
exists (``gen_ai.*`` GenAI semantic conventions, ``session.id``, ``error.type``, ``server.*``,
``http.*``); everything else lives under the ``kvtrace.`` namespace.  The ``gen_ai.*`` names follow
the GenAI conventions of :data:`GENAI_SEMCONV_VERSION` (docs/semconv.md says more).

``docs/semconv.md`` is generated from :data:`SPANS`, :data:`RESOURCE`, :data:`EVENTS` and
:data:`KV_TRANSFER_FIELDS` with ``python -m kvtrace.semconv``; a test fails when a constant
defined here is missing from it.

Timebase: every span carries wall-clock timestamps of the process that emitted it.  The
simulator compresses time by ``kvtrace.sim.time_scale`` (a resource attribute); multiply its
durations by that factor to read them in simulated model time.
"""

from __future__ import annotations

# --------------------------------------------------------------------------------------------
# Span names
# --------------------------------------------------------------------------------------------
SPAN_PROXY_REQUEST = "kvtrace.proxy.request"  # SERVER, root of a proxied request
SPAN_PROXY_PREFILL = "kvtrace.proxy.prefill"  # CLIENT, the P leg
SPAN_PROXY_DECODE = "kvtrace.proxy.decode"  # CLIENT, the D leg
SPAN_ENGINE_PREFILL = "kvtrace.engine.prefill"  # INTERNAL, a request's life on a prefill worker
SPAN_ENGINE_DECODE = "kvtrace.engine.decode"  # INTERNAL, a request's life on a decode worker
SPAN_KV_DECISION = "kvtrace.kv.decision"  # INTERNAL, pull-vs-recompute decision
SPAN_KV_TRANSFER = "kvtrace.kv.transfer"  # INTERNAL, one KV load (d2p or p2d)
SPAN_KV_RETENTION = "kvtrace.kv.retention"  # INTERNAL, blocks pinned on D after a turn
SPAN_AGENT_SESSION = "kvtrace.agent.session"  # INTERNAL, invoke_agent
SPAN_AGENT_TURN = "kvtrace.agent.turn"  # INTERNAL, one user turn of a session
SPAN_AGENT_LLM_CALL = "kvtrace.agent.llm_call"  # CLIENT, chat
SPAN_AGENT_TOOL_CALL = "kvtrace.agent.tool_call"  # INTERNAL, execute_tool (a tool wait)
SPAN_AGENT_APP_WORK = "kvtrace.agent.app_work"  # INTERNAL, the agent's own work
SPAN_AGENT_USER_PAUSE = "kvtrace.agent.user_pause"  # INTERNAL, the agent waits for its user
SPAN_VLLM_LLM_REQUEST = "llm_request"  # SERVER, vLLM's own span (--otlp-traces-endpoint); not emitted by kvtrace

# --------------------------------------------------------------------------------------------
# Event names
# --------------------------------------------------------------------------------------------
EVENT_FIRST_TOKEN = "kvtrace.first_token"
EVENT_LAST_TOKEN = "kvtrace.last_token"
EVENT_UPSTREAM_ERROR = "kvtrace.upstream_error"
EVENT_CLIENT_DISCONNECT = "kvtrace.client_disconnect"
EVENT_NIXL_STATS = "kvtrace.nixl.stats"

# --------------------------------------------------------------------------------------------
# OpenTelemetry attribute names reused as they are
# --------------------------------------------------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"  # included in input_tokens
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_REQUEST_ID = "gen_ai.request.id"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # only with KVTRACE_CAPTURE_CONTENT
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"  # only with KVTRACE_CAPTURE_CONTENT
SESSION_ID = "session.id"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
URL_PATH = "url.path"
SERVICE_NAME = "service.name"
SERVICE_INSTANCE_ID = "service.instance.id"
HOST_NAME = "host.name"

# Which GenAI conventions the gen_ai.* names above follow (docs/semconv.md states it; a test checks
# every one against the installed opentelemetry-semantic-conventions package)
GENAI_SEMCONV_VERSION = "1.44.0"
_genai_semconv_note = (
    "The `gen_ai.*` names follow the OpenTelemetry GenAI semantic conventions as released in "
    f"semantic-conventions `{GENAI_SEMCONV_VERSION}` (schema https://opentelemetry.io/schemas/{GENAI_SEMCONV_VERSION}, "
    "Python package opentelemetry-semantic-conventions 0.66b2), status Development; they have since moved, "
    "unchanged and still unreleased, to the open-telemetry/semantic-conventions-genai repository. "
    "`gen_ai.usage.cache_read.input_tokens` is included in `gen_ai.usage.input_tokens` (the total), as the "
    "conventions specify. vLLM's own `llm_request` span still uses the older `gen_ai.usage.prompt_tokens` / "
    "`gen_ai.usage.completion_tokens`."
)

# vLLM's own llm_request span attributes (vllm/tracing; latencies in seconds, float)
GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
VLLM_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
VLLM_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
VLLM_LATENCY_E2E = "gen_ai.latency.e2e"
VLLM_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
VLLM_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
VLLM_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"

# gen_ai.operation.name values
OP_CHAT = "chat"
OP_TEXT_COMPLETION = "text_completion"
OP_EXECUTE_TOOL = "execute_tool"
OP_INVOKE_AGENT = "invoke_agent"

# --------------------------------------------------------------------------------------------
# kvtrace attributes
# --------------------------------------------------------------------------------------------
# request identity, shared by proxy, engine and agent spans
TURN_INDEX = "kvtrace.turn.index"
REQUEST_STREAM = "kvtrace.request.stream"
REQUEST_TTFT_MS = "kvtrace.request.ttft_ms"
REQUEST_LATENCY_MS = "kvtrace.request.latency_ms"
REQUEST_CACHED_TOKENS = "kvtrace.request.cached_tokens"

# proxy
PROXY_OFFER = "kvtrace.proxy.offer"  # bool: D's blocks were offered to P
PROXY_OFFER_REASON = "kvtrace.proxy.offer_reason"
PROXY_ENTRY_AGE_S = "kvtrace.proxy.entry_age_s"
PROXY_CONVERSATION_TTL_S = "kvtrace.proxy.conversation_ttl_s"
PROXY_FALLBACK = "kvtrace.proxy.fallback"
PROXY_PREFILL_ENDPOINT = "kvtrace.proxy.prefill_endpoint"
PROXY_DECODE_ENDPOINT = "kvtrace.proxy.decode_endpoint"
PROXY_PREFILL_ATTEMPTS = "kvtrace.proxy.prefill_attempts"  # int: 2 when P was asked again without the offer
PROXY_RETRY = "kvtrace.proxy.retry"  # bool on a P leg: the fresh prefill after a failed read of the offer
PROXY_DECODER_KV_TTL_S = "kvtrace.proxy.decoder_kv_ttl_s"  # float: D's retention as the proxy knows it

# session identification and continuity (proxy request span, chat requests)
SESSION_SOURCE = "kvtrace.session.source"  # how the request's session was found
SESSION_CONTINUITY = "kvtrace.session.continuity"  # extends | diverged | new
SESSION_DIVERGED_AT = "kvtrace.session.diverged_at"  # int: index of the first message that differs
SESSION_REUSABLE_TOKENS_LOST = "kvtrace.session.reusable_tokens_lost"  # int: D's tokens a diverged turn could not use

# engine / connector identity (also resource attributes of connector processes)
ENGINE_ID = "kvtrace.engine.id"
ENGINE_ROLE = "kvtrace.engine.role"
SUBSTRATE = "kvtrace.substrate"
SIM_TIME_SCALE = "kvtrace.sim.time_scale"
SIM_PRESET = "kvtrace.sim.preset"
ENGINE_PREFIX_CACHING = "kvtrace.engine.prefix_caching"  # bool resource attribute: vLLM's enable_prefix_caching
KV_BIDIRECTIONAL = "kvtrace.kv.bidirectional"  # bool resource attribute: bidirectional_kv_xfer
ENGINE_KV_POOL_BYTES = "kvtrace.engine.kv_pool_bytes"

# decision
KV_OUTCOME = "kvtrace.kv.outcome"
KV_DIRECTION = "kvtrace.kv.direction"
KV_PROMPT_TOKENS = "kvtrace.kv.prompt_tokens"
KV_LOCAL_HIT_TOKENS = "kvtrace.kv.local_hit_tokens"
KV_REMOTE_TOKENS = "kvtrace.kv.remote_tokens"
KV_PULLED_TOKENS = "kvtrace.kv.pulled_tokens"
KV_RECOMPUTED_TOKENS = "kvtrace.kv.recomputed_tokens"
KV_THRESHOLD = "kvtrace.kv.threshold"
KV_EXPIRY_DEADLINE = "kvtrace.kv.expiry_deadline"
KV_EXPIRY_REMAINING_S = "kvtrace.kv.expiry_remaining_s"
KV_PEER_ENGINE_ID = "kvtrace.kv.peer_engine_id"
KV_REMOTE_REQUEST_ID = "kvtrace.kv.remote_request_id"
KV_LOAD_FAILURE_POLICY = "kvtrace.kv.load_failure_policy"

# transfer
KV_TRANSFER_TOKENS = "kvtrace.kv.transfer.tokens"
KV_TRANSFER_BLOCKS = "kvtrace.kv.transfer.blocks"
KV_TRANSFER_BYTES = "kvtrace.kv.transfer.bytes"
KV_TRANSFER_XFER_MS = "kvtrace.kv.transfer.xfer_ms"
KV_TRANSFER_POST_MS = "kvtrace.kv.transfer.post_ms"
KV_TRANSFER_STATUS = "kvtrace.kv.transfer.status"

# retention
KV_RETENTION_BLOCKS = "kvtrace.kv.retention.blocks"
KV_RETENTION_TOKENS = "kvtrace.kv.retention.tokens"
KV_RETENTION_BYTES = "kvtrace.kv.retention.bytes"
KV_RETENTION_TTL_S = "kvtrace.kv.retention.ttl_s"
KV_RETENTION_OUTCOME = "kvtrace.kv.retention.outcome"

# nixl worker stats (event attributes)
NIXL_NUM_TRANSFERS = "kvtrace.nixl.num_transfers"
NIXL_BYTES = "kvtrace.nixl.bytes"
NIXL_XFER_MS = "kvtrace.nixl.xfer_ms"
NIXL_POST_MS = "kvtrace.nixl.post_ms"
NIXL_NUM_FAILED = "kvtrace.nixl.num_failed"
NIXL_NUM_EXPIRED = "kvtrace.nixl.num_expired"

# agent
AGENT_WORK_NAME = "kvtrace.agent.work_name"
AGENT_PAUSE_REASON = "kvtrace.agent.pause_reason"
AGENT_SCENARIO = "kvtrace.agent.scenario"
LLM_TTFT_MS = "kvtrace.llm.ttft_ms"
LLM_TPOT_MS = "kvtrace.llm.tpot_ms"

# --------------------------------------------------------------------------------------------
# Enumerated values
# --------------------------------------------------------------------------------------------
OUTCOME_PULLED = "pulled"
OUTCOME_BELOW_THRESHOLD = "below_threshold"
OUTCOME_EXPIRED = "expired"
OUTCOME_NO_REMOTE = "no_remote"
OUTCOME_LOCAL_HIT = "local_hit"
OUTCOME_FAILED = "failed"
OUTCOMES = (
    OUTCOME_PULLED,
    OUTCOME_BELOW_THRESHOLD,
    OUTCOME_EXPIRED,
    OUTCOME_NO_REMOTE,
    OUTCOME_LOCAL_HIT,
    OUTCOME_FAILED,
)

DIRECTION_D2P = "d2p"  # reverse: next turn's P pulls D's retained blocks (bidirectional)
DIRECTION_P2D = "p2d"  # forward: D pulls the prompt's blocks from P
DIRECTIONS = (DIRECTION_D2P, DIRECTION_P2D)

TRANSFER_OK = "ok"
TRANSFER_FAILED = "failed"
TRANSFER_EXPIRED = "expired"
TRANSFER_STATUSES = (TRANSFER_OK, TRANSFER_FAILED, TRANSFER_EXPIRED)

RETENTION_READ = "read"
RETENTION_EXPIRED = "expired"
RETENTION_RELEASED = "released"
RETENTION_OUTCOMES = (RETENTION_READ, RETENTION_EXPIRED, RETENTION_RELEASED)

ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"
ROLE_BOTH = "both"
ROLES = (ROLE_PREFILL, ROLE_DECODE, ROLE_BOTH)

SUBSTRATE_SIM = "sim"
SUBSTRATE_VLLM = "vllm"
SUBSTRATES = (SUBSTRATE_SIM, SUBSTRATE_VLLM)

OFFER_OFFERED = "offered"
OFFER_NO_CONVERSATION_ID = "no_conversation_id"
OFFER_NO_ENTRY = "no_entry"
OFFER_ENTRY_TOO_OLD = "entry_too_old"
OFFER_DISABLED = "disabled"
OFFER_DIVERGED = "diverged"  # the prompt no longer extends what D holds: its blocks would be wrong KV
OFFER_REASONS = (
    OFFER_OFFERED,
    OFFER_NO_CONVERSATION_ID,
    OFFER_NO_ENTRY,
    OFFER_ENTRY_TOO_OLD,
    OFFER_DISABLED,
    OFFER_DIVERGED,
)

SOURCE_CONVERSATION_ID = "conversation_id"  # body field (vLLM's multi-turn proxy / benchmark)
SOURCE_HEADER = "header"  # X-Session-ID
SOURCE_BAGGAGE = "baggage"  # W3C baggage session.id
SOURCE_PROMPT_CACHE_KEY = "prompt_cache_key"  # the OpenAI API's routing hint for prompt caching
SOURCE_PREFIX = "prefix"  # the proxy's prefix table: continues a served chain, or a session it named
SOURCE_NONE = "none"  # no session (prefix matching off, or not a chat request)
SESSION_SOURCES = (
    SOURCE_CONVERSATION_ID,
    SOURCE_HEADER,
    SOURCE_BAGGAGE,
    SOURCE_PROMPT_CACHE_KEY,
    SOURCE_PREFIX,
    SOURCE_NONE,
)

CONTINUITY_EXTENDS = "extends"  # the messages start with the session's last served turn (reply included)
CONTINUITY_DIVERGED = "diverged"  # a message of the last served turn differs (or is missing)
CONTINUITY_NEW = "new"  # nothing known of the session yet (first turn, or its record was evicted)
CONTINUITIES = (CONTINUITY_EXTENDS, CONTINUITY_DIVERGED, CONTINUITY_NEW)

# error.type values kvtrace itself sets (otherwise: the exception class or the worker's error type)
ERROR_STREAM_INTERRUPTED = "stream_interrupted"  # agent: the stream was closed before its end
ERROR_CLIENT_DISCONNECT = "client_disconnect"  # proxy / sim: the client went away
ERROR_INVALID_CHUNK = "invalid_chunk"  # proxy: D sent a stream line that is not an OpenAI chunk
ERROR_INCOMPLETE_STREAM = "incomplete_stream"  # proxy: D's stream ended without [DONE]
ERROR_INVALID_RESPONSE = "invalid_response"  # proxy: P's answer is not a JSON object
ERROR_RESPONSE_TOO_LARGE = "response_too_large"  # proxy: a worker's response passed --max-upstream-bytes
ERROR_DEADLINE_EXCEEDED = "deadline_exceeded"  # proxy: the request passed --request-timeout
ERROR_VALUES = (
    ERROR_STREAM_INTERRUPTED,
    ERROR_CLIENT_DISCONNECT,
    ERROR_INVALID_CHUNK,
    ERROR_INCOMPLETE_STREAM,
    ERROR_INVALID_RESPONSE,
    ERROR_RESPONSE_TOO_LARGE,
    ERROR_DEADLINE_EXCEEDED,
)

FALLBACK_NONE = "none"
FALLBACK_DECODE_ONLY = "decode_only"
FALLBACKS = (FALLBACK_NONE, FALLBACK_DECODE_ONLY)

# --------------------------------------------------------------------------------------------
# Wire objects
# --------------------------------------------------------------------------------------------
# Key of the kvtrace entry inside vLLM's ``kv_transfer_params`` (both directions), of the
# ``kv_transfer`` object the proxy adds to responses, and of the response header.
KV_PARAMS_KEY = "kvtrace"
RESPONSE_KV_TRANSFER = "kv_transfer"
HEADER_TRACE_ID = "x-kvtrace-trace-id"
HEADER_SESSION_ID = "X-Session-ID"
HEADER_REQUEST_ID = "X-Request-Id"
BODY_CONVERSATION_ID = "conversation_id"
BODY_PROMPT_CACHE_KEY = "prompt_cache_key"
PREFIX_SESSION_PREFIX = "prefix-"  # session ids the proxy names for prefix-tracked sessions start with this
BAGGAGE_SESSION_ID = SESSION_ID

# fields of the ``kvtrace`` entry the proxy puts into kv_transfer_params (request direction)
CTX_TRACEPARENT = "traceparent"
CTX_SESSION_ID = "session_id"
CTX_TURN = "turn"

# fields of the ``kvtrace`` object the connector / simulator returns in kv_transfer_params,
# and (merged, with the proxy's fields) of the ``kv_transfer`` object sent to the client
KVT_TRACE_ID = "trace_id"
KVT_REQUEST_ID = "request_id"
KVT_SESSION_ID = "session_id"
KVT_TURN = "turn"
KVT_ENGINE_ID = "engine_id"
KVT_ROLE = "role"
KVT_DECISION = "decision"
KVT_PROMPT_TOKENS = "prompt_tokens"
KVT_LOCAL_HIT_TOKENS = "local_hit_tokens"
KVT_REMOTE_TOKENS = "remote_tokens"
KVT_PULLED_TOKENS = "pulled_tokens"
KVT_RECOMPUTED_TOKENS = "recomputed_tokens"
KVT_BYTES = "bytes"
KVT_TRANSFER_MS = "transfer_ms"
KVT_PEER_ENGINE_ID = "peer_engine_id"
KVT_RETAINED_BLOCKS = "retained_blocks"
KVT_RETAINED_BYTES = "retained_bytes"
KVT_RETAINED_TTL_S = "retained_ttl_s"
KVT_OFFERED = "offered"
KVT_OFFER_REASON = "offer_reason"
KVT_PREFILL = "prefill"
KVT_DECODE = "decode"
KVT_FALLBACK = "fallback"
KVT_TTFT_MS = "ttft_ms"

# --------------------------------------------------------------------------------------------
# Prometheus metrics (docs/metrics.md is generated from METRICS below)
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
# proxy (kvtrace proxy's /metrics) and every kvtrace process that exports spans
METRIC_PROXY_REQUESTS = "kvtrace_proxy_requests"
METRIC_PROXY_TTFT = "kvtrace_proxy_time_to_first_token_seconds"
METRIC_PROXY_LATENCY = "kvtrace_proxy_request_latency_seconds"
METRIC_PROXY_CONVERSATIONS = "kvtrace_proxy_conversations"
METRIC_PROXY_CONVERSATIONS_OFFERABLE = "kvtrace_proxy_conversations_with_blocks"
METRIC_PROXY_EVICTIONS = "kvtrace_proxy_conversation_evictions"
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
LABEL_REASON = "reason"

# label values not enumerated above
SOURCE_LOCAL_HIT = "local_hit"
SOURCE_PULLED = "pulled"
SOURCE_RECOMPUTED = "recomputed"
TOKEN_SOURCES = (SOURCE_LOCAL_HIT, SOURCE_PULLED, SOURCE_RECOMPUTED)
OUTCOME_UNKNOWN = "unknown"  # proxy: P reported no decision (not instrumented, or it failed)
EVICTION_LRU = "lru"
EVICTION_STALE = "stale"
EVICTION_REASONS = (EVICTION_LRU, EVICTION_STALE)
DROP_QUEUE_FULL = "queue_full"
DROP_EXPORT_FAILED = "export_failed"
DROP_REASONS = (DROP_QUEUE_FULL, DROP_EXPORT_FAILED)
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
    METRIC_PROXY_REQUESTS: {
        "type": "counter",
        "emitter": "proxy",
        "labels": (LABEL_STATUS, LABEL_OFFER_REASON),
        "span": SPAN_PROXY_REQUEST,
        "doc": f"Requests answered, by HTTP status ({HTTP_RESPONSE_STATUS_CODE}) and {PROXY_OFFER_REASON}.",
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
    METRIC_DROPPED_SPANS: {
        "type": "counter",
        "emitter": "proxy / simulator worker",
        "labels": (LABEL_REASON,),
        "span": None,
        "doc": f"Spans lost by this process: {DROP_QUEUE_FULL} (batch processor queue full), "
        f"{DROP_EXPORT_FAILED} (an exporter failed).",
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
    LABEL_STATUS: TRANSFER_STATUSES + ("HTTP status code",),
    LABEL_OFFER_REASON: OFFER_REASONS,
    LABEL_REASON: EVICTION_REASONS + DROP_REASONS,
    LABEL_MODEL_NAME: ("served model name",),
    LABEL_ENGINE: ("engine index in the server (0 unless data parallel)",),
}


# --------------------------------------------------------------------------------------------
# The documented contract (drives docs/semconv.md and the documentation test)
# --------------------------------------------------------------------------------------------
_ID = {
    SESSION_ID: "Conversation / agent session id (same value as gen_ai.conversation.id).",
    GEN_AI_CONVERSATION_ID: "Conversation id (OTel GenAI).",
    TURN_INDEX: "0-based turn index within the session (int).",
    GEN_AI_REQUEST_ID: "The X-Request-Id shared by the proxy, P and D (vLLM's request id base).",
}
_ENGINE = {
    ENGINE_ID: "vLLM engine id of the emitting worker.",
    ENGINE_ROLE: f"Role of the emitting worker: {', '.join(ROLES)}.",
}

SPANS: dict[str, dict] = {
    SPAN_PROXY_REQUEST: {
        "kind": "SERVER",
        "emitter": "proxy",
        "doc": "One client request through the proxy; root of the trace unless the client sent a "
        "traceparent. Events: first token, last token, upstream error, client disconnect.",
        "attributes": {
            **_ID,
            GEN_AI_OPERATION_NAME: f"`{OP_CHAT}` or `{OP_TEXT_COMPLETION}`.",
            GEN_AI_REQUEST_MODEL: "Model named by the client.",
            GEN_AI_REQUEST_MAX_TOKENS: "max_tokens asked by the client (int).",
            GEN_AI_USAGE_INPUT_TOKENS: "Prompt tokens (from D's usage), cached ones included.",
            GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: "Prompt tokens P did not compute: its local prefix-cache hit "
            "plus the tokens it pulled from D (int; from P's kvtrace object, else P's usage cached_tokens).",
            GEN_AI_USAGE_OUTPUT_TOKENS: "Completion tokens (from D's usage).",
            GEN_AI_RESPONSE_FINISH_REASONS: "Finish reasons (string array).",
            SESSION_SOURCE: f"How the session was found: {', '.join(SESSION_SOURCES)} (body `{BODY_CONVERSATION_ID}`, "
            f"`{HEADER_SESSION_ID}`, baggage `{BAGGAGE_SESSION_ID}`, body `{BODY_PROMPT_CACHE_KEY}`, the proxy's "
            f"prefix table, none). `{SOURCE_PREFIX}` sessions are named `{PREFIX_SESSION_PREFIX}<hex>` by the proxy.",
            SESSION_CONTINUITY: f"Chat requests with prefix matching on: {', '.join(CONTINUITIES)} against the "
            "session's last served turn (its messages plus the reply the proxy streamed).",
            SESSION_DIVERGED_AT: "When diverged: index of the first message that differs from the last served "
            "turn (int).",
            SESSION_REUSABLE_TOKENS_LOST: "When diverged and D held blocks for the session: the tokens P would have "
            "pulled had the prompt extended them, min(D's tokens, prompt tokens) - P's local hit (int; needs P's "
            "report).",
            HTTP_REQUEST_METHOD: "HTTP method.",
            URL_PATH: "Route, e.g. /v1/chat/completions.",
            HTTP_RESPONSE_STATUS_CODE: "Status returned to the client (int).",
            REQUEST_STREAM: "Client asked for streaming (bool).",
            REQUEST_TTFT_MS: "Time to first token seen by the proxy, ms (float).",
            REQUEST_LATENCY_MS: "Completed latency, ms (float).",
            PROXY_OFFER: "D's retained blocks were offered to P (bool).",
            PROXY_OFFER_REASON: f"Why: {', '.join(OFFER_REASONS)}.",
            PROXY_ENTRY_AGE_S: "Age of the conversation-table entry when offered, s (float).",
            PROXY_CONVERSATION_TTL_S: "The proxy's --conversation-ttl: it offers D's blocks while their entry is at "
            "most this old, s of the proxy's clock (float).",
            PROXY_FALLBACK: f"Fault handling applied: {', '.join(FALLBACKS)}.",
            PROXY_PREFILL_ENDPOINT: "P worker base URL chosen.",
            PROXY_DECODE_ENDPOINT: "D worker base URL chosen.",
            PROXY_PREFILL_ATTEMPTS: "P legs sent (int): 2 when P failed (5xx) to read the offered blocks and "
            "the proxy asked again without them; absent when 1.",
            PROXY_DECODER_KV_TTL_S: "D's block retention (decoder_kv_blocks_ttl) as the proxy knows it: "
            "reported by an instrumented D, else --decoder-kv-ttl; absent when unknown, s (float). An offer "
            "window + 5 s (vLLM's read margin) at or past it means offers can name blocks D has dropped.",
            KV_OUTCOME: "P's decision outcome as reported by P (when known); `expired` (entry older than "
            "D's retention) or `failed` when P failed to read the offered blocks and the proxy retried.",
            KV_PULLED_TOKENS: "Tokens P pulled from D (int).",
            ERROR_TYPE: "Error class when the request failed.",
        },
    },
    SPAN_PROXY_PREFILL: {
        "kind": "CLIENT",
        "emitter": "proxy",
        "doc": "The P leg (max_tokens=1, non-streaming).",
        "attributes": {
            **_ID,
            SERVER_ADDRESS: "P host.",
            SERVER_PORT: "P port (int).",
            HTTP_RESPONSE_STATUS_CODE: "P's status (int).",
            PROXY_OFFER: "kv_transfer_params with D's blocks were sent (bool).",
            PROXY_RETRY: "This leg is the fresh prefill (no offer) after P failed to read the offered blocks (bool).",
            ERROR_TYPE: "Error class when the leg failed.",
        },
    },
    SPAN_PROXY_DECODE: {
        "kind": "CLIENT",
        "emitter": "proxy",
        "doc": "The D leg (always streaming).",
        "attributes": {
            **_ID,
            SERVER_ADDRESS: "D host.",
            SERVER_PORT: "D port (int).",
            HTTP_RESPONSE_STATUS_CODE: "D's status (int).",
            REQUEST_TTFT_MS: "First streamed token after the leg started, ms (float).",
            ERROR_TYPE: "Error class when the leg failed.",
        },
    },
    SPAN_ENGINE_PREFILL: {
        "kind": "INTERNAL",
        "emitter": "connector / simulator on P",
        "doc": "A prefill request's life on P, from the connector first seeing it to "
        "request_finished. Parent: the proxy's P leg.",
        "attributes": {
            **_ID,
            **_ENGINE,
            KV_PROMPT_TOKENS: "Prompt tokens (int).",
            REQUEST_CACHED_TOKENS: "Tokens not computed on this worker (local hit + pulled).",
        },
    },
    SPAN_ENGINE_DECODE: {
        "kind": "INTERNAL",
        "emitter": "connector / simulator on D",
        "doc": "A decode request's life on D. Parent: the proxy's D leg.",
        "attributes": {
            **_ID,
            **_ENGINE,
            KV_PROMPT_TOKENS: "Prompt tokens (int).",
            GEN_AI_USAGE_OUTPUT_TOKENS: "Tokens generated (int).",
            REQUEST_CACHED_TOKENS: "Tokens not computed on this worker (local hit + pulled).",
        },
    },
    SPAN_KV_DECISION: {
        "kind": "INTERNAL",
        "emitter": "connector / simulator",
        "doc": "The pull-vs-recompute decision for one request, from the scheduler's "
        "get_num_new_matched_tokens until its outcome is known (a pull's outcome is final when the "
        "load finishes). Direction d2p on P (bidirectional reuse), p2d on D.",
        "attributes": {
            **_ID,
            **_ENGINE,
            KV_OUTCOME: f"One of: {', '.join(OUTCOMES)}.",
            KV_DIRECTION: f"{DIRECTION_D2P} (P pulling D's blocks) or {DIRECTION_P2D}.",
            KV_PROMPT_TOKENS: "Prompt tokens of the request (int).",
            KV_LOCAL_HIT_TOKENS: "Tokens already in the local prefix cache (int).",
            KV_REMOTE_TOKENS: "Reusable tokens the peer offered (remote_num_tokens, int).",
            KV_PULLED_TOKENS: "Tokens loaded from the peer (int).",
            KV_RECOMPUTED_TOKENS: "Prompt tokens computed locally (int).",
            KV_THRESHOLD: "kv_recompute_threshold in force (int).",
            KV_EXPIRY_DEADLINE: "Peer's remote_blocks_expiry_time (peer clock, float).",
            KV_EXPIRY_REMAINING_S: "Seconds left before expiry at decision time (float).",
            KV_PEER_ENGINE_ID: "Peer engine id (remote_engine_id).",
            KV_REMOTE_REQUEST_ID: "Peer's request id (remote_request_id).",
            KV_LOAD_FAILURE_POLICY: "kv_load_failure_policy: fail or recompute.",
            ERROR_TYPE: "Error class when the outcome is failed.",
        },
    },
    SPAN_KV_TRANSFER: {
        "kind": "INTERNAL",
        "emitter": "connector / simulator",
        "doc": "One asynchronous KV load, from being scheduled to finished/failed receiving. "
        "Parent: the decision span.",
        "attributes": {
            **_ID,
            **_ENGINE,
            KV_DIRECTION: f"{DIRECTION_D2P} or {DIRECTION_P2D}.",
            KV_TRANSFER_TOKENS: "Tokens loaded (int).",
            KV_TRANSFER_BLOCKS: "Blocks loaded (int).",
            KV_TRANSFER_BYTES: "Bytes loaded, from the KV cache page sizes (int).",
            KV_TRANSFER_XFER_MS: "Transport time reported by the worker, ms (float).",
            KV_TRANSFER_POST_MS: "Time to post the transfer, ms (float).",
            KV_TRANSFER_STATUS: f"One of: {', '.join(TRANSFER_STATUSES)}.",
            KV_PEER_ENGINE_ID: "Engine the blocks came from.",
            KV_REMOTE_REQUEST_ID: "Peer's request id.",
            ERROR_TYPE: "Error class when the transfer failed.",
        },
    },
    SPAN_KV_RETENTION: {
        "kind": "INTERNAL",
        "emitter": "connector / simulator on D",
        "doc": "Blocks D pins after a finished request (bidirectional), until read by the next "
        "turn, expired, or freed. Parent: the D engine span.",
        "attributes": {
            **_ID,
            **_ENGINE,
            KV_RETENTION_BLOCKS: "Blocks held (int).",
            KV_RETENTION_TOKENS: "Tokens held (int).",
            KV_RETENTION_BYTES: "Bytes held (int).",
            KV_RETENTION_TTL_S: "decoder_kv_blocks_ttl, s (float).",
            KV_RETENTION_OUTCOME: f"One of: {', '.join(RETENTION_OUTCOMES)}.",
            KV_EXPIRY_DEADLINE: "remote_blocks_expiry_time returned (D clock, float).",
        },
    },
    SPAN_AGENT_SESSION: {
        "kind": "INTERNAL",
        "emitter": "agent API / bench",
        "doc": "A whole agent session (gen_ai.operation.name=invoke_agent).",
        "attributes": {
            GEN_AI_OPERATION_NAME: f"`{OP_INVOKE_AGENT}`.",
            GEN_AI_AGENT_NAME: "Agent or scenario name.",
            SESSION_ID: "Session id.",
            GEN_AI_CONVERSATION_ID: "Same value.",
            AGENT_SCENARIO: "Bench scenario name, when driven by kvtrace bench.",
        },
    },
    SPAN_AGENT_TURN: {
        "kind": "INTERNAL",
        "emitter": "agent API / bench",
        "doc": "One turn of a session: LLM calls, tool waits and app work until the answer.",
        "attributes": {SESSION_ID: "Session id.", TURN_INDEX: "Turn index (int)."},
    },
    SPAN_AGENT_LLM_CALL: {
        "kind": "CLIENT",
        "emitter": "agent API / bench",
        "doc": "One call to the OpenAI-compatible endpoint (gen_ai.operation.name=chat).",
        "attributes": {
            **_ID,
            GEN_AI_OPERATION_NAME: f"`{OP_CHAT}` or `{OP_TEXT_COMPLETION}`.",
            GEN_AI_REQUEST_MODEL: "Model.",
            GEN_AI_USAGE_INPUT_TOKENS: "Prompt tokens (int), cached ones included.",
            GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: "Cached prompt tokens (int): local hit + pulled from the "
            "kv_transfer metadata, else usage.prompt_tokens_details.cached_tokens.",
            GEN_AI_USAGE_OUTPUT_TOKENS: "Completion tokens (int).",
            LLM_TTFT_MS: "Time to first token, ms (float).",
            LLM_TPOT_MS: "Time per output token after the first, ms (float).",
            KV_OUTCOME: "Decision outcome from the kv_transfer metadata.",
            KV_PULLED_TOKENS: "Pulled tokens from the kv_transfer metadata (int).",
            GEN_AI_INPUT_MESSAGES: "Prompt (only with KVTRACE_CAPTURE_CONTENT=1).",
            GEN_AI_OUTPUT_MESSAGES: "Completion (only with KVTRACE_CAPTURE_CONTENT=1).",
            ERROR_TYPE: "Error class when the call failed.",
        },
    },
    SPAN_AGENT_TOOL_CALL: {
        "kind": "INTERNAL",
        "emitter": "agent API / bench",
        "doc": "A tool call: the agent waits (gen_ai.operation.name=execute_tool).",
        "attributes": {
            GEN_AI_OPERATION_NAME: f"`{OP_EXECUTE_TOOL}`.",
            GEN_AI_TOOL_NAME: "Tool name.",
            GEN_AI_TOOL_CALL_ID: "Tool call id.",
            SESSION_ID: "Session id.",
            TURN_INDEX: "Turn index (int).",
            ERROR_TYPE: "Error class when the tool failed.",
        },
    },
    SPAN_AGENT_APP_WORK: {
        "kind": "INTERNAL",
        "emitter": "agent API / bench",
        "doc": "Explicit application work (parsing, planning, I/O) between calls.",
        "attributes": {
            AGENT_WORK_NAME: "What the work was.",
            SESSION_ID: "Session id.",
            TURN_INDEX: "Turn index (int).",
        },
    },
    SPAN_AGENT_USER_PAUSE: {
        "kind": "INTERNAL",
        "emitter": "agent API / bench",
        "doc": "The agent waits for its user (think time, an approval, a pause-resume gap): a part of its own in "
        "the session breakdown (`user_pause_ms`), so a user's pause is not read as slow app work.",
        "attributes": {
            AGENT_PAUSE_REASON: "Why the agent waits, when given (e.g. `think`, `approval`).",
            SESSION_ID: "Session id.",
            TURN_INDEX: "Turn index (int), when the pause is inside a turn.",
        },
    },
    SPAN_VLLM_LLM_REQUEST: {
        "kind": "SERVER",
        "emitter": "vLLM itself (--otlp-traces-endpoint), ingested by kvtrace collect",
        "doc": "vLLM's own per-request span; parent: the proxy leg's traceparent. kvtrace does not emit "
        "it; the vllm_requests view joins it to kvtrace's requests.",
        "attributes": {
            GEN_AI_REQUEST_ID: "vLLM's request id (contains the X-Request-Id).",
            GEN_AI_RESPONSE_MODEL: "Model served.",
            GEN_AI_USAGE_PROMPT_TOKENS: "Prompt tokens (int).",
            GEN_AI_USAGE_COMPLETION_TOKENS: "Generated tokens (int).",
            VLLM_LATENCY_TIME_IN_QUEUE: "Time waiting in the scheduler queue, s (float).",
            VLLM_LATENCY_TIME_TO_FIRST_TOKEN: "Time to first token, s (float).",
            VLLM_LATENCY_E2E: "Arrival to finish, s (float).",
            VLLM_LATENCY_TIME_IN_MODEL_PREFILL: "Prefill time, s (float).",
            VLLM_LATENCY_TIME_IN_MODEL_DECODE: "Decode time, s (float).",
            VLLM_LATENCY_TIME_IN_MODEL_INFERENCE: "Prefill + decode time, s (float).",
        },
    },
}

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
    SERVICE_NAME: "kvtrace-proxy, kvtrace-sim-prefill, kvtrace-sim-decode, vllm-prefill, vllm-decode, kvtrace-agent, kvtrace-bench.",
    SERVICE_INSTANCE_ID: "Unique per process.",
    HOST_NAME: "Host name.",
    SUBSTRATE: f"{SUBSTRATE_SIM} or {SUBSTRATE_VLLM} (connector / simulator processes).",
    ENGINE_ID: "vLLM engine id (connector / simulator processes).",
    ENGINE_ROLE: f"{', '.join(ROLES)} (connector / simulator processes).",
    SIM_TIME_SCALE: "Simulator time compression factor (float; 1.0 = real time).",
    SIM_PRESET: "Simulator cost-model preset.",
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
}

CONTEXT_FIELDS: dict[str, str] = {
    CTX_TRACEPARENT: "W3C traceparent of the proxy leg; the connector parents its spans on it.",
    CTX_SESSION_ID: "Conversation id.",
    CTX_TURN: "Turn index (int).",
}


def render_markdown() -> str:
    """docs/semconv.md, generated from the tables above."""
    out = ["# kvtrace span contract", "", "Generated by `python -m kvtrace.semconv`; do not edit.", ""]
    out += ["## GenAI conventions version", "", _genai_semconv_note, ""]
    out += ["## Resource attributes", "", "| attribute | meaning |", "|---|---|"]
    out += [f"| `{k}` | {v} |" for k, v in RESOURCE.items()]
    for name, spec in SPANS.items():
        out += [
            "",
            f"## Span `{name}`",
            "",
            f"Kind: {spec['kind']}. Emitted by: {spec['emitter']}.",
            "",
            spec["doc"],
            "",
        ]
        out += ["| attribute | meaning |", "|---|---|"]
        out += [f"| `{k}` | {v} |" for k, v in spec["attributes"].items()]
    for name, spec in EVENTS.items():
        out += ["", f"## Event `{name}`", "", f"On: {spec['on']}. {spec['doc']}", ""]
        if spec["attributes"]:
            out += ["| attribute | meaning |", "|---|---|"]
            out += [f"| `{k}` | {v} |" for k, v in spec["attributes"].items()]
    out += ["", f"## `{KV_PARAMS_KEY}` entry the proxy sends inside `kv_transfer_params`", ""]
    out += ["| field | meaning |", "|---|---|"]
    out += [f"| `{k}` | {v} |" for k, v in CONTEXT_FIELDS.items()]
    out += ["", f"## `{RESPONSE_KV_TRANSFER}` object in responses (and `{KV_PARAMS_KEY}` object from workers)", ""]
    out += [
        f"Non-streaming: a top-level `{RESPONSE_KV_TRANSFER}` field. Streaming: on the chunk carrying "
        "`finish_reason` (or the usage chunk when `include_usage` is on). Header: "
        f"`{HEADER_TRACE_ID}`.",
        "",
        "| field | meaning |",
        "|---|---|",
    ]
    out += [f"| `{k}` | {v} |" for k, v in KV_TRANSFER_FIELDS.items()]
    out += ["", "## Enumerations", "", "| set | values |", "|---|---|"]
    for label, values in (
        ("decision outcome", OUTCOMES),
        ("transfer direction", DIRECTIONS),
        ("transfer status", TRANSFER_STATUSES),
        ("retention outcome", RETENTION_OUTCOMES),
        ("engine role", ROLES),
        ("substrate", SUBSTRATES),
        ("proxy offer reason", OFFER_REASONS),
        ("session source", SESSION_SOURCES),
        ("session continuity", CONTINUITIES),
        ("proxy fallback", FALLBACKS),
        ("error.type set by kvtrace", ERROR_VALUES),
        ("gen_ai.operation.name", (OP_CHAT, OP_TEXT_COMPLETION, OP_EXECUTE_TOOL, OP_INVOKE_AGENT)),
    ):
        out.append(f"| {label} | {', '.join(f'`{v}`' for v in values)} |")
    out += ["", "## Wire names", "", "| name | value |", "|---|---|"]
    for const in (
        "KV_PARAMS_KEY",
        "RESPONSE_KV_TRANSFER",
        "HEADER_TRACE_ID",
        "HEADER_SESSION_ID",
        "HEADER_REQUEST_ID",
        "BODY_CONVERSATION_ID",
        "BODY_PROMPT_CACHE_KEY",
        "BAGGAGE_SESSION_ID",
        "PREFIX_SESSION_PREFIX",
    ):
        out.append(f"| {const} | `{globals()[const]}` |")
    return "\n".join(out) + "\n"


def render_metrics_markdown() -> str:
    """docs/metrics.md, generated from :data:`METRICS` (``python -m kvtrace.semconv metrics``)."""
    out = ["# kvtrace metrics", "", "Generated by `python -m kvtrace.semconv metrics`; do not edit.", ""]
    out += [
        "Prometheus text on `/metrics`: vLLM's own endpoint (connector), each `kvtrace sim` worker, "
        "`kvtrace proxy`. Counters are exposed with a `_total` suffix, histograms as `_bucket` / `_sum` / "
        "`_count`. Every label value comes from a fixed set (no request, session or engine ids): group "
        "by the Prometheus `instance` label to tell servers apart.",
        "",
    ]
    out += ["| metric | type | labels | emitted by | meaning |", "|---|---|---|---|---|"]
    for name, spec in METRICS.items():
        labels = ", ".join(f"`{lb}`" for lb in spec["labels"]) or "-"
        out.append(f"| `{name}` | {spec['type']} | {labels} | {spec['emitter']} | {spec['doc']} |")
    out += ["", "## Label values", "", "| label | values |", "|---|---|"]
    for label, values in LABEL_VALUES.items():
        out.append(f"| `{label}` | {', '.join(f'`{v}`' for v in values)} |")
    out += ["", f"Connector stats payload key (vLLM carries it from EngineCore to the API server): `{STATS_KEY}`."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":  # pragma: no cover
    import sys

    print(render_metrics_markdown() if sys.argv[1:] == ["metrics"] else render_markdown(), end="")
