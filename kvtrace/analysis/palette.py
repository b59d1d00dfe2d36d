"""One name and one colour per thing kvtrace draws, shared by the dashboard (Altair) and the
report (matplotlib), so a part looks the same everywhere.

Parts of the session breakdown (``session_breakdown`` / ``turn_breakdown`` columns, in stacking
order): the two LLM parts in blues, tool waits orange, the agent's own work red, and the user's
pauses grey (the user's time, not the system's).  Token sources of P's prompt: local prefix-cache
hits, tokens pulled from D, tokens computed.
"""

from __future__ import annotations

from kvtrace.store.views.breakdown import PART_COLUMNS

# breakdown column -> (label, colour)
PARTS: dict[str, tuple[str, str]] = {
    "input_processing_ms": ("input processing", "#1f5fa8"),
    "generation_ms": ("generation", "#8ec1ea"),
    "tool_wait_ms": ("tool waits", "#f28e2b"),
    "app_work_ms": ("app work", "#d62728"),
    "user_pause_ms": ("user pauses", "#b8b0ac"),
}
assert tuple(PARTS) == PART_COLUMNS, "one entry per breakdown part, in the views' order"

PART_LABELS: dict[str, str] = {col: label for col, (label, _) in PARTS.items()}

# tokens_by_source column -> (label, colour)
SOURCES: dict[str, tuple[str, str]] = {
    "local_hit_tokens": ("local hit", "#59a14f"),
    "pulled_tokens": ("pulled from D", "#1f5fa8"),
    "computed_tokens": ("computed", "#e15759"),
}


def labels(palette: dict[str, tuple[str, str]]) -> list[str]:
    """The labels of ``palette`` in order (an Altair scale's domain, a legend's order)."""
    return [label for label, _ in palette.values()]


def colours(palette: dict[str, tuple[str, str]]) -> list[str]:
    """The colours of ``palette`` in the order of :func:`labels` (an Altair scale's range)."""
    return [colour for _, colour in palette.values()]
