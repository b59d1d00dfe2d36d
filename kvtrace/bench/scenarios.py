"""Agent scenarios as data: what a session does, turn by turn, with random distributions.

A :class:`Scenario` is a shared system prompt plus a list of :class:`TurnSpec`; a turn starts
with a pause (the human or CI thinking), adds a user message, then runs steps in order:
:class:`LLM` (one streamed chat call), :class:`Tool` (tool waits; several names run in parallel
with ``asyncio.gather``) and :class:`Work` (app work).  Token counts are in *words* (one word is
one token for the simulator's tokenizer and about one for BPE tokenizers).  Times are seconds,
multiplied by the bench's ``--time-scale``.

The built-in scenarios (:data:`SCENARIOS`, kebab-case names) each exercise one reuse situation;
``expect`` documents the decision outcome each LLM call should get with bidirectional transfer
on (``kv_recompute_threshold`` 64, ``decoder_kv_blocks_ttl`` 480 s), indexed by turn.  The same
structure loads from JSON (``{"filetype": "kvtrace_scenario", ...}``, see :func:`from_dict`) with
vLLM's distribution objects, and :meth:`Scenario.to_dict` writes it back.

``thinking`` asks for reasoning first (``chat_template_kwargs.enable_thinking``, Qwen3's switch; the
simulator honours it); ``keep_reasoning`` False makes the client drop each answer's reasoning
before the next call, as most agent clients do, so the next prompt no longer extends what D holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvtrace import semconv as sc
from kvtrace.bench.distributions import Constant, Dist, DistributionError, Uniform
from kvtrace.bench.distributions import from_dict as dist_from_dict

FILETYPE = "kvtrace_scenario"


@dataclass(frozen=True)
class LLM:
    """One streamed chat call; ``interrupt_after``: stop reading after that many content chunks."""

    output_tokens: Dist
    interrupt_after: Dist | None = None


@dataclass(frozen=True)
class Tool:
    """A tool wait; more than one name = parallel calls (one span each) under the turn."""

    names: tuple[str, ...]
    wait_s: Dist
    output_tokens: Dist


@dataclass(frozen=True)
class Work:
    """App work between calls (parsing, planning)."""

    name: str
    duration_s: Dist


Step = LLM | Tool | Work


@dataclass(frozen=True)
class TurnSpec:
    label: str
    user_tokens: Dist
    steps: tuple[Step, ...]
    pause_s: Dist = Constant(0.0)
    repeat: int = 1


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    turns: tuple[TurnSpec, ...]
    system_tokens: Dist = Constant(0)
    sessions: int = 4
    expect: dict = field(default_factory=dict)  # turn index -> allowed outcomes of its LLM calls
    thinking: bool = False  # send chat_template_kwargs.enable_thinking: the model reasons first
    keep_reasoning: bool = True  # send the answers' reasoning back in the history

    def with_(self, **changes) -> Scenario:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return {
            "filetype": FILETYPE,
            "name": self.name,
            "description": self.description,
            "sessions": self.sessions,
            "system_tokens": self.system_tokens.to_dict(),
            "thinking": self.thinking,
            "keep_reasoning": self.keep_reasoning,
            "turns": [_turn_dict(t) for t in self.turns],
        }


def _turn_dict(t: TurnSpec) -> dict:
    steps = []
    for s in t.steps:
        if isinstance(s, LLM):
            d = {"output_tokens": s.output_tokens.to_dict()}
            if s.interrupt_after is not None:
                d["interrupt_after"] = s.interrupt_after.to_dict()
            steps.append({"llm": d})
        elif isinstance(s, Tool):
            steps.append(
                {
                    "tool": {
                        "names": list(s.names),
                        "wait_s": s.wait_s.to_dict(),
                        "output_tokens": s.output_tokens.to_dict(),
                    }
                }
            )
        else:
            steps.append({"work": {"name": s.name, "duration_s": s.duration_s.to_dict()}})
    return {
        "label": t.label,
        "repeat": t.repeat,
        "pause_s": t.pause_s.to_dict(),
        "user_tokens": t.user_tokens.to_dict(),
        "steps": steps,
    }


def from_dict(conf: dict) -> Scenario:
    """Parse a ``kvtrace_scenario`` JSON object; raises DistributionError (a ValueError)."""
    if not isinstance(conf, dict) or conf.get("filetype") != FILETYPE:
        raise DistributionError(f'scenario: expected an object with "filetype": "{FILETYPE}"')
    turns_conf = conf.get("turns")
    if not isinstance(turns_conf, list) or not turns_conf:
        raise DistributionError("scenario: 'turns' must be a non-empty list")
    turns = tuple(_turn_from(t, i) for i, t in enumerate(turns_conf))
    sessions = conf.get("sessions", 4)
    if not isinstance(sessions, int) or sessions < 1:
        raise DistributionError("scenario: 'sessions' must be a positive integer")
    flags = {k: conf.get(k, default) for k, default in (("thinking", False), ("keep_reasoning", True))}
    if not all(isinstance(v, bool) for v in flags.values()):
        raise DistributionError("scenario: 'thinking' and 'keep_reasoning' must be booleans")
    return Scenario(
        name=str(conf.get("name") or "custom"),
        description=str(conf.get("description") or ""),
        turns=turns,
        system_tokens=dist_from_dict(conf.get("system_tokens", 0), "scenario.system_tokens"),
        sessions=sessions,
        **flags,
    )


def _turn_from(t: object, i: int) -> TurnSpec:
    where = f"scenario.turns[{i}]"
    if not isinstance(t, dict) or not isinstance(t.get("steps"), list):
        raise DistributionError(f"{where}: expected an object with a 'steps' list")
    steps = []
    for j, s in enumerate(t["steps"]):
        w = f"{where}.steps[{j}]"
        if not isinstance(s, dict) or len(s) != 1:
            raise DistributionError(f'{w}: expected one of {{"llm": ...}}, {{"tool": ...}}, {{"work": ...}}')
        ((kind, body),) = s.items()
        if not isinstance(body, dict):
            raise DistributionError(f"{w}: '{kind}' must be an object")
        if kind == "llm":
            cut = body.get("interrupt_after")
            steps.append(
                LLM(
                    dist_from_dict(body.get("output_tokens"), f"{w}.output_tokens"),
                    None if cut is None else dist_from_dict(cut, f"{w}.interrupt_after"),
                )
            )
        elif kind == "tool":
            names = body.get("names") or [body.get("name") or "tool"]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise DistributionError(f"{w}: 'names' must be a list of strings")
            steps.append(
                Tool(
                    tuple(names),
                    dist_from_dict(body.get("wait_s", 0), f"{w}.wait_s"),
                    dist_from_dict(body.get("output_tokens", 0), f"{w}.output_tokens"),
                )
            )
        elif kind == "work":
            steps.append(
                Work(str(body.get("name") or "work"), dist_from_dict(body.get("duration_s", 0), f"{w}.duration_s"))
            )
        else:
            raise DistributionError(f"{w}: unknown step {kind!r} (llm, tool, work)")
    repeat = t.get("repeat", 1)
    if not isinstance(repeat, int) or repeat < 1:
        raise DistributionError(f"{where}: 'repeat' must be a positive integer")
    return TurnSpec(
        label=str(t.get("label") or f"turn{i}"),
        user_tokens=dist_from_dict(t.get("user_tokens", 0), f"{where}.user_tokens"),
        steps=tuple(steps),
        pause_s=dist_from_dict(t.get("pause_s", 0.0), f"{where}.pause_s"),
        repeat=repeat,
    )


# -- built-in scenarios ------------------------------------------------------------------------
def U(lo, hi) -> Uniform:
    return Uniform(lo, hi)


_REUSE = (sc.OUTCOME_PULLED,)
_FIRST = (sc.OUTCOME_NO_REMOTE,)
_THINK = U(1.0, 5.0)

CODING_AGENT = Scenario(
    name="coding-agent",
    description="error -> explanation -> run tests (tool wait) -> test output -> fix, repeated; "
    "every call after the first should pull D's blocks",
    system_tokens=U(300, 500),
    turns=(
        TurnSpec(
            "fix",
            user_tokens=U(80, 200),
            pause_s=_THINK,
            repeat=4,
            steps=(
                Work("parse_error", U(0.01, 0.05)),
                LLM(U(96, 192)),
                Tool(("run_tests",), U(1.0, 4.0), U(120, 300)),
                LLM(U(80, 160)),
            ),
        ),
    ),
    expect={0: _FIRST + _REUSE, **{i: _REUSE for i in range(1, 4)}},
)

RESEARCH_ASSISTANT = Scenario(
    name="research-assistant",
    description="gather sources (tool waits), compare, user correction, revise",
    system_tokens=U(200, 400),
    turns=(
        TurnSpec(
            "gather",
            U(40, 80),
            (
                Tool(("web_search",), U(1.0, 3.0), U(300, 600)),
                Tool(("fetch_page",), U(0.5, 2.0), U(300, 600)),
                LLM(U(150, 300)),
            ),
        ),
        TurnSpec("compare", U(30, 60), (Work("rank_sources", U(0.05, 0.2)), LLM(U(200, 400))), pause_s=U(5.0, 30.0)),
        TurnSpec("correction", U(10, 30), (LLM(U(100, 200)),), pause_s=U(5.0, 20.0)),
        TurnSpec("revise", U(20, 40), (LLM(U(300, 500)),), pause_s=U(5.0, 30.0)),
    ),
    expect={0: _FIRST, 1: _REUSE, 2: _REUSE, 3: _REUSE},
)

PAUSE_RESUME = Scenario(
    name="pause-resume",
    description="human-in-the-loop: the user pauses longer than D's retention (480 s) before "
    "resuming; the resumed turn finds the blocks expired (or the proxy no longer offers them)",
    system_tokens=U(200, 400),
    turns=(
        TurnSpec("task", U(150, 300), (LLM(U(96, 160)),)),
        TurnSpec("follow-up", U(20, 40), (LLM(U(96, 160)),), pause_s=_THINK),
        TurnSpec("resume", U(20, 40), (LLM(U(96, 160)),), pause_s=Constant(600.0)),
        TurnSpec("after", U(20, 40), (LLM(U(96, 160)),), pause_s=_THINK),
    ),
    expect={0: _FIRST, 1: _REUSE, 2: (sc.OUTCOME_EXPIRED, sc.OUTCOME_NO_REMOTE), 3: _REUSE},
)

SHORT_FOLLOWUPS = Scenario(
    name="short-followups",
    description="short answers and short follow-ups: fewer than 64 reusable tokens per turn, "
    "so P recomputes (below_threshold)",
    system_tokens=U(200, 400),
    turns=(
        TurnSpec("ask", U(200, 400), (LLM(U(16, 32)),)),
        TurnSpec("follow-up", U(4, 12), (LLM(U(8, 24)),), pause_s=_THINK, repeat=5),
    ),
    expect={0: _FIRST, **{i: (sc.OUTCOME_BELOW_THRESHOLD,) for i in range(1, 6)}},
)

NO_REUSE = Scenario(
    name="no-reuse",
    description="independent single-turn requests: nothing to reuse",
    turns=(TurnSpec("ask", U(200, 600), (LLM(U(32, 128)),)),),
    sessions=8,
    expect={0: _FIRST},
)

INTERRUPTED = Scenario(
    name="interrupted",
    description="the client stops reading a stream mid-way (user pressed stop), then continues",
    system_tokens=U(200, 400),
    turns=(
        TurnSpec("ask", U(150, 300), (LLM(U(96, 160)),)),
        TurnSpec("long-answer", U(20, 40), (LLM(U(200, 300), interrupt_after=U(4, 12)),), pause_s=_THINK),
        TurnSpec("retry", U(20, 40), (LLM(U(96, 160)),), pause_s=_THINK),
    ),
    expect={0: _FIRST},
)

PARALLEL_TOOLS = Scenario(
    name="parallel-tools",
    description="plan -> three tool calls in parallel (asyncio.gather) -> synthesize, repeated",
    system_tokens=U(300, 500),
    turns=(
        TurnSpec(
            "plan-act",
            U(40, 80),
            (
                LLM(U(80, 128)),
                Tool(("search_code", "read_file", "run_linter"), U(0.5, 3.0), U(80, 200)),
                Work("merge_results", U(0.01, 0.05)),
                LLM(U(96, 192)),
            ),
            pause_s=_THINK,
            repeat=3,
        ),
    ),
    expect={0: _FIRST + _REUSE, 1: _REUSE, 2: _REUSE},
)

REASONING_STRIP = Scenario(
    name="reasoning-strip",
    description="a thinking model behind a client that drops each answer's reasoning before the next call "
    "(as most agent clients do): every later call diverges at the previous assistant message, so D's "
    "blocks cannot be used and P recomputes (offer reason diverged)",
    system_tokens=U(300, 500),
    thinking=True,
    keep_reasoning=False,
    turns=(
        TurnSpec(
            "fix",
            user_tokens=U(80, 200),
            pause_s=_THINK,
            repeat=3,
            steps=(LLM(U(96, 192)), Tool(("run_tests",), U(1.0, 4.0), U(120, 300)), LLM(U(80, 160))),
        ),
    ),
    expect={i: _FIRST for i in range(3)},
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        CODING_AGENT,
        RESEARCH_ASSISTANT,
        PAUSE_RESUME,
        SHORT_FOLLOWUPS,
        NO_REUSE,
        INTERRUPTED,
        PARALLEL_TOOLS,
        REASONING_STRIP,
    )
}


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise DistributionError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}") from None
