"""Every name of the span contract: span, event and attribute names, enumerated values and wire
keys (the metric and label names are in :mod:`.metrics`).  Plain string constants only: what they
mean is in :mod:`.spec`."""

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

KVTRACE_SPAN_PREFIX = "kvtrace."  # every span kvtrace emits is named so; the others are classified by attribute

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
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"  # seconds (double)
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
PROVIDER_VLLM = "vllm"  # gen_ai.provider.name of kvtrace's LLM calls (an OpenAI-compatible vLLM endpoint)
TOOL_TYPE_FUNCTION = "function"  # gen_ai.tool.type of kvtrace's tool calls

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
PROXY_DECODE_PARAMS_INVALID = "kvtrace.proxy.decode_params_invalid"  # str: why D's kv_transfer_params were not kept
PROXY_ENTRY_AGE_S = "kvtrace.proxy.entry_age_s"
PROXY_CONVERSATION_TTL_S = "kvtrace.proxy.conversation_ttl_s"
PROXY_FALLBACK = "kvtrace.proxy.fallback"
PROXY_PREFILL_ENDPOINT = "kvtrace.proxy.prefill_endpoint"
PROXY_DECODE_ENDPOINT = "kvtrace.proxy.decode_endpoint"
PROXY_PREFILL_ATTEMPTS = "kvtrace.proxy.prefill_attempts"  # int: P legs, when more than one
PROXY_DECODE_ATTEMPTS = "kvtrace.proxy.decode_attempts"  # int: D legs, when more than one (failover)
PROXY_RETRY = "kvtrace.proxy.retry"  # bool on a P leg: the fresh prefill after a failed read of the offer
PROXY_FAILOVER = "kvtrace.proxy.failover"  # bool on a leg: sent to another worker, the last one unreachable
PROXY_UNREACHABLE = "kvtrace.proxy.unreachable"  # bool on a failed leg: its worker never got the request
PROXY_DECODER_KV_TTL_S = "kvtrace.proxy.decoder_kv_ttl_s"  # float: D's retention as the proxy knows it
PROXY_POOL_WAIT_MS = "kvtrace.proxy.pool_wait_ms"  # float on a leg: time queued for a connection to the worker

# routing in a fleet (proxy request span, when a role has more than one worker: kvtrace.routing)
ROUTE_POLICY = "kvtrace.route.policy"  # the proxy's --routing
ROUTE_PREFILL_REASON = "kvtrace.route.prefill_reason"  # why this P (ROUTE_REASONS)
ROUTE_DECODE_REASON = "kvtrace.route.decode_reason"  # why this D
ROUTING_ROUND_ROBIN = "round-robin"
ROUTING_LEAST_LOADED = "least-loaded"
ROUTING_SESSION_AFFINE = "session-affine"
ROUTING_KV_AWARE = "kv-aware"
ROUTING_POLICIES = (ROUTING_ROUND_ROBIN, ROUTING_LEAST_LOADED, ROUTING_SESSION_AFFINE, ROUTING_KV_AWARE)
ROUTE_ROTATION = "rotation"  # round-robin's turn
ROUTE_LEAST_LOADED = "least_loaded"  # the fewest requests in flight (ties in rotation)
ROUTE_HOLDER = "holder"  # D: it holds the session's blocks
ROUTE_LAST_PREFILL = "last_prefill"  # P: it prefilled the session's last turn
ROUTE_FAILOVER = "failover"  # the worker chosen first (or the session's own) could not be reached
ROUTE_REASONS = (ROUTE_ROTATION, ROUTE_LEAST_LOADED, ROUTE_HOLDER, ROUTE_LAST_PREFILL, ROUTE_FAILOVER)

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
SIM_CLOCK = "kvtrace.sim.clock"  # resource attribute: the simulator's clock, CLOCKS
ENGINE_PREFIX_CACHING = "kvtrace.engine.prefix_caching"  # bool resource attribute: vLLM's enable_prefix_caching
KV_BIDIRECTIONAL = "kvtrace.kv.bidirectional"  # bool resource attribute: bidirectional_kv_xfer
ENGINE_KV_POOL_BYTES = "kvtrace.engine.kv_pool_bytes"
# the engine's waiting queue for KV blocks (simulator; vLLM's own span has gen_ai.latency.time_in_queue)
ENGINE_QUEUE_WAIT_MS = "kvtrace.engine.queue.wait_ms"  # float: arrival to its KV blocks allocated
ENGINE_QUEUE_REASON = "kvtrace.engine.queue.reason"  # why it waited: kv_held | kv_in_use | fcfs
ENGINE_QUEUE_BLOCKS_NEEDED = "kvtrace.engine.queue.blocks_needed"  # int: new blocks it needed
ENGINE_QUEUE_BLOCKS_FREE = "kvtrace.engine.queue.blocks_free"  # int: free + evictable blocks when it began waiting
ENGINE_QUEUE_BLOCKS_HELD = "kvtrace.engine.queue.blocks_held"  # int: blocks held only for a remote reader then
ENGINE_QUEUE_FREED_BY = "kvtrace.engine.queue.freed_by"  # what last returned blocks before it got in

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
# verification of the offered KV against the prompt (d2p, P): kvtrace.kvdigest
KV_VERIFIED = "kvtrace.kv.verified"  # match / mismatch / unverifiable
KV_VERIFY_MODE = "kvtrace.kv.verify.mode"  # record / enforce
KV_VERIFIED_TOKENS = "kvtrace.kv.verify.verified_tokens"  # int: prompt tokens proven equal to D's
KV_VERIFY_MISMATCH_TOKEN = "kvtrace.kv.verify.first_mismatch_token"  # int: start of the first differing chunk
KV_VERIFY_WRONG_TOKENS = "kvtrace.kv.verify.wrong_tokens"  # int: tokens vLLM's rule would load from other tokens

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
OUTCOME_UNVERIFIED = "unverified"  # verify=enforce: the offer's unverified tokens were recomputed
OUTCOMES = (
    OUTCOME_PULLED,
    OUTCOME_BELOW_THRESHOLD,
    OUTCOME_EXPIRED,
    OUTCOME_NO_REMOTE,
    OUTCOME_LOCAL_HIT,
    OUTCOME_FAILED,
    OUTCOME_UNVERIFIED,
)
VERIFIED_MATCH = "match"
VERIFIED_MISMATCH = "mismatch"
VERIFIED_UNVERIFIABLE = "unverifiable"
VERIFIED_VALUES = (VERIFIED_MATCH, VERIFIED_MISMATCH, VERIFIED_UNVERIFIABLE)
VERIFY_RECORD = "record"
VERIFY_ENFORCE = "enforce"
VERIFY_MODES = (VERIFY_RECORD, VERIFY_ENFORCE)

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

QUEUE_KV_HELD = "kv_held"  # it would fit if the blocks held for remote readers (retention, lease) were freed
QUEUE_KV_IN_USE = "kv_in_use"  # it would not fit even then: running requests hold the blocks
QUEUE_FCFS = "fcfs"  # it fits, but an earlier request waits for blocks (vLLM admits in order)
QUEUE_REASONS = (QUEUE_KV_HELD, QUEUE_KV_IN_USE, QUEUE_FCFS)
FREED_FINISHED = "finished"  # a request finished (or failed) and freed its blocks
QUEUE_FREED_BY = (RETENTION_READ, RETENTION_EXPIRED, RETENTION_RELEASED, FREED_FINISHED)

SUBSTRATE_SIM = "sim"
SUBSTRATE_VLLM = "vllm"
SUBSTRATES = (SUBSTRATE_SIM, SUBSTRATE_VLLM)

CLOCK_WALL = "wall"  # served workers sleeping in wall time: the host's timestamps
CLOCK_VIRTUAL = "virtual"  # kvtrace.sim.virtual's event loop: simulated timestamps
CLOCKS = (CLOCK_WALL, CLOCK_VIRTUAL)

OFFER_OFFERED = "offered"
OFFER_NO_CONVERSATION_ID = "no_conversation_id"
OFFER_NO_ENTRY = "no_entry"
OFFER_ENTRY_TOO_OLD = "entry_too_old"
OFFER_DISABLED = "disabled"
OFFER_DIVERGED = "diverged"  # the prompt no longer extends what D holds: its blocks would be wrong KV
OFFER_REUSED_ID = "reused_id"  # the session id now names another conversation: D's blocks are not its KV
OFFER_HISTORY_UNKNOWN = "history_unknown"  # the proxy cannot check D's blocks against the prompt
OFFER_HOLDER_DOWN = "holder_down"  # the D holding the blocks could not be reached lately: P could not pull them
OFFER_REASONS = (
    OFFER_OFFERED,
    OFFER_NO_CONVERSATION_ID,
    OFFER_NO_ENTRY,
    OFFER_ENTRY_TOO_OLD,
    OFFER_DISABLED,
    OFFER_DIVERGED,
    OFFER_REUSED_ID,
    OFFER_HISTORY_UNKNOWN,
    OFFER_HOLDER_DOWN,
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
CONTINUITY_REUSED_ID = "reused_id"  # nothing in common with the served turn: another conversation under its id
CONTINUITY_UNKNOWN = "unknown"  # goes past a served request whose reply the proxy could not read
CONTINUITIES = (CONTINUITY_EXTENDS, CONTINUITY_DIVERGED, CONTINUITY_NEW, CONTINUITY_REUSED_ID, CONTINUITY_UNKNOWN)

# error.type values kvtrace itself sets (otherwise: the exception class or the worker's error type)
ERROR_STREAM_INTERRUPTED = "stream_interrupted"  # agent: the stream was closed before its end
ERROR_CLIENT_DISCONNECT = "client_disconnect"  # proxy / sim: the client went away
ERROR_INVALID_CHUNK = "invalid_chunk"  # proxy: D sent a stream line that is not an OpenAI chunk
ERROR_INCOMPLETE_STREAM = "incomplete_stream"  # proxy: D's stream ended without [DONE]
ERROR_INVALID_RESPONSE = "invalid_response"  # proxy: P's answer is not a JSON object
ERROR_RESPONSE_TOO_LARGE = "response_too_large"  # proxy: a worker's response passed --max-upstream-bytes
ERROR_DEADLINE_EXCEEDED = "deadline_exceeded"  # proxy: the request passed --request-timeout
ERROR_POOL_FULL = "pool_full"  # proxy: a worker's connection queue was full (503 with Retry-After)
ERROR_VALUES = (
    ERROR_STREAM_INTERRUPTED,
    ERROR_CLIENT_DISCONNECT,
    ERROR_INVALID_CHUNK,
    ERROR_INCOMPLETE_STREAM,
    ERROR_INVALID_RESPONSE,
    ERROR_RESPONSE_TOO_LARGE,
    ERROR_DEADLINE_EXCEEDED,
    ERROR_POOL_FULL,
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
KVT_VERIFIED = "verified"  # P: the kvtrace.kv.verified of its decision
KVT_DIGEST = "kv_digest"  # D: the keyed digest of the tokens its retained blocks hold (kvtrace.kvdigest)
# fields of the kv_digest object
DIGEST_VERSION = "v"
DIGEST_CHUNK = "chunk"
DIGEST_TOKENS = "n"
DIGEST_TAGS = "tags"
DIGEST_FINGERPRINT = "fp"  # v2: the keyed hash of the block-hash configuration (kvtrace.kvdigest.block_config)
