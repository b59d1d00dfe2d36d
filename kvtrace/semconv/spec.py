"""What every name of the span contract means: the documented spans (:data:`SPANS`), and from
:mod:`.fields` the events, resource attributes and wire fields (:data:`EVENTS`, :data:`RESOURCE`,
:data:`KV_TRANSFER_FIELDS`, :data:`CONTEXT_FIELDS`); the metrics are in :mod:`.metrics`.
:mod:`.render` turns them into docs/semconv.md and docs/metrics.md."""

from __future__ import annotations

from kvtrace.semconv.conventions import (
    OI_AGENT,
    OI_CHAIN,
    OI_LLM,
    OI_TOOL,
    OP_EXECUTE_TASK,
    OP_USER_PAUSE,
    OPENINFERENCE_SPAN_KIND,
)
from kvtrace.semconv.fields import *  # noqa: F403  (EVENTS, RESOURCE, the wire fields: re-exported beside SPANS)
from kvtrace.semconv.names import *  # noqa: F403
from kvtrace.semconv.names import GENAI_SEMCONV_VERSION

_genai_semconv_note = (
    "The `gen_ai.*` names follow the OpenTelemetry GenAI semantic conventions as released in "
    f"semantic-conventions `{GENAI_SEMCONV_VERSION}` (schema https://opentelemetry.io/schemas/{GENAI_SEMCONV_VERSION}, "
    "Python package opentelemetry-semantic-conventions 0.66b2), status Development; they have since moved, "
    "unchanged and still unreleased, to the open-telemetry/semantic-conventions-genai repository. "
    "`gen_ai.usage.cache_read.input_tokens` is included in `gen_ai.usage.input_tokens` (the total), as the "
    "conventions specify. vLLM's own `llm_request` span still uses the older `gen_ai.usage.prompt_tokens` / "
    "`gen_ai.usage.completion_tokens`."
)

# --------------------------------------------------------------------------------------------
# The documented contract (drives docs/semconv.md and the documentation test)
# --------------------------------------------------------------------------------------------
_ID = {
    SESSION_ID: "Conversation / agent session id (same value as gen_ai.conversation.id); printable UTF-8 text "
    "of at most 256 bytes, whatever carried it (kvtrace.semconv.ids: the proxy answers another with a 400, "
    "the agent API replaces it and the collector drops it, counting them).",
    GEN_AI_CONVERSATION_ID: "Conversation id (OTel GenAI).",
    TURN_INDEX: "0-based turn index within the session (int).",
    GEN_AI_REQUEST_ID: "The X-Request-Id shared by the proxy, P and D (vLLM's request id base).",
}
_ENGINE = {
    ENGINE_ID: "vLLM engine id of the emitting worker.",
    ENGINE_ROLE: f"Role of the emitting worker: {', '.join(ROLES)}.",
}

_QUEUE = {
    ENGINE_QUEUE_WAIT_MS: "Simulator, only when the request waited: time from arrival until its KV blocks were "
    "allocated, ms (float; wall, like the span; model ms = x kvtrace.sim.time_scale). vLLM's scheduler keeps a "
    "request that does not fit in its waiting queue and admits in order; blocks held for a remote reader "
    "(D's retention, P's lease) are never evicted, so a pool full of them shows here and in TTFT.",
    ENGINE_QUEUE_REASON: f"Why it waited, when it began: `{QUEUE_KV_HELD}` (it would fit if the blocks held for "
    f"remote readers were freed), `{QUEUE_KV_IN_USE}` (running requests' blocks), `{QUEUE_FCFS}` (it fits, "
    "but an earlier request waits).",
    ENGINE_QUEUE_BLOCKS_NEEDED: "New blocks it needed (prompt + max_tokens, less the local prefix hit; int).",
    ENGINE_QUEUE_BLOCKS_FREE: "Free + evictable blocks when it began waiting (int).",
    ENGINE_QUEUE_BLOCKS_HELD: "Blocks then held only for a remote reader (int): what a pull, a notification or the "
    "TTL would return.",
    ENGINE_QUEUE_FREED_BY: f"What last returned blocks before it got in: `{RETENTION_READ}`, `{RETENTION_EXPIRED}`, "
    f"`{RETENTION_RELEASED}` (a hold ended so) or `{FREED_FINISHED}` (a request finished).",
}

_FAILOVER = (
    "This leg went to another worker of its role because the last one it was sent to could not be reached "
    "(its connection failed: that worker never got the request) (bool)."
)
_UNREACHABLE = (
    "The leg failed before its worker got the request: the connection was refused, timed out or closed "
    "before the request went out (bool); the proxy took the worker out of the routing for --worker-cooldown."
)
_POOL_WAIT = (
    "Time the leg waited for one of the worker's --max-worker-connections, ms (float); absent when one was "
    "free. The leg's span includes it; the connect timeout does not."
)

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
            SESSION_CONTINUITY: f"Requests of a session with prefix matching on: {', '.join(CONTINUITIES)} against "
            "the session's last served turn: its prompt (chat: the messages, and the model, tools, chat template "
            "and its kwargs; completions: the text or token ids) plus the reply the proxy streamed. "
            f"`{CONTINUITY_REUSED_ID}`: nothing in common from the first message (or another kind of request): "
            f"another conversation under the id; `{CONTINUITY_UNKNOWN}`: the turn goes past a request whose reply "
            "the proxy could not read (n > 1, token-id prompts, an unreadable stream). Only `extends` is offered.",
            SESSION_DIVERGED_AT: "When diverged or reused_id: index of the first position that differs from the last "
            "served turn (int): a message; a completions prompt's part (0: up to the end of the first served "
            "prompt, then each reply and prompt after it); 0 also when the model, tools or template changed.",
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
            PROXY_OFFER_REASON: f"Why: {', '.join(OFFER_REASONS)}. `{OFFER_HISTORY_UNKNOWN}`: D's blocks are of "
            "another turn than the session's record (the record was evicted, or a turn finished out of order), "
            "or the continuity is unknown: the proxy cannot check them against the prompt. "
            f"`{OFFER_HOLDER_DOWN}`: the D holding them could not be reached lately (--worker-cooldown), "
            "so P could not pull them.",
            PROXY_DECODE_PARAMS_INVALID: "D's final kv_transfer_params were not kept for the next turn (not offered): "
            "what was wrong (a field of the wrong type or out of bounds, a non-finite number, a block list longer "
            "than D's tokens).",
            PROXY_ENTRY_AGE_S: "Age of the conversation-table entry when offered, s (float).",
            PROXY_CONVERSATION_TTL_S: "The proxy's --conversation-ttl: it offers D's blocks while their entry is at "
            "most this old, s of the proxy's clock (float).",
            PROXY_FALLBACK: f"Fault handling applied: {', '.join(FALLBACKS)}.",
            PROXY_PREFILL_ENDPOINT: "P worker base URL chosen.",
            PROXY_DECODE_ENDPOINT: "D worker base URL chosen.",
            ROUTE_POLICY: f"The proxy's routing policy ({', '.join(ROUTING_POLICIES)}); set when it had more than "
            "one P or D to choose from.",
            ROUTE_PREFILL_REASON: f"Why this P ({', '.join(ROUTE_REASONS)}); with the policy.",
            ROUTE_DECODE_REASON: f"Why this D ({', '.join(ROUTE_REASONS)}); with the policy.",
            PROXY_PREFILL_ATTEMPTS: "P legs sent (int), absent when 1: one more when P failed (5xx) to read the "
            "offered blocks and the proxy asked again without them, and one more for each P that could not be "
            "reached (the leg went on to another P).",
            PROXY_DECODE_ATTEMPTS: "D legs sent (int), absent when 1: one more for each D that could not be "
            "reached (the leg went on to another D).",
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
            PROXY_PREFILL_ENDPOINT: "Base URL of this leg's P worker (the request span names its last leg's).",
            HTTP_RESPONSE_STATUS_CODE: "P's status (int).",
            PROXY_OFFER: "kv_transfer_params with D's blocks were sent (bool).",
            PROXY_RETRY: "This leg is the fresh prefill (no offer) after P failed to read the offered blocks (bool).",
            PROXY_FAILOVER: _FAILOVER,
            PROXY_UNREACHABLE: _UNREACHABLE,
            PROXY_POOL_WAIT_MS: _POOL_WAIT,
            ERROR_TYPE: f"Error class when the leg failed; `{ERROR_POOL_FULL}` when P's connection queue was full.",
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
            PROXY_DECODE_ENDPOINT: "Base URL of this leg's D worker (the request span names its last leg's).",
            HTTP_RESPONSE_STATUS_CODE: "D's status (int).",
            REQUEST_TTFT_MS: "The request's time to first token at the proxy (from the request's start, as on "
            "the request span), ms (float).",
            PROXY_FAILOVER: _FAILOVER,
            PROXY_UNREACHABLE: _UNREACHABLE,
            PROXY_POOL_WAIT_MS: _POOL_WAIT,
            ERROR_TYPE: f"Error class when the leg failed; `{ERROR_POOL_FULL}` when D's connection queue was full.",
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
            **_QUEUE,
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
            **_QUEUE,
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
            KV_VERIFIED: f"d2p decisions with D's blocks offered: whether the offer's `{KVT_DIGEST}` (D's keyed "
            f"digest of the tokens its blocks hold) proves they are this prompt's: {VERIFIED_MATCH}, "
            f"{VERIFIED_MISMATCH} (a chunk differs), {VERIFIED_UNVERIFIABLE} (the offer has no valid digest).",
            KV_VERIFY_MODE: f"The connector's `verify` setting: `{VERIFY_RECORD}` (record only; vLLM's rule decides) "
            f"or `{VERIFY_ENFORCE}` (P loads only the verified prefix, else `{OUTCOME_UNVERIFIED}`).",
            KV_VERIFIED_TOKENS: "Prompt tokens proven equal to the tokens D's blocks hold (int; whole digest chunks, "
            "or D's whole sequence).",
            KV_VERIFY_MISMATCH_TOKEN: f"When {VERIFIED_MISMATCH}: index of the first prompt token not proven equal, "
            "the start of the first digest chunk that differs; the first differing token lies in the chunk it "
            "starts (64 tokens; int).",
            KV_VERIFY_WRONG_TOKENS: f"When {VERIFIED_MISMATCH}: tokens vLLM's rule loads (or, under "
            f"{VERIFY_ENFORCE}, would have loaded) from KV of other tokens: min(D's tokens, prompt) - "
            "max(verified, local hit), 0 when that rule loads nothing (int).",
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
            OPENINFERENCE_SPAN_KIND: f"`{OI_AGENT}` (Phoenix and Langfuse show it natively).",
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
        "attributes": {
            GEN_AI_OPERATION_NAME: f"`{OP_INVOKE_AGENT}` (one agent run).",
            OPENINFERENCE_SPAN_KIND: f"`{OI_CHAIN}`.",
            GEN_AI_AGENT_NAME: "Agent name.",
            SESSION_ID: "Session id.",
            GEN_AI_CONVERSATION_ID: "Same value.",
            TURN_INDEX: "Turn index (int).",
        },
    },
    SPAN_AGENT_LLM_CALL: {
        "kind": "CLIENT",
        "emitter": "agent API / bench",
        "doc": "One call to the OpenAI-compatible endpoint (gen_ai.operation.name=chat).",
        "attributes": {
            **_ID,
            GEN_AI_OPERATION_NAME: f"`{OP_CHAT}` or `{OP_TEXT_COMPLETION}`.",
            OPENINFERENCE_SPAN_KIND: f"`{OI_LLM}`.",
            GEN_AI_PROVIDER_NAME: f"`{PROVIDER_VLLM}`.",
            GEN_AI_REQUEST_MODEL: "Model.",
            GEN_AI_USAGE_INPUT_TOKENS: "Prompt tokens (int), cached ones included.",
            GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: "Cached prompt tokens (int): local hit + pulled from the "
            "kv_transfer metadata, else usage.prompt_tokens_details.cached_tokens.",
            GEN_AI_USAGE_OUTPUT_TOKENS: "Completion tokens (int).",
            LLM_TTFT_MS: "Time to first token, ms (float).",
            GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: "The same, s (float; the GenAI conventions' unit).",
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
            OPENINFERENCE_SPAN_KIND: f"`{OI_TOOL}`.",
            GEN_AI_TOOL_NAME: "Tool name.",
            GEN_AI_TOOL_TYPE: f"`{TOOL_TYPE_FUNCTION}`.",
            GEN_AI_TOOL_CALL_ID: "Tool call id.",
            SESSION_ID: "Session id.",
            GEN_AI_CONVERSATION_ID: "Same value.",
            TURN_INDEX: "Turn index (int).",
            ERROR_TYPE: "Error class when the tool failed.",
        },
    },
    SPAN_AGENT_APP_WORK: {
        "kind": "INTERNAL",
        "emitter": "agent API / bench",
        "doc": "Explicit application work (parsing, planning, I/O) between calls.",
        "attributes": {
            GEN_AI_OPERATION_NAME: f"`{OP_EXECUTE_TASK}` (OpenLLMetry's extension of the GenAI operations).",
            OPENINFERENCE_SPAN_KIND: f"`{OI_CHAIN}`.",
            AGENT_WORK_NAME: "What the work was.",
            SESSION_ID: "Session id.",
            GEN_AI_CONVERSATION_ID: "Same value.",
            TURN_INDEX: "Turn index (int).",
        },
    },
    SPAN_AGENT_USER_PAUSE: {
        "kind": "INTERNAL",
        "emitter": "agent API / bench",
        "doc": "The agent waits for its user (think time, an approval, a pause-resume gap): a part of its own in "
        "the session breakdown (`user_pause_ms`), so a user's pause is not read as slow app work.",
        "attributes": {
            GEN_AI_OPERATION_NAME: f"`{OP_USER_PAUSE}` (kvtrace's own value: no convention has one).",
            OPENINFERENCE_SPAN_KIND: f"`{OI_CHAIN}`.",
            AGENT_PAUSE_REASON: "Why the agent waits, when given (e.g. `think`, `approval`).",
            SESSION_ID: "Session id.",
            GEN_AI_CONVERSATION_ID: "Same value.",
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
