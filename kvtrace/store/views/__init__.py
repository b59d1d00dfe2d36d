"""The view registry: every SQL view kvtrace defines over a trace directory, in one list.

Each entry (:class:`~kvtrace.store.views.registry.View`) has its name, description, columns
(name, DuckDB type, meaning, enumerated values) and SQL.  :func:`kvtrace.store.connect` creates
all of them, in :data:`VIEWS` order, on every connection: ``kvtrace query``, ``kvtrace report``,
the dashboard, ``kvtrace demo`` and Python code see the same views.  docs/query.md is generated
from this list (``python -m kvtrace.store.views > docs/query.md``).

- :mod:`.spans`: ``spans`` and one view per span kind (requests, KV decisions, transfers,
  retention, engine work, agent calls/tools/work/turns) and ``sessions``;
- :mod:`.vllm`: ``vllm_requests`` (vLLM's own spans joined to kvtrace's requests);
- :mod:`.breakdown`: ``session_breakdown`` / ``turn_breakdown`` and their ``kvtrace_*`` helpers;
- :mod:`.agents`: agent spans of any convention (OTel GenAI, OpenInference, OpenLLMetry):
  ``trace_sessions`` and ``agent_llm_calls``;
- :mod:`.gaps`: ``turn_gaps`` (how long D held a turn's blocks before the session came back);
- :mod:`.continuity`: ``continuity`` (each chat turn checked against its session's last served turn).
"""

from __future__ import annotations

from kvtrace.store.views import agents, breakdown, continuity, gaps, spans, vllm
from kvtrace.store.views.registry import COMMON, Column, View

VIEWS: tuple[View, ...] = (
    *spans.VIEWS,
    *vllm.VIEWS,
    *agents.HELPERS,
    *breakdown.VIEWS,
    *agents.VIEWS,
    *gaps.VIEWS,
    *continuity.VIEWS,
)
"""Every view, in creation order (a view only reads views before it)."""

BY_NAME: dict[str, View] = {v.name: v for v in VIEWS}
PUBLIC: tuple[View, ...] = tuple(v for v in VIEWS if not v.helper)

__all__ = ["BY_NAME", "COMMON", "PUBLIC", "VIEWS", "Column", "View"]
