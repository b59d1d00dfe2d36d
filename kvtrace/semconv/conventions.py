"""What the ecosystem's agent instrumentations emit, and which kvtrace role each span plays.

An agent already traced with the OpenTelemetry GenAI conventions, OpenInference (Arize Phoenix) or
OpenLLMetry (Traceloop) needs no kvtrace code: the breakdown views (:mod:`kvtrace.store.views`)
classify its spans with :data:`ROLE_RULES` and read its session ids, tokens and TTFT with the
attribute lists below.  Plain names and the tables built from them; docs/semconv.md renders them
("Agent spans by convention").  The names were read from the packages of :data:`COVERED_VERSIONS`.
"""

from __future__ import annotations

from kvtrace.semconv.names import (
    GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME,
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    GEN_AI_USAGE_COMPLETION_TOKENS,
    GEN_AI_USAGE_INPUT_TOKENS,
    GEN_AI_USAGE_OUTPUT_TOKENS,
    GEN_AI_USAGE_PROMPT_TOKENS,
    OP_CHAT,
    OP_EXECUTE_TOOL,
    OP_INVOKE_AGENT,
    OP_TEXT_COMPLETION,
    SESSION_ID,
    SPAN_AGENT_APP_WORK,
    SPAN_AGENT_LLM_CALL,
    SPAN_AGENT_SESSION,
    SPAN_AGENT_TOOL_CALL,
    SPAN_AGENT_TURN,
    SPAN_AGENT_USER_PAUSE,
)

_INTRO = (
    "An agent already traced with the OpenTelemetry GenAI conventions, OpenInference (Arize Phoenix), "
    "OpenLLMetry (Traceloop) or Langfuse needs no kvtrace code: the breakdown views classify its spans by the "
    "rules below and read its session ids, tokens and TTFT from the attributes listed, so `session_breakdown`, "
    "`turn_breakdown` and `agent_llm_calls` cover it as they cover kvtrace's own agent spans."
)
COVERED_VERSIONS = (
    ("OpenTelemetry GenAI semantic conventions", "opentelemetry-semantic-conventions 0.66b2 (schema 1.44.0)"),
    ("OpenInference", "openinference-semantic-conventions 0.1.42"),
    ("OpenLLMetry (Traceloop)", "opentelemetry-semantic-conventions-ai 0.5.1"),
    ("Langfuse", "the `langfuse.session.id` span attribute (Langfuse's OTel ingestion)"),
)

# --------------------------------------------------------------------------------------------
# kvtrace's roles (the `role` column of the agent-span views)
# --------------------------------------------------------------------------------------------
ROLE_SESSION = "session"  # kvtrace's own session span: the session window
ROLE_TURN = "turn"  # kvtrace's own turn span: one turn window
ROLE_AGENT = "agent"  # one agent run (or a workflow / graph around it): a turn is a trace's outermost ones
ROLE_LLM_CALL = "llm_call"
ROLE_TOOL_WAIT = "tool_wait"
ROLE_APP_WORK = "app_work"
ROLE_USER_PAUSE = "user_pause"
AGENT_ROLES = (ROLE_SESSION, ROLE_TURN, ROLE_AGENT, ROLE_LLM_CALL, ROLE_TOOL_WAIT, ROLE_APP_WORK, ROLE_USER_PAUSE)

ROLE_MEANINGS = {
    ROLE_SESSION: "The session window (kvtrace's own session span only).",
    ROLE_TURN: "One turn window (kvtrace's own turn span only).",
    ROLE_AGENT: "An agent run, a workflow or a graph: a trace's outermost such spans are one turn, their "
    "extent its window; inside them, time no LLM call or tool covers is app work. Nested agent spans "
    "count once.",
    ROLE_LLM_CALL: "A model call: input processing until its first token, generation after.",
    ROLE_TOOL_WAIT: "A tool execution the agent waits for.",
    ROLE_APP_WORK: "The agent's own work (tasks, retrieval, embeddings, guardrails, agent setup).",
    ROLE_USER_PAUSE: "The agent waits for its user (kvtrace's own span only: no convention has one).",
}

# --------------------------------------------------------------------------------------------
# Names of the other conventions (what their instrumentations put on spans)
# --------------------------------------------------------------------------------------------
# OTel GenAI: operation names besides chat / text_completion / execute_tool / invoke_agent
OP_GENERATE_CONTENT = "generate_content"
OP_CREATE_AGENT = "create_agent"
OP_INVOKE_WORKFLOW = "invoke_workflow"
OP_EMBEDDINGS = "embeddings"
OP_RETRIEVAL = "retrieval"
OP_EXECUTE_TASK = "execute_task"  # OpenLLMetry's extension (GenAICustomOperationName); kvtrace's app work
OP_USER_PAUSE = "user_pause"  # kvtrace's own value on its user-pause spans (no convention has one)

# OpenInference (openinference.semconv.trace)
OPENINFERENCE_SPAN_KIND = "openinference.span.kind"
OI_LLM, OI_TOOL, OI_AGENT, OI_CHAIN = "LLM", "TOOL", "AGENT", "CHAIN"
OI_RETRIEVER, OI_EMBEDDING, OI_RERANKER, OI_GUARDRAIL = "RETRIEVER", "EMBEDDING", "RERANKER", "GUARDRAIL"
OI_EVALUATOR, OI_PROMPT, OI_DECISION, OI_UNKNOWN = "EVALUATOR", "PROMPT", "DECISION", "UNKNOWN"
OI_LLM_TOKEN_COUNT_PROMPT = "llm.token_count.prompt"
OI_LLM_TOKEN_COUNT_COMPLETION = "llm.token_count.completion"
OI_LLM_TOKEN_COUNT_CACHE_READ = "llm.token_count.prompt_details.cache_read"
OI_LLM_MODEL_NAME = "llm.model_name"
OI_TOOL_NAME = "tool.name"
OI_AGENT_NAME = "agent.name"

# OpenLLMetry (opentelemetry.semconv_ai)
TRACELOOP_SPAN_KIND = "traceloop.span.kind"
TL_WORKFLOW, TL_TASK, TL_AGENT, TL_TOOL, TL_UNKNOWN = "workflow", "task", "agent", "tool", "unknown"
TRACELOOP_ENTITY_NAME = "traceloop.entity.name"
TRACELOOP_SESSION_ID = "traceloop.association.properties.session_id"  # Traceloop.set_association_properties
LLM_REQUEST_TYPE = "llm.request.type"  # OpenLLMetry's LLM spans: chat, completion, embedding, rerank
LLM_REQUEST_COMPLETION, LLM_REQUEST_EMBEDDING, LLM_REQUEST_RERANK = "completion", "embedding", "rerank"
TL_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read_input_tokens"  # before semconv-ai 0.5.0

# Langfuse
LANGFUSE_SESSION_ID = "langfuse.session.id"

# --------------------------------------------------------------------------------------------
# The mapping
# --------------------------------------------------------------------------------------------
ROLE_BY_SPAN_NAME = {
    SPAN_AGENT_SESSION: ROLE_SESSION,
    SPAN_AGENT_TURN: ROLE_TURN,
    SPAN_AGENT_LLM_CALL: ROLE_LLM_CALL,
    SPAN_AGENT_TOOL_CALL: ROLE_TOOL_WAIT,
    SPAN_AGENT_APP_WORK: ROLE_APP_WORK,
    SPAN_AGENT_USER_PAUSE: ROLE_USER_PAUSE,
}
"""kvtrace's own agent spans, by name (they win over their attributes)."""

CONV_GENAI, CONV_OPENINFERENCE, CONV_OPENLLMETRY, CONV_KVTRACE = "genai", "openinference", "openllmetry", "kvtrace"
CONVENTIONS = (CONV_KVTRACE, CONV_GENAI, CONV_OPENINFERENCE, CONV_OPENLLMETRY)

ROLE_RULES: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    (CONV_GENAI, GEN_AI_OPERATION_NAME, (OP_CHAT, OP_TEXT_COMPLETION, OP_GENERATE_CONTENT), ROLE_LLM_CALL),
    (CONV_GENAI, GEN_AI_OPERATION_NAME, (OP_EXECUTE_TOOL,), ROLE_TOOL_WAIT),
    (CONV_GENAI, GEN_AI_OPERATION_NAME, (OP_INVOKE_AGENT, OP_INVOKE_WORKFLOW), ROLE_AGENT),
    (CONV_GENAI, GEN_AI_OPERATION_NAME, (OP_CREATE_AGENT, OP_EMBEDDINGS, OP_RETRIEVAL, OP_EXECUTE_TASK), ROLE_APP_WORK),
    (CONV_OPENINFERENCE, OPENINFERENCE_SPAN_KIND, (OI_LLM,), ROLE_LLM_CALL),
    (CONV_OPENINFERENCE, OPENINFERENCE_SPAN_KIND, (OI_TOOL,), ROLE_TOOL_WAIT),
    (CONV_OPENINFERENCE, OPENINFERENCE_SPAN_KIND, (OI_AGENT, OI_CHAIN), ROLE_AGENT),
    (
        CONV_OPENINFERENCE,
        OPENINFERENCE_SPAN_KIND,
        (OI_RETRIEVER, OI_EMBEDDING, OI_RERANKER, OI_GUARDRAIL, OI_EVALUATOR, OI_PROMPT, OI_DECISION),
        ROLE_APP_WORK,
    ),
    (CONV_OPENLLMETRY, TRACELOOP_SPAN_KIND, (TL_WORKFLOW, TL_AGENT), ROLE_AGENT),
    (CONV_OPENLLMETRY, TRACELOOP_SPAN_KIND, (TL_TOOL,), ROLE_TOOL_WAIT),
    (CONV_OPENLLMETRY, TRACELOOP_SPAN_KIND, (TL_TASK,), ROLE_APP_WORK),
    (CONV_OPENLLMETRY, LLM_REQUEST_TYPE, (OP_CHAT, LLM_REQUEST_COMPLETION), ROLE_LLM_CALL),
    (CONV_OPENLLMETRY, LLM_REQUEST_TYPE, (LLM_REQUEST_EMBEDDING, LLM_REQUEST_RERANK), ROLE_APP_WORK),
)
_RULES_NOTE = """A span carrying several conventions' attributes takes the first rule it matches. A span
with one of these attributes but none of the values (`UNKNOWN`, `unknown`, a custom operation) is
seen but not placed: its session is flagged (`unplaced_spans` of `session_breakdown`) and
`kvtrace doctor --traces DIR` lists it."""

CLASSIFYING_ATTRIBUTES = tuple(dict.fromkeys(rule[1] for rule in ROLE_RULES))
"""The attributes that make a span an agent-side span of some convention."""

SESSION_ATTRIBUTES = (SESSION_ID, GEN_AI_CONVERSATION_ID, LANGFUSE_SESSION_ID, TRACELOOP_SESSION_ID)
"""Where an agent-side span names its session, first present wins (OpenInference's ``session.id``
is the same key as kvtrace's).  The first one found on a trace's agent-side spans is the session
of every span of that trace."""

INPUT_TOKEN_ATTRIBUTES = (GEN_AI_USAGE_INPUT_TOKENS, OI_LLM_TOKEN_COUNT_PROMPT, GEN_AI_USAGE_PROMPT_TOKENS)
OUTPUT_TOKEN_ATTRIBUTES = (GEN_AI_USAGE_OUTPUT_TOKENS, OI_LLM_TOKEN_COUNT_COMPLETION, GEN_AI_USAGE_COMPLETION_TOKENS)
CACHED_TOKEN_ATTRIBUTES = (
    GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    OI_LLM_TOKEN_COUNT_CACHE_READ,
    TL_USAGE_CACHE_READ_INPUT_TOKENS,
)
"""Token counts of a foreign LLM span, first present wins; absent ones come from the joined proxy
request."""

# how an agent-side LLM call found its proxy request (the `join` column)
JOIN_TRACE = "trace"  # the request is in the LLM call's trace (W3C context propagated)
JOIN_SESSION_TIME = "session_time"  # context link broken: the request's trace has no agent span; matched in time
JOIN_NONE = "none"  # no request found
JOINS = (JOIN_TRACE, JOIN_SESSION_TIME, JOIN_NONE)
JOIN_MEANINGS = {
    JOIN_TRACE: "the proxy request is in the LLM call's trace and overlaps it (W3C context propagated).",
    JOIN_SESSION_TIME: "the context link is broken (e.g. LangGraph + OpenInference: the HTTP spans are "
    "roots): the request's trace holds no agent span; it is the request overlapping the call longest, "
    "one with the call's session id first.",
    JOIN_NONE: "no proxy request overlaps the call.",
}
