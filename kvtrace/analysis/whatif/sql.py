"""The named queries of the what-if load (:mod:`.data`): all of them run on a private cursor
over its temporary table ``base`` (:data:`kvtrace.store.views.gaps.BASE_SQL_HASHED_IDS`), on DuckDB
and on ClickHouse (chDB) alike."""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.store.sql import literal as _q
from kvtrace.store.views import gaps as gv

DEC, XFER, RET, REQ, PRE = (_q(n) for n in (gv.DEC, gv.XFER, gv.RET, gv.REQ, gv.PRE))

# the store views reuse.break_even reads, over ``base`` (temporary views of the cursor)
CALIBRATION_VIEWS = (
    f"""CREATE TEMP VIEW engine_requests AS
SELECT trace_id, span_id, request_id, session_id, turn, engine_id, '{sc.ROLE_PREFILL}' AS phase, prompt_tokens,
       cached_tokens, start_ns, end_ns, duration_ms
FROM base WHERE name = {PRE}""",
    f"""CREATE TEMP VIEW kv_transfers AS
SELECT trace_id, span_id, parent_span_id, request_id, session_id, turn, engine_id, direction, xfer_tokens AS tokens,
       xfer_bytes AS bytes, xfer_status AS status, CAST(NULL AS DOUBLE) AS xfer_ms, duration_ms, start_ns, end_ns
FROM base WHERE name = {XFER}""",
)

# the pairing of retentions and decisions and the proxy's request spans, computed once (temporary
# tables of the cursor) for both queries below
PAIRING_TABLES = {"latest": "whatif_latest", "q": "whatif_requests"}
REQUEST_COLUMNS = ("entry_age_s", "offer_reason", "ttft_ms")  # what the queries below read of ``q``
_CTES = gv.turn_gaps_ctes(**PAIRING_TABLES)

# in no particular order (:func:`_decisions` sorts them by start, then span id)
DECISIONS_SQL = f"""
WITH {_CTES},
x AS (SELECT trace_id, parent_span_id, sum(duration_ms) AS xfer_ms FROM base WHERE name = {XFER} GROUP BY ALL)
SELECT d.span_id, d.engine_id, d.start_ns, d.prompt_tokens, d.local_hit_tokens, d.remote_tokens, d.pulled_tokens,
       d.recomputed_tokens, d.threshold, d.outcome, d.policy, d.peer_engine_id IS NOT NULL AS offered, d.remaining_s,
       coalesce(x.xfer_ms, 0.0) AS xfer_ms, q.ttft_ms, q.entry_age_s * coalesce(d.time_scale, 1.0) AS entry_age_s,
       coalesce(q.offer_reason = {_q(sc.OFFER_DIVERGED)}, false) AS diverged,
       coalesce(d.verify_mode = {_q(sc.VERIFY_ENFORCE)}, false) AS enforce, d.verified_tokens
FROM d LEFT JOIN x ON x.trace_id = d.trace_id AND x.parent_span_id = d.span_id
LEFT JOIN q ON q.trace_id = d.trace_id AND q.request_id = d.request_id
"""

# in no particular order (:func:`_retentions` sorts them)
RETENTIONS_SQL = f"""
WITH {_CTES}
SELECT r.engine_id, r.start_ns, r.end_ns, r.held_bytes AS bytes, r.retention_outcome AS outcome,
       d.span_id AS next_span_id, r.held_tokens AS next_tokens, {gv.GAP_S} AS gap_s, {gv.EXPIRY_GAP_S} AS expiry_gap_s,
       r.ttl_s
{gv.PAIRED_FROM}
"""

RUN_SQL = f"""
SELECT max(end_ns) AS window_end_ns, min(time_scale) AS scale_min, max(time_scale) AS scale_max,
       list(DISTINCT ttl_s) FILTER (WHERE name = {RET} AND ttl_s IS NOT NULL) AS ttls,
       list(DISTINCT threshold) FILTER (WHERE name = {DEC} AND threshold IS NOT NULL) AS thresholds,
       list(DISTINCT conversation_ttl_s) FILTER (WHERE name = {REQ} AND conversation_ttl_s IS NOT NULL) AS proxy_ttls
FROM base
"""

POOLS_SQL = f"""
SELECT engine_id, max(pool_bytes) AS pool_bytes FROM base WHERE name = {RET} GROUP BY engine_id
"""

BANDWIDTH_SQL = f"""
SELECT sum(bytes) AS b, sum(duration_ms) AS ms, count(*) AS n FROM kv_transfers
WHERE direction = '{sc.DIRECTION_D2P}' AND status = '{sc.TRANSFER_OK}' AND bytes > 0
"""
