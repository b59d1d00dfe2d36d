"""Concrete, seeded workloads: every session's text, token counts, waits and pauses decided
up front, so the same seed replays the same work against any endpoint (A/B runs).

:func:`from_scenario` draws a :class:`Workload` from a :class:`~kvtrace.bench.scenarios.Scenario`;
:mod:`kvtrace.bench.vllm_inputs` builds one from vLLM's multi-turn benchmark inputs.  The runner
(:mod:`kvtrace.bench.runner`) executes it.  Generated text is space-separated words from a fixed
vocabulary; each session's text starts with its own tag so sessions share no prefix except the
scenario's common system prompt.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtrace.bench.scenarios import LLM, Scenario, Tool, Work

_VOCAB = (
    "the a of to and in is it for on that with as was at by from this be are or an not but "
    "file line error test function value return call module class import name type list dict "
    "check build run fix patch diff change update config option flag path result output input "
    "cache block token model agent turn tool step plan search read write parse load save open "
    "source paper claim data table figure method note point issue reason answer question draft "
    "first next last new old same other more less fast slow small large high low true false"
).split()


@dataclass
class LLMAction:
    max_tokens: int
    interrupt_after: int | None = None


@dataclass
class ToolCall:
    name: str
    wait_s: float
    output: str


@dataclass
class ToolAction:
    calls: list[ToolCall]


@dataclass
class WorkAction:
    name: str
    duration_s: float


Action = LLMAction | ToolAction | WorkAction


@dataclass
class TurnPlan:
    index: int
    label: str
    pause_s: float
    user_text: str
    actions: list[Action] = field(default_factory=list)


class LazyTurnPlan(TurnPlan):
    """A turn whose text is made each time it is read (``make()``): a replayed trace's thousands of
    sessions hold no text until they run, and a finished one holds none again."""

    def __init__(self, index: int, label: str, pause_s: float, make: Callable[[], str], actions: list) -> None:
        super().__init__(index, label, pause_s, "", actions)
        self._make = make

    @property  # type: ignore[override]
    def user_text(self) -> str:
        return self._make()

    @user_text.setter
    def user_text(self, value: str) -> None:
        self._make = lambda: value


@dataclass
class SessionPlan:
    index: int
    name: str  # stable label (scenario session index, or the conversation id of an input file)
    system_text: str
    turns: list[TurnPlan]

    @property
    def n_llm_calls(self) -> int:
        return sum(isinstance(a, LLMAction) for t in self.turns for a in t.actions)


@dataclass
class Workload:
    name: str  # scenario name or input file name
    sessions: list[SessionPlan]
    seed: int
    source: str = "scenario"  # scenario | conversations | generate_conversations
    thinking: bool = False  # the scenario's: reasoning first
    keep_reasoning: bool = True  # the scenario's: reasoning sent back in the history
    timed: bool = False  # pauses replay a trace's arrival times (first turn: the session's start)

    @property
    def n_llm_calls(self) -> int:
        return sum(s.n_llm_calls for s in self.sessions)


def words(rng: random.Random, n: int, tag: str | None = None) -> str:
    """``n`` space-separated words (``tag`` first when given); always ends with a space."""
    n = max(0, int(n))
    out = [tag] if tag and n else []
    out += rng.choices(_VOCAB, k=n - len(out))
    return " ".join(out) + " " if out else ""


def _count(dist, rng: random.Random, low: int = 0) -> int:
    return max(low, int(round(dist.one(rng))))


def _seconds(dist, rng: random.Random) -> float:
    return max(0.0, float(dist.one(rng)))


def from_scenario(scenario: Scenario, sessions: int | None = None, seed: int = 0, nonce: str = "") -> Workload:
    """Draw every session of ``scenario`` (``sessions`` overrides its default count).

    ``nonce`` goes into each session's tag word: repeats against the same endpoint use a new
    nonce so P's prefix cache from an earlier repeat does not serve them; all draws (counts,
    waits, words) depend on ``seed`` only."""
    rng = random.Random(f"kvtrace-bench:{scenario.name}:{seed}")
    system = words(rng, _count(scenario.system_tokens, rng), tag="system:")
    plans = [
        _session(scenario, i, system, random.Random(rng.getrandbits(64)), nonce)
        for i in range(sessions or scenario.sessions)
    ]
    return Workload(scenario.name, plans, seed, thinking=scenario.thinking, keep_reasoning=scenario.keep_reasoning)


def _session(scenario: Scenario, index: int, system: str, rng: random.Random, nonce: str) -> SessionPlan:
    turns: list[TurnPlan] = []
    for spec in scenario.turns:
        for _ in range(spec.repeat):
            t = len(turns)
            tag = f"{nonce}s{index}t{t}:"
            turn = TurnPlan(
                t,
                spec.label,
                _seconds(spec.pause_s, rng) if t else 0.0,
                words(rng, _count(spec.user_tokens, rng, 1), tag),
            )
            for step in spec.steps:
                turn.actions.append(_action(step, rng))
            turns.append(turn)
    return SessionPlan(index, f"{scenario.name}-{index}", system, turns)


def _action(step, rng: random.Random) -> Action:
    if isinstance(step, LLM):
        cut = None if step.interrupt_after is None else _count(step.interrupt_after, rng, 1)
        return LLMAction(_count(step.output_tokens, rng, 1), cut)
    if isinstance(step, Tool):
        return ToolAction(
            [ToolCall(n, _seconds(step.wait_s, rng), words(rng, _count(step.output_tokens, rng))) for n in step.names]
        )
    if isinstance(step, Work):
        return WorkAction(step.name, _seconds(step.duration_s, rng))
    raise TypeError(f"unknown step {step!r}")
