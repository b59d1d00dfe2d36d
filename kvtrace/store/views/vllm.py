"""DuckDB view ``vllm_requests``: vLLM's own ``llm_request`` spans beside kvtrace's requests.

vLLM started with ``--otlp-traces-endpoint`` emits one SERVER span ``llm_request`` per request,
parented on the incoming ``traceparent`` (the proxy's P or D leg) and carrying
``gen_ai.request.id`` and its queue / prefill / decode timings.  Sent to ``kvtrace collect``, those
spans land in the same Parquet store; this view joins each to the kvtrace proxy request it served:

1. by parent link: ``llm_request.parent_span_id`` = a proxy leg span (``kvtrace.proxy.prefill`` /
   ``kvtrace.proxy.decode``) of the same trace, whose parent is the ``requests`` row
   (``matched_by = 'parent'``, ``leg`` = prefill/decode);
2. else by request id: vLLM's request id contains the X-Request-Id kvtrace records
   (``chatcmpl-<id>...``), the longest such id wins (``matched_by = 'request_id'``).

Unmatched vLLM spans stay in the view with NULL kvtrace columns.  Latencies are converted
from vLLM's seconds to ms.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.sql import float_attr, int_attr, str_attr
from kvtrace.store.sql import literal as _s
from kvtrace.store.views.registry import BIGINT, DOUBLE, VARCHAR, View, col, common

_MS = 1000.0
LEGS = (sc.ROLE_PREFILL, sc.ROLE_DECODE)
MATCHED_BY = ("parent", "request_id")

VLLM_SPANS_SQL = f"""
SELECT trace_id, span_id, parent_span_id, service_name, start_time, end_time, start_ns, end_ns,
       duration_ms, status_code,
       {str_attr(sc.GEN_AI_REQUEST_ID)} AS vllm_request_id,
       {str_attr(sc.GEN_AI_RESPONSE_MODEL)} AS model,
       {int_attr(sc.GEN_AI_USAGE_PROMPT_TOKENS)} AS prompt_tokens,
       {int_attr(sc.GEN_AI_USAGE_COMPLETION_TOKENS)} AS completion_tokens,
       {float_attr(sc.VLLM_LATENCY_TIME_IN_QUEUE)} * {_MS} AS queue_ms,
       {float_attr(sc.VLLM_LATENCY_TIME_TO_FIRST_TOKEN)} * {_MS} AS ttft_ms,
       {float_attr(sc.VLLM_LATENCY_E2E)} * {_MS} AS e2e_ms,
       {float_attr(sc.VLLM_LATENCY_TIME_IN_MODEL_PREFILL)} * {_MS} AS prefill_ms,
       {float_attr(sc.VLLM_LATENCY_TIME_IN_MODEL_DECODE)} * {_MS} AS decode_ms,
       {float_attr(sc.VLLM_LATENCY_TIME_IN_MODEL_INFERENCE)} * {_MS} AS inference_ms
FROM spans
WHERE name = {_s(sc.SPAN_VLLM_LLM_REQUEST)}
"""

BY_PARENT_SQL = f"""
SELECT v.trace_id, v.span_id, r.span_id AS proxy_span_id, r.trace_id AS request_trace_id,
       CASE leg.name WHEN {_s(sc.SPAN_PROXY_PREFILL)} THEN {_s(sc.ROLE_PREFILL)}
                     ELSE {_s(sc.ROLE_DECODE)} END AS leg
FROM vllm_spans v
JOIN spans leg ON leg.trace_id = v.trace_id AND leg.span_id = v.parent_span_id
     AND leg.name IN ({_s(sc.SPAN_PROXY_PREFILL)}, {_s(sc.SPAN_PROXY_DECODE)})
JOIN requests r ON r.trace_id = leg.trace_id AND r.span_id = leg.parent_span_id
"""

# vLLM spans not matched by parent: an anti join written as LEFT JOIN ... IS NULL (ClickHouse does
# not resolve a correlated NOT EXISTS over a CTE)
BY_REQUEST_ID_SQL = """
SELECT v.trace_id, v.span_id, r.span_id AS proxy_span_id, r.trace_id AS request_trace_id,
       CAST(NULL AS VARCHAR) AS leg
FROM vllm_spans v
LEFT JOIN by_parent p ON p.trace_id = v.trace_id AND p.span_id = v.span_id
JOIN requests r ON r.request_id IS NOT NULL AND r.request_id <> ''
     AND contains(v.vllm_request_id, r.request_id)
WHERE p.span_id IS NULL
QUALIFY row_number() OVER (PARTITION BY v.trace_id, v.span_id
                           ORDER BY length(r.request_id) DESC, r.start_ns) = 1
"""

VLLM_REQUESTS_SQL = f"""
WITH vllm_spans AS ({VLLM_SPANS_SQL}),
     by_parent AS ({BY_PARENT_SQL}),
     by_request_id AS ({BY_REQUEST_ID_SQL}),
     matched AS (
       SELECT *, {_s(MATCHED_BY[0])} AS matched_by FROM by_parent
       UNION ALL
       SELECT *, {_s(MATCHED_BY[1])} AS matched_by FROM by_request_id
     )
SELECT v.trace_id, v.span_id, v.parent_span_id, v.vllm_request_id,
       r.request_id, r.session_id, r.turn, m.leg, m.proxy_span_id, m.request_trace_id, m.matched_by,
       v.service_name, v.model, v.prompt_tokens, v.completion_tokens,
       v.queue_ms, v.ttft_ms, v.e2e_ms, v.prefill_ms, v.decode_ms, v.inference_ms,
       v.start_time, v.end_time, v.start_ns, v.end_ns, v.duration_ms, v.status_code
FROM vllm_spans v
LEFT JOIN matched m ON m.trace_id = v.trace_id AND m.span_id = v.span_id
LEFT JOIN requests r ON r.trace_id = m.request_trace_id AND r.span_id = m.proxy_span_id
"""

VLLM_REQUESTS = View(
    "vllm_requests",
    f"vLLM's own `{sc.SPAN_VLLM_LLM_REQUEST}` spans (ingested by `kvtrace collect`), each joined to the kvtrace "
    "request it served: by the proxy leg it continued, else by request id.",
    (
        *common("trace_id", "span_id", "parent_span_id"),
        col("vllm_request_id", VARCHAR, f"vLLM's `{sc.GEN_AI_REQUEST_ID}`"),
        col("request_id", VARCHAR, "`request_id` of the matched kvtrace request (`requests` view)"),
        col("session_id", VARCHAR, "`session_id` of the matched request"),
        col("turn", "INTEGER", "`turn` of the matched request"),
        col("leg", VARCHAR, "the proxy leg the span continued; NULL when matched by id", LEGS),
        col("proxy_span_id", VARCHAR, f"the matched `{sc.SPAN_PROXY_REQUEST}` span"),
        col("request_trace_id", VARCHAR, "its trace"),
        col(
            "matched_by",
            VARCHAR,
            "`parent` (via the proxy leg), `request_id` (vLLM's id contains the X-Request-Id); NULL when unmatched",
            MATCHED_BY,
        ),
        *common("service_name"),
        col("model", VARCHAR, f"`{sc.GEN_AI_RESPONSE_MODEL}`"),
        col("prompt_tokens", BIGINT, f"`{sc.GEN_AI_USAGE_PROMPT_TOKENS}`"),
        col("completion_tokens", BIGINT, f"`{sc.GEN_AI_USAGE_COMPLETION_TOKENS}`"),
        col("queue_ms", DOUBLE, "time in vLLM's queue, ms"),
        col("ttft_ms", DOUBLE, "vLLM's time to first token, ms"),
        col("e2e_ms", DOUBLE, "vLLM's end-to-end latency, ms"),
        col("prefill_ms", DOUBLE, "time in model prefill, ms"),
        col("decode_ms", DOUBLE, "time in model decode, ms"),
        col("inference_ms", DOUBLE, "time in model inference, ms"),
        *common("start_time", "end_time", "start_ns", "end_ns", "duration_ms", "status_code"),
    ),
    VLLM_REQUESTS_SQL,
)

VIEWS: tuple[View, ...] = (VLLM_REQUESTS,)
