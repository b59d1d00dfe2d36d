"""Does bidirectional KV reuse happen, and what does it save?

Reuse is judged on P's ``d2p`` decisions (next turn's P pulling D's retained blocks):

- per request: reusable (tokens D offered, ``remote_num_tokens``), locally hit, pulled and
  recomputed tokens, the outcome, bytes moved (successful transfers only) and time of the pull
  (every attempt, failed or declined ones too), and the time the pulled tokens would have taken
  to recompute on that P worker;
- aggregated: decision mix, token totals by source, transfer time against recompute time, and the
  break-even token count.

**Prefill rate** of a worker = tokens it computed (prompt − cached, from ``engine_requests``
prefill spans) / the time it spent on them (span duration minus its own d2p transfer time),
summed over its requests: all of the store's, whatever the filters (on DuckDB from the files'
lookups, :mod:`kvtrace.store.lookup`, so a bounded question does not read every span for them, and
computed once per listing of the files, not once per question; on ClickHouse from kvtrace's prefills
and d2p tables where the table has them, in each statement).
Recompute estimate of ``n`` tokens = ``n / rate`` (linear: it ignores attention's growth with
context, so it slightly understates recompute for long contexts).

**Break-even**: transfer time is fitted as ``a + b·n`` (DuckDB ``regr_intercept`` /
``regr_slope`` over successful d2p transfers; a single distinct size falls back to ``a = 0``,
``b`` = mean ms per token).  Pulling wins above ``n* = a / (1/rate − b)`` tokens; ``NULL`` when
the per-token transfer cost is not below the per-token recompute cost (pulling never pays).
Rows with ``engine_id`` NULL are all engines pooled.

A time range or a session reads only the spans its rows can join, on DuckDB and on a ClickHouse table
with kvtrace's materialized tables (:func:`kvtrace.analysis.pushdown.request_scoped`).
"""

from __future__ import annotations

import pyarrow as pa

from kvtrace import semconv as sc
from kvtrace.analysis.common import one, rows, table
from kvtrace.analysis.filters import ROW_SCOPE, ROW_SCOPE_NO_SERVICE, Filters, where
from kvtrace.analysis.pushdown import request_scoped
from kvtrace.store import lookup
from kvtrace.store.sql import ident, literal

D2P = literal(sc.DIRECTION_D2P)
PREFILL = literal(sc.ROLE_PREFILL)

_D2P_XFER = f"""
    SELECT request_id, engine_id,
           coalesce(sum(tokens) FILTER (WHERE status = {literal(sc.TRANSFER_OK)}), 0)::BIGINT AS xfer_tokens,
           coalesce(sum(bytes) FILTER (WHERE status = {literal(sc.TRANSFER_OK)}), 0)::BIGINT AS bytes,
           sum(duration_ms) AS transfer_ms, sum(xfer_ms) AS xfer_ms
    FROM kv_transfers WHERE direction = {D2P} GROUP BY request_id, engine_id
"""


def _rate_sql(prefills: str, d2p: str) -> str:
    """:data:`PREFILL_RATE_SQL` over relations ``prefills`` (:data:`kvtrace.store.lookup.PREFILLS_COLUMNS`
    of the prefill rows) and ``d2p`` (:data:`kvtrace.store.lookup.D2P_COLUMNS` of the d2p transfers)."""
    # per engine and pooled (engine_id NULL): computed tokens per ms of compute.  ``tokens_per_ms`` is
    # the marginal rate, 1 / the slope of a least-squares line through (tokens computed, compute ms) of
    # the prefills, with at least 3 of them and a positive slope; else the mean rate (tokens / ms; so too
    # where every prefill computed as many tokens: the slope is then NaN, which DuckDB orders above 0).  A
    # prefill span also holds per-request costs (scheduling, queueing, the first forward pass), so the
    # mean rate prices the tokens a decision adds or saves too high: on the what-if proof workload it was
    # 13.5 tokens/ms against a marginal 24.5 (the simulator then changed TTFT as the marginal one said).
    return f"""
WITH x AS (SELECT request_id, engine_id, sum(duration_ms) AS transfer_ms FROM {d2p} GROUP BY request_id, engine_id),
p AS (
    SELECT e.engine_id,
           e.prompt_tokens - coalesce(e.cached_tokens, 0) AS computed,
           e.duration_ms - coalesce(x.transfer_ms, 0) AS compute_ms
    FROM {prefills} e
    LEFT JOIN x ON x.request_id = e.request_id AND x.engine_id = e.engine_id
)
SELECT engine_id, requests, computed_tokens, compute_ms, mean_tokens_per_ms,
       CASE WHEN requests >= 3 AND slope > 0 AND NOT isnan(slope) THEN 1.0 / slope ELSE mean_tokens_per_ms END
           AS tokens_per_ms
FROM (
    SELECT engine_id, count(*) AS requests, sum(computed)::BIGINT AS computed_tokens,
           sum(compute_ms) AS compute_ms, sum(computed)::BIGINT / sum(compute_ms) AS mean_tokens_per_ms,
           regr_slope(compute_ms, computed) AS slope
    FROM p WHERE computed > 0 AND compute_ms > 0
    GROUP BY GROUPING SETS ((engine_id), ())
) AS rates
"""


# the two relations over the views (the what-if's calibration redefines them on its cursor) and over
# a DuckDB store's lookups (every file's, whatever a cursor's bounds: kvtrace.store.lookup)
_VIEWS = (
    f"(SELECT {lookup.PREFILLS_COLUMNS} FROM engine_requests WHERE phase = {PREFILL})",
    f"(SELECT {lookup.D2P_COLUMNS} FROM kv_transfers WHERE direction = {D2P})",
)
_LOOKUPS = (lookup.PREFILLS, lookup.D2P)

PREFILL_RATE_SQL = _rate_sql(*_VIEWS)
"""Per engine and pooled (``engine_id`` NULL): computed tokens per ms of compute, over the views."""


def _over(con) -> tuple[str, str]:
    """The relations the store's rates read on ``con``: the lookups on DuckDB; on ClickHouse kvtrace's
    prefills and d2p tables (:mod:`kvtrace.store.clickhouse.mviews`), else the views (a table without
    them is read whole: :func:`kvtrace.analysis.pushdown.request_scoped`)."""
    if getattr(con, "is_clickhouse", False):
        return con.rates_relations() or _VIEWS
    return _LOOKUPS


def _store_rates(con) -> tuple[list[dict], list[dict]] | None:
    """(:func:`prefill_rates`, :func:`break_even`) of ``con``'s store, from its lookups (DuckDB) or
    prefill tables (ClickHouse), computed once per listing of its files, or state of its tables' parts
    (:func:`kvtrace.store.lookup.kept`); None over the views (:data:`PREFILL_RATE_SQL` and
    :data:`BREAK_EVEN_SQL`, computed in each statement)."""
    prefills, d2p = over = _over(con)
    if over is _VIEWS:
        return None

    def compute() -> tuple[list[dict], list[dict]]:
        rates = _rate_sql(prefills, d2p)
        return rows(con, rates + " ORDER BY engine_id NULLS FIRST"), rows(con, _break_even_sql(rates, d2p))

    return lookup.kept(con, ("reuse.rates",), compute)


def _rates_for(con) -> tuple[str, dict]:
    """The ``r`` relation :func:`_requests_sql` joins (engine_id, tokens_per_ms) and its parameters:
    the kept rates, a row of bound values per engine, where they are kept, else computed in the
    statement.  (One ``SELECT`` per engine, not two lists unnested: ClickHouse binds no list, and
    would pair two unnested arrays' every element with every other's.)"""
    kept = _store_rates(con)
    if kept is None:
        return PREFILL_RATE_SQL, {}
    engines = [r for r in kept[0] if r["engine_id"] is not None]
    one = "SELECT $rate_engine_{0}::VARCHAR AS engine_id, $rate_{0}::DOUBLE AS tokens_per_ms"
    parts = [one.format(i) for i in range(len(engines))]
    relation = " UNION ALL ".join(parts) or "SELECT NULL::VARCHAR AS engine_id, NULL::DOUBLE AS tokens_per_ms LIMIT 0"
    params: dict = {}
    for i, r in enumerate(engines):
        params[f"rate_engine_{i}"], params[f"rate_{i}"] = r["engine_id"], r["tokens_per_ms"]
    return relation, params


def _break_even_sql(rates: str, d2p: str) -> str:
    return f"""
WITH rate AS ({rates}),
t AS (SELECT engine_id, tokens, duration_ms FROM {d2p} WHERE status = {literal(sc.TRANSFER_OK)} AND tokens > 0),
fit AS (
    SELECT engine_id, count(*) AS transfers,
           regr_intercept(duration_ms, tokens) AS a, regr_slope(duration_ms, tokens) AS b,
           sum(duration_ms) / sum(tokens)::BIGINT AS mean_ms_per_token
    FROM t GROUP BY GROUPING SETS ((engine_id), ())
),
m AS (
    SELECT f.engine_id, f.transfers,
           CASE WHEN f.fallback THEN 0.0 ELSE f.a END AS overhead_ms,
           CASE WHEN f.fallback THEN f.mean_ms_per_token ELSE f.b END AS xfer_ms_per_token,
           1.0 / r.tokens_per_ms AS recompute_ms_per_token, r.tokens_per_ms
    FROM (SELECT *, coalesce(isnan(b) OR isnan(a) OR a < 0, true) AS fallback FROM fit) f
    LEFT JOIN rate r ON r.engine_id IS NOT DISTINCT FROM f.engine_id
)
SELECT engine_id, transfers, overhead_ms, xfer_ms_per_token, recompute_ms_per_token, tokens_per_ms,
       CASE WHEN recompute_ms_per_token > xfer_ms_per_token
            THEN ceil(overhead_ms / (recompute_ms_per_token - xfer_ms_per_token)) END AS break_even_tokens
FROM m ORDER BY engine_id NULLS FIRST
"""


BREAK_EVEN_SQL = _break_even_sql(PREFILL_RATE_SQL, _VIEWS[1])


def _requests_sql(rates: str) -> str:
    return f"""
WITH x AS ({_D2P_XFER}),
r AS ({rates})
SELECT d.start_ns, d.session_id, d.turn, d.request_id, d.engine_id, d.peer_engine_id, d.outcome,
       d.prompt_tokens, d.remote_tokens AS reusable_tokens, d.local_hit_tokens, d.pulled_tokens,
       d.recomputed_tokens, d.threshold, d.expiry_remaining_s,
       coalesce(x.bytes, 0) AS bytes, x.transfer_ms, x.xfer_ms,
       CASE WHEN r.tokens_per_ms > 0 THEN d.pulled_tokens / r.tokens_per_ms END AS recompute_est_ms,
       d.substrate
FROM (SELECT * FROM kv_decisions WHERE direction = {D2P} {{where}}) d
LEFT JOIN x ON x.request_id = d.request_id AND x.engine_id = d.engine_id
LEFT JOIN r ON r.engine_id = d.engine_id
ORDER BY d.start_ns, d.request_id
LIMIT $limit
"""


def _summary_sql(rates: str) -> str:
    return f"""
WITH q AS ({_requests_sql(rates)})
SELECT count(*) AS decisions,
       count(*) FILTER (WHERE outcome = {literal(sc.OUTCOME_PULLED)}) AS pulled_requests,
       coalesce(sum(prompt_tokens), 0)::BIGINT AS prompt_tokens,
       coalesce(sum(reusable_tokens), 0)::BIGINT AS reusable_tokens,
       coalesce(sum(local_hit_tokens), 0)::BIGINT AS local_hit_tokens,
       coalesce(sum(pulled_tokens), 0)::BIGINT AS pulled_tokens,
       coalesce(sum(recomputed_tokens), 0)::BIGINT AS recomputed_tokens,
       coalesce(sum(bytes), 0)::BIGINT AS bytes,
       coalesce(sum(transfer_ms) FILTER (WHERE outcome = {literal(sc.OUTCOME_PULLED)}), 0) AS transfer_ms,
       coalesce(sum(recompute_est_ms) FILTER (WHERE outcome = {literal(sc.OUTCOME_PULLED)}), 0) AS recompute_est_ms
FROM q
"""


DECISION_MIX_SQL = """
SELECT direction, outcome, count(*) AS decisions,
       coalesce(sum(pulled_tokens), 0)::BIGINT AS pulled_tokens,
       coalesce(sum(recomputed_tokens), 0)::BIGINT AS recomputed_tokens
FROM kv_decisions {where}
GROUP BY direction, outcome ORDER BY direction, decisions DESC, outcome
"""

# P's check of D's digest (kvtrace.kv.verified): mismatches first, then unverifiable, then match
_VERIFIED_RANK = f"""CASE verified WHEN {literal(sc.VERIFIED_MISMATCH)} THEN 0
    WHEN {literal(sc.VERIFIED_UNVERIFIABLE)} THEN 1 ELSE 2 END"""

VERIFICATION_SQL = f"""
SELECT verified, count(*) AS decisions,
       count(*) FILTER (WHERE outcome = {literal(sc.OUTCOME_PULLED)}) AS pulled,
       coalesce(sum(wrong_tokens), 0)::BIGINT AS wrong_tokens
FROM kv_decisions WHERE direction = {D2P} AND verified IS NOT NULL {{where}}
GROUP BY verified ORDER BY {_VERIFIED_RANK}, verified
"""

# Why a mismatched offer was made, where the kvtrace proxy forwarded the request (its request span
# and its continuity check, joined by request id); NULL where no kvtrace proxy saw it (another router
# or a driver offering by id alone: the mismatch itself is all there is to know).
CAUSE_INJECTED = "injected offer"  # the proxy offered nothing: the offer P checked came from elsewhere
CAUSE_DIVERGED = "diverged history"  # the proxy saw the messages diverge from the served turn, offered anyway
CAUSE_RENDERED = "prompt rendered differently"  # the messages extend the served turn, the prompt's tokens do not
CAUSE_REUSED_ID = "reused id"  # offered on the session id alone: no served history to compare (new / unchecked)
CAUSES = (CAUSE_INJECTED, CAUSE_DIVERGED, CAUSE_RENDERED, CAUSE_REUSED_ID)

MISMATCHES_SQL = f"""
WITH m AS (
    SELECT start_ns, session_id, turn, request_id, engine_id, peer_engine_id, verify_mode, outcome,
           prompt_tokens, local_hit_tokens, remote_tokens, verified_tokens, first_mismatch_token, wrong_tokens,
           pulled_tokens
    FROM kv_decisions WHERE direction = {D2P} AND verified = {literal(sc.VERIFIED_MISMATCH)} {{where}}
),
px AS (
    SELECT request_id, max(CASE WHEN offered THEN 1 ELSE 0 END) AS offered FROM requests
    WHERE request_id IN (SELECT request_id FROM m) GROUP BY request_id
),
ct AS (
    SELECT request_id, min(continuity) AS continuity FROM continuity
    WHERE request_id IN (SELECT request_id FROM m) GROUP BY request_id
)
SELECT m.start_ns, m.session_id, m.turn, m.request_id, m.engine_id, m.peer_engine_id, m.verify_mode, m.outcome,
       m.first_mismatch_token, m.wrong_tokens,
       CASE WHEN px.request_id IS NULL THEN NULL
            WHEN px.offered = 0 THEN {literal(CAUSE_INJECTED)}
            WHEN ct.continuity = {literal(sc.CONTINUITY_DIVERGED)} THEN {literal(CAUSE_DIVERGED)}
            WHEN ct.continuity = {literal(sc.CONTINUITY_EXTENDS)} THEN {literal(CAUSE_RENDERED)}
            ELSE {literal(CAUSE_REUSED_ID)} END AS cause,
       m.prompt_tokens, m.local_hit_tokens, m.remote_tokens, m.verified_tokens, m.pulled_tokens
FROM m LEFT JOIN px ON px.request_id = m.request_id LEFT JOIN ct ON ct.request_id = m.request_id
ORDER BY m.wrong_tokens DESC, m.start_ns, m.request_id
LIMIT $limit
"""

OFFER_MIX_SQL = """
SELECT offer_reason, count(*) AS requests FROM requests {where}
GROUP BY offer_reason ORDER BY requests DESC, offer_reason
"""

TOKENS_BY_SOURCE_SQL = f"""
WITH d AS (
    SELECT request_id, engine_id, local_hit_tokens, pulled_tokens
    FROM kv_decisions WHERE direction = {D2P}
),
e AS (SELECT * FROM engine_requests WHERE phase = {PREFILL} {{where}}),
j AS (
    SELECT e.turn, e.prompt_tokens, coalesce(d.pulled_tokens, 0) AS pulled,
           coalesce(d.local_hit_tokens,
                    greatest(coalesce(e.cached_tokens, 0) - coalesce(d.pulled_tokens, 0), 0)) AS local_hit
    FROM e LEFT JOIN d ON d.request_id = e.request_id AND d.engine_id = e.engine_id
)
SELECT turn, count(*) AS requests,
       sum(local_hit)::BIGINT AS local_hit_tokens, sum(pulled)::BIGINT AS pulled_tokens,
       sum(greatest(prompt_tokens - local_hit - pulled, 0))::BIGINT AS computed_tokens
FROM j GROUP BY turn ORDER BY turn NULLS LAST
"""

# requests scope: proxy rows have service_name and substrate columns
_REQUEST_SCOPE = ROW_SCOPE


def requests(con, filters: Filters | None = None, limit: int = 100_000) -> pa.Table:
    """One row per d2p decision (P's reuse decision), in start order, at most ``limit``."""
    clause, params = where(filters, ROW_SCOPE, prefix="AND")
    rates, bound = _rates_for(con)
    sql = _requests_sql(rates).format(where=clause)
    return table(request_scoped(con, filters), sql, {**params, **bound, "limit": limit})


def summary(con, filters: Filters | None = None) -> dict:
    """Totals over every d2p decision, plus ``saved_ms`` (recompute estimate − transfer time of
    the pulled requests), ``pull_rate`` and the pooled ``break_even_tokens``."""
    clause, params = where(filters, ROW_SCOPE, prefix="AND")
    rates, bound = _rates_for(con)
    sql = _summary_sql(rates).format(where=clause)
    out = one(request_scoped(con, filters), sql, {**params, **bound, "limit": 2**62})
    out["saved_ms"] = out["recompute_est_ms"] - out["transfer_ms"]
    out["pull_rate"] = out["pulled_requests"] / out["decisions"] if out["decisions"] else None
    pooled = [r for r in break_even(con) if r["engine_id"] is None]
    out["break_even_tokens"] = pooled[0]["break_even_tokens"] if pooled else None
    return out


def decision_mix(con, filters: Filters | None = None) -> pa.Table:
    """Decisions per (direction, outcome)."""
    clause, params = where(filters, ROW_SCOPE)
    return table(request_scoped(con, filters), DECISION_MIX_SQL.format(where=clause), params)


def verification(con, filters: Filters | None = None) -> pa.Table:
    """d2p decisions with D's blocks offered, per ``kvtrace.kv.verified``: mismatches first."""
    clause, params = where(filters, ROW_SCOPE, prefix="AND")
    return table(request_scoped(con, filters), VERIFICATION_SQL.format(where=clause), params)


def mismatches(con, filters: Filters | None = None, limit: int = 20) -> pa.Table:
    """The mismatched offers (D's blocks hold other tokens than the prompt), most wrong tokens first:
    where the prompt first differs (``first_mismatch_token``, a digest chunk's start), the tokens
    vLLM's rule loads or would load from other KV (``wrong_tokens``) and, where the kvtrace proxy
    forwarded the request, why the offer was made (``cause``, one of :data:`CAUSES`)."""
    clause, params = where(filters, ROW_SCOPE, prefix="AND")
    sql = MISMATCHES_SQL.format(where=clause)
    return table(request_scoped(con, filters), sql, {**params, "limit": limit})


def offer_mix(con, filters: Filters | None = None) -> pa.Table:
    """Proxy requests per offer reason (was D's location offered to P, and if not, why)."""
    clause, params = where(filters, _REQUEST_SCOPE)
    return table(request_scoped(con, filters), OFFER_MIX_SQL.format(where=clause), params)


def tokens_by_source(con, filters: Filters | None = None) -> pa.Table:
    """P's prompt tokens per turn index by source: local prefix hit, pulled from D, computed."""
    clause, params = where(filters, ROW_SCOPE_NO_SERVICE, prefix="AND")
    return table(request_scoped(con, filters), TOKENS_BY_SOURCE_SQL.format(where=clause), params)


def prefill_rates(con) -> list[dict]:
    """Observed prefill rate per P engine (and pooled, engine_id None), over the whole store."""
    kept = _store_rates(con)
    if kept is not None:
        return [dict(r) for r in kept[0]]
    return rows(con, PREFILL_RATE_SQL + " ORDER BY engine_id NULLS FIRST")


def break_even(con, rates_table: str | None = None) -> list[dict]:
    """Transfer cost fit, recompute cost and break-even tokens per engine (and pooled), over the whole
    store; ``rates_table``: a table of :data:`PREFILL_RATE_SQL`'s result, read instead of computing it,
    with the transfers of the views (the what-if's calibration, :mod:`kvtrace.analysis.whatif.data`)."""
    if rates_table is not None:
        return rows(con, _break_even_sql(f"SELECT * FROM {ident(rates_table)}", _VIEWS[1]))
    kept = _store_rates(con)
    if kept is not None:
        return [dict(r) for r in kept[1]]
    return rows(con, BREAK_EVEN_SQL)
