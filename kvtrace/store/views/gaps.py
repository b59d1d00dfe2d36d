"""The view ``turn_gaps``: how long D held a turn's blocks before the session came back.

One row per ``kvtrace.kv.retention`` span (blocks D kept after a turn's decode): the session's
next d2p decision on a P engine (the next request's "pull or recompute"), the gap between them,
what D held meanwhile and what happened.  The next decision is the session's first d2p decision
that starts after the retention started and for which this retention is the session's latest
one (a DuckDB ASOF join): when two turns of a session overlap, the older retention has no next
decision, as the proxy then offers only the newest turn's blocks.  Retentions without a session
id have none either.

Times are in **model seconds**: wall seconds x the decode engine's ``kvtrace.sim.time_scale``
resource attribute (1 for vLLM), the unit TTLs are configured in.  ``expiry_gap_s`` is the same
gap as vLLM measures it (D's TTL minus the ``kvtrace.kv.expiry_remaining_s`` P saw), known when
the next request was offered these blocks.

The SQL is in two parts so the what-if replay (:mod:`kvtrace.analysis.whatif.data`) can run the
same pairing over a table it read once: :data:`BASE_SQL` reads, in one pass over ``spans``, the
spans involved (with their attributes as columns; :data:`BASE_SQL_HASHED_IDS` has 64-bit hashes
of the trace, span, session and request ids, for faster joins), and :data:`TURN_GAPS_CTES` +
:data:`TURN_GAPS_SELECT` compute the view from a relation named ``base`` of those columns
(:func:`turn_gaps_ctes` lets a caller put tables it computed once in place of some of them).
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.sql import float_attr as _f
from kvtrace.store.sql import int_attr as _i
from kvtrace.store.sql import literal as _q
from kvtrace.store.sql import str_attr as _s
from kvtrace.store.views.registry import BIGINT, BOOLEAN, DOUBLE, INTEGER, VARCHAR, View, col, common


def _when(names: tuple[str, ...], expr: str) -> str:
    """``expr`` for spans named one of ``names``, NULL for the others (DuckDB evaluates the map
    lookup only on those rows)."""
    return f"CASE WHEN name IN ({', '.join(map(_q, names))}) THEN {expr} END"


DEC, XFER, RET = sc.SPAN_KV_DECISION, sc.SPAN_KV_TRANSFER, sc.SPAN_KV_RETENTION
REQ, PRE, SESS = sc.SPAN_PROXY_REQUEST, sc.SPAN_ENGINE_PREFILL, sc.SPAN_AGENT_SESSION
ENGINE_SPANS = (DEC, XFER, RET, PRE)

# One pass over the spans the what-if needs: d2p decisions and transfers, retentions, the proxy's
# request spans, P's engine spans and agent session spans, attributes as columns.
_BASE_SQL = f"""
SELECT name, {{ids}}, {{turn}} AS turn, engine_id, start_ns, end_ns,
  duration_ms,
  {_when(ENGINE_SPANS, f"TRY_CAST(ResourceAttributes[{_q(sc.SIM_TIME_SCALE)}] AS DOUBLE)")} AS time_scale,
  {_when((RET,), f"TRY_CAST(ResourceAttributes[{_q(sc.ENGINE_KV_POOL_BYTES)}] AS BIGINT)")} AS pool_bytes,
  {_when((DEC, XFER), _s(sc.KV_DIRECTION))} AS direction,
  {_when((DEC,), _s(sc.KV_OUTCOME))} AS outcome,
  {_when((DEC, PRE), _i(sc.KV_PROMPT_TOKENS))} AS prompt_tokens,
  {_when((DEC,), _i(sc.KV_LOCAL_HIT_TOKENS))} AS local_hit_tokens,
  {_when((DEC,), _i(sc.KV_REMOTE_TOKENS))} AS remote_tokens,
  {_when((DEC,), _i(sc.KV_PULLED_TOKENS))} AS pulled_tokens,
  {_when((DEC,), _i(sc.KV_RECOMPUTED_TOKENS))} AS recomputed_tokens,
  {_when((DEC,), _i(sc.KV_THRESHOLD))} AS threshold,
  {_when((DEC,), _s(sc.KV_LOAD_FAILURE_POLICY))} AS policy,
  {_when((DEC,), _s(sc.KV_PEER_ENGINE_ID))} AS peer_engine_id,
  {_when((DEC,), _f(sc.KV_EXPIRY_REMAINING_S))} AS remaining_s,
  {_when((DEC,), _s(sc.KV_VERIFY_MODE))} AS verify_mode,
  {_when((DEC,), _i(sc.KV_VERIFIED_TOKENS))} AS verified_tokens,
  {_when((XFER,), _i(sc.KV_TRANSFER_TOKENS))} AS xfer_tokens,
  {_when((XFER,), _i(sc.KV_TRANSFER_BYTES))} AS xfer_bytes,
  {_when((XFER,), _s(sc.KV_TRANSFER_STATUS))} AS xfer_status,
  {{held_blocks}} AS held_blocks,
  {_when((RET,), _i(sc.KV_RETENTION_TOKENS))} AS held_tokens,
  {_when((RET,), _i(sc.KV_RETENTION_BYTES))} AS held_bytes,
  {_when((RET,), _f(sc.KV_RETENTION_TTL_S))} AS ttl_s,
  {_when((RET,), _s(sc.KV_RETENTION_OUTCOME))} AS retention_outcome,
  {_when((REQ,), _f(sc.REQUEST_TTFT_MS))} AS ttft_ms,
  {_when((REQ,), _f(sc.PROXY_ENTRY_AGE_S))} AS entry_age_s,
  {_when((REQ,), _f(sc.PROXY_CONVERSATION_TTL_S))} AS conversation_ttl_s,
  {{offered}} AS offered,
  {_when((REQ,), _s(sc.PROXY_OFFER_REASON))} AS offer_reason,
  {_when((PRE,), _i(sc.REQUEST_CACHED_TOKENS))} AS cached_tokens,
  {{agent_name}} AS agent_name,
  {{scenario}} AS scenario
FROM spans
WHERE name IN ({", ".join(map(_q, (DEC, XFER, RET, REQ, PRE, SESS)))})
  AND (name NOT IN ({_q(DEC)}, {_q(XFER)}) OR {_s(sc.KV_DIRECTION)} = {_q(sc.DIRECTION_D2P)})
"""
# columns only the view shows (the what-if replay reads none of them)
_VIEW_ONLY = {
    "turn": ("turn", "INTEGER"),
    "held_blocks": (_when((RET,), _i(sc.KV_RETENTION_BLOCKS)), "BIGINT"),
    "offered": (_when((REQ,), _s(sc.PROXY_OFFER) + " = 'true'"), "BOOLEAN"),
    "agent_name": (_when((SESS,), _s(sc.GEN_AI_AGENT_NAME)), "VARCHAR"),
    "scenario": (_when((SESS,), _s(sc.AGENT_SCENARIO)), "VARCHAR"),
}
BASE_SQL = _BASE_SQL.format(
    ids="trace_id, span_id, parent_span_id, session_id, request_id",
    **{name: expr for name, (expr, _) in _VIEW_ONLY.items()},
)
# for the what-if replay: the ids as 64-bit hashes, joins on integers (it never shows ids; session
# and request ids may be NULL, and stay NULL: a NULL never joins), NULL for the view-only columns
BASE_SQL_HASHED_IDS = _BASE_SQL.format(
    ids="hash(trace_id) AS trace_id, hash(span_id) AS span_id, hash(parent_span_id) AS parent_span_id, "
    "CASE WHEN session_id IS NOT NULL THEN hash(session_id) END AS session_id, "
    "CASE WHEN request_id IS NOT NULL THEN hash(request_id) END AS request_id",
    **{name: f"CAST(NULL AS {kind})" for name, (_, kind) in _VIEW_ONLY.items()},
)


def requests_sql(columns: tuple[str, ...]) -> str:
    """The proxy's request span of each (trace, request id) in ``base``: ``columns`` of its first."""
    first = ", ".join(f"arg_min({c}, start_ns) AS {c}" for c in columns)
    return (
        f"SELECT trace_id, request_id, {first} FROM base WHERE name = {_q(REQ)} AND request_id IS NOT NULL "
        "GROUP BY trace_id, request_id"
    )


# over ``base``: retentions, d2p decisions, each decision's latest retention of its session (then
# each retention's first such decision), the proxy's request span of a decision, agent sessions
_CTES = {
    "r": f"SELECT *, COALESCE(time_scale, 1.0) AS scale FROM base WHERE name = {_q(RET)}",
    "d": f"SELECT * FROM base WHERE name = {_q(DEC)}",
    "latest": """
  SELECT d.trace_id AS d_trace, d.span_id AS d_span, r.trace_id AS r_trace, r.span_id AS r_span
  FROM d ASOF JOIN r ON d.session_id = r.session_id AND d.start_ns >= r.start_ns
  QUALIFY row_number() OVER (PARTITION BY r.trace_id, r.span_id ORDER BY d.start_ns, d.span_id) = 1
""",
    "q": requests_sql(("entry_age_s", "conversation_ttl_s", "offered", "offer_reason", "ttft_ms")),
    "a": f"""
  SELECT session_id, min(agent_name) AS agent_name, min(scenario) AS scenario
  FROM base WHERE name = {_q(SESS)} AND session_id IS NOT NULL GROUP BY session_id
""",
}


def turn_gaps_ctes(**tables: str) -> str:
    """The view's CTEs over ``base``: retentions ``r``, d2p decisions ``d``, each decision's latest
    retention of its session (then each retention's first such decision) ``latest``, the proxy's
    request span of a decision ``q``, agent sessions ``a``; ``name=table`` reads ``table`` (the
    same CTE computed once, e.g. a temporary table) instead."""
    parts = {name: f"SELECT * FROM {tables[name]}" if name in tables else sql for name, sql in _CTES.items()}
    return ",\n".join(f"{name} AS ({sql.strip()})" for name, sql in parts.items())


TURN_GAPS_CTES = turn_gaps_ctes()

# each retention with its next decision (``d`` NULL: none), and the gap between them as the view
# and the what-if replay compute it
PAIRED_FROM = """FROM r
LEFT JOIN latest l ON l.r_trace = r.trace_id AND l.r_span = r.span_id
LEFT JOIN d ON d.trace_id = l.d_trace AND d.span_id = l.d_span"""
GAP_S = "(d.start_ns - r.start_ns) / 1e9 * r.scale"
EXPIRY_GAP_S = "CASE WHEN d.peer_engine_id = r.engine_id THEN r.ttl_s - d.remaining_s END"

TURN_GAPS_SELECT = f"""
SELECT r.trace_id, r.span_id, r.session_id, r.turn, r.request_id, r.engine_id, a.agent_name, a.scenario,
       r.start_ns, r.end_ns, (r.end_ns - r.start_ns) / 1e9 * r.scale AS held_s,
       r.held_blocks AS blocks, r.held_tokens AS tokens, r.held_bytes AS bytes, r.ttl_s, r.retention_outcome,
       r.scale AS time_scale,
       d.trace_id AS next_trace_id, d.span_id AS next_span_id, d.request_id AS next_request_id,
       d.turn AS next_turn, d.engine_id AS next_engine_id, d.start_ns AS next_start_ns,
       {GAP_S} AS gap_s, {EXPIRY_GAP_S} AS expiry_gap_s,
       q.entry_age_s * r.scale AS entry_age_s, q.conversation_ttl_s * r.scale AS offer_ttl_s,
       q.offered, q.offer_reason, d.outcome, d.pulled_tokens, d.recomputed_tokens
{PAIRED_FROM}
LEFT JOIN q ON q.trace_id = d.trace_id AND q.request_id = d.request_id
LEFT JOIN a ON a.session_id = r.session_id
"""

_MODEL_S = "model s (wall x `time_scale`)"

TURN_GAPS = View(
    "turn_gaps",
    f"How long D held a turn's blocks before the session came back: one row per `{RET}` span, with "
    "the session's next d2p decision (the first after it for which it is the session's latest retention; "
    "none when two turns overlap, or without a session id), the gap, what D held and what happened. "
    "Times in model seconds (wall x the D engine's time scale; wall on vLLM). `kvtrace whatif` replays "
    "these gaps under other TTLs. SQL in `kvtrace/store/views/gaps.py`.",
    (
        *common("trace_id", "span_id", "session_id", "turn", "request_id", "engine_id"),
        col("agent_name", VARCHAR, "the session's agent span: agent name"),
        col("scenario", VARCHAR, "the session's agent span: bench scenario"),
        *common("start_ns", "end_ns"),
        col("held_s", DOUBLE, f"how long D held the blocks, {_MODEL_S}"),
        col("blocks", BIGINT, "blocks held"),
        col("tokens", BIGINT, "tokens held (what D offers the next turn: `remote_num_tokens`)"),
        col("bytes", BIGINT, "bytes held"),
        col("ttl_s", DOUBLE, "`decoder_kv_blocks_ttl` in force, s"),
        col("retention_outcome", VARCHAR, f"how the hold ended: {', '.join(sc.RETENTION_OUTCOMES)}"),
        col("time_scale", DOUBLE, f"the D engine's `{sc.SIM_TIME_SCALE}` (1.0 unless simulated faster than real time)"),
        col("next_trace_id", VARCHAR, "the next d2p decision's trace"),
        col("next_span_id", VARCHAR, "the next d2p decision's span"),
        col("next_request_id", VARCHAR, "the next request"),
        col("next_turn", INTEGER, "the next request's turn"),
        col("next_engine_id", VARCHAR, "the P engine that decided"),
        col("next_start_ns", BIGINT, "when it decided, epoch ns"),
        col("gap_s", DOUBLE, f"decode end on D to that decision, {_MODEL_S}"),
        col(
            "expiry_gap_s",
            DOUBLE,
            f"the same gap as vLLM measured it: `ttl_s` minus the `{sc.KV_EXPIRY_REMAINING_S}` "
            "P saw (when the next request was offered these blocks)",
        ),
        col("entry_age_s", DOUBLE, f"age of the proxy's conversation entry when the next request arrived, {_MODEL_S}"),
        col("offer_ttl_s", DOUBLE, f"the proxy's `--conversation-ttl`, {_MODEL_S}"),
        col("offered", BOOLEAN, "the proxy offered D's blocks to the next request"),
        col("offer_reason", VARCHAR, f"why (not): {', '.join(sc.OFFER_REASONS)}"),
        col("outcome", VARCHAR, f"the next decision's recorded outcome: {', '.join(sc.OUTCOMES)}"),
        col("pulled_tokens", BIGINT, "tokens it pulled"),
        col("recomputed_tokens", BIGINT, "prompt tokens it computed"),
    ),
    f"""
WITH base AS MATERIALIZED ({BASE_SQL}),
{TURN_GAPS_CTES}
{TURN_GAPS_SELECT}
""",
)

VIEWS: tuple[View, ...] = (TURN_GAPS,)
