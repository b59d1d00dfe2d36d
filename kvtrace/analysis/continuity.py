"""How often clients break continuity, and what it costs: the ``continuity`` view summarised.

A turn *breaks* continuity when its messages no longer extend what the proxy served to the session
last (``diverged``: a client that dropped reasoning, rewrote or truncated history, re-rendered a
system prompt).  The proxy then cannot offer D's blocks; what they would have saved is the turn's
``reusable_tokens_lost`` and the prefill work P did instead.  Turns checked = ``extends`` +
``diverged`` (a ``new`` turn has nothing to extend).
"""

from __future__ import annotations

import pyarrow as pa

from kvtrace import semconv as sc
from kvtrace.analysis.common import filtered, table
from kvtrace.analysis.filters import SESSION_ROW_SCOPE, Filters, where
from kvtrace.analysis.pushdown import request_scoped
from kvtrace.store.sql import literal

_DIVERGED, _NEW = literal(sc.CONTINUITY_DIVERGED), literal(sc.CONTINUITY_NEW)

SUMMARY_SQL = f"""
SELECT agent_name, scenario,
       count(*) FILTER (WHERE continuity <> {_NEW}) AS turns_checked,
       count(*) FILTER (WHERE continuity = {_DIVERGED}) AS diverged,
       count(*) FILTER (WHERE continuity = {_DIVERGED}) / nullif(count(*) FILTER (WHERE continuity <> {_NEW}), 0)
           AS broken_share,
       coalesce(sum(reusable_tokens_lost) FILTER (WHERE continuity = {_DIVERGED}), 0)::BIGINT AS reusable_tokens_lost,
       coalesce(sum(recomputed_tokens) FILTER (WHERE continuity = {_DIVERGED}), 0)::BIGINT AS recomputed_tokens,
       coalesce(sum(prefill_ms) FILTER (WHERE continuity = {_DIVERGED}), 0) AS prefill_ms,
       avg(ttft_ms) FILTER (WHERE continuity = {_DIVERGED}) AS diverged_ttft_ms,
       avg(ttft_ms) FILTER (WHERE continuity <> {_DIVERGED} AND continuity <> {_NEW}) AS extends_ttft_ms
FROM continuity {{where}}
GROUP BY agent_name, scenario
ORDER BY broken_share DESC NULLS LAST, agent_name NULLS LAST, scenario NULLS LAST
"""

BREAKS_SQL = f"""
SELECT session_id, turn, agent_name, scenario, source, diverged_at, reusable_tokens_lost, recomputed_tokens,
       prefill_ms, ttft_ms, request_id
FROM continuity {{where}} {{and_}} continuity = {_DIVERGED}
ORDER BY reusable_tokens_lost DESC NULLS LAST, session_id, turn
LIMIT $limit
"""


def summary(con, filters: Filters | None = None) -> pa.Table:
    """Per agent and scenario: turns checked, how many diverged (and the share), and on those the
    reusable tokens lost, the tokens P recomputed, P's prefill time; mean TTFT diverged vs extends."""
    return filtered(request_scoped(con, filters, by_session=False), SUMMARY_SQL, filters, SESSION_ROW_SCOPE)


def breaks(con, filters: Filters | None = None, limit: int = 1000) -> pa.Table:
    """The diverged turns, largest loss first."""
    clause, params = where(filters, SESSION_ROW_SCOPE)
    sql = BREAKS_SQL.format(where=clause or "WHERE", and_="AND" if clause else "")
    return table(request_scoped(con, filters, by_session=False), sql, {**params, "limit": limit})
