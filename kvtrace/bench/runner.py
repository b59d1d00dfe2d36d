"""Execute one planned session against an OpenAI-compatible endpoint, as an agent would.

:class:`SessionRunner` is driven by :mod:`kvtrace.bench.api`: for each
:class:`~kvtrace.bench.workload.SessionPlan` it opens a ``kvtrace.agent.session`` span, and per
turn pauses (a ``kvtrace.agent.user_pause`` span outside the turn span), opens a turn span, then
runs the planned actions: streamed chat calls through the traced ``openai`` client (so each is an
llm_call span whose traceparent and conversation id reach the proxy), tool waits (parallel ones
with ``asyncio.gather``) and app work.  The endpoint's actual answer is appended to the history, so
the next turn's prompt extends what D holds (with its reasoning, unless the workload drops it: then
it does not).  It returns plain records for :mod:`kvtrace.bench.stats`.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import openai

from kvtrace import semconv as sc
from kvtrace.agent.api import Agent
from kvtrace.agent.direct import sdk_http
from kvtrace.bench.workload import LLMAction, SessionPlan, ToolAction, TurnPlan, WorkAction

Sleep = Callable[[float], Awaitable[None]]
PAUSE_REASON = "think"  # the scenarios' pauses: the user (or CI) thinking before the next turn


@dataclass
class RequestRecord:
    session: str
    turn: int
    call: int  # index of the LLM call within the session (the proxy's turn index)
    label: str
    start_s: float  # since the run started
    latency_ms: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    max_tokens: int | None = None
    outcome: str | None = None
    pulled_tokens: int | None = None
    offered: bool | None = None
    offer_reason: str | None = None
    recomputed_tokens: int | None = None  # prompt tokens P computed (the proxy's kv_transfer object)
    error: str | None = None
    interrupted: bool = False
    trace_id: str | None = None
    request_id: str | None = None
    wait_ms: float = 0.0  # queued for a client slot / the request-rate pacer
    repeat: int = 0


@dataclass
class TurnRecord:
    session: str
    turn: int
    label: str
    latency_ms: float  # completed task: user message to final answer (tools and app work included)
    llm_ms: float = 0.0
    tool_ms: float = 0.0
    work_ms: float = 0.0
    requests: int = 0
    error: str | None = None
    repeat: int = 0


@dataclass
class SessionRecord:
    session: str
    name: str
    wall_ms: float  # first turn start to last answer, pauses included
    active_ms: float  # pauses excluded
    turns: int
    requests: int
    error: str | None = None
    repeat: int = 0


@dataclass
class RunOptions:
    """Knobs shared by every session of a run (see ``kvtrace bench --help``)."""

    model: str
    time_scale: float = 1.0
    ignore_eos: bool = True
    request_timeout_s: float = 600.0
    agent_name: str = "kvtrace-bench"
    scenario: str | None = None
    thinking: bool = False  # ask for reasoning first (chat_template_kwargs.enable_thinking)
    keep_reasoning: bool = True  # send each answer's reasoning back with it


class Pacer:
    """Poisson request arrivals at ``rate`` requests/s across the run (inf = no pacing)."""

    def __init__(self, rate: float, seed: int, sleep: Sleep) -> None:
        self.rate = rate
        self.rng = random.Random(f"kvtrace-bench:pacer:{seed}")
        self.sleep = sleep
        self.next_at: float | None = None

    async def wait(self) -> None:
        if not self.rate or self.rate == float("inf"):
            return
        now = time.perf_counter()
        self.next_at = max(now, self.next_at or now) + self.rng.expovariate(self.rate)
        delay = self.next_at - now
        if delay > 0:
            await self.sleep(delay)


@dataclass
class Collector:
    """Where records go; ``on_request`` feeds the progress bar."""

    t0: float
    repeat: int = 0
    requests: list[RequestRecord] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    sessions: list[SessionRecord] = field(default_factory=list)
    on_request: Callable[[RequestRecord], None] | None = None

    def add_request(self, rec: RequestRecord) -> None:
        rec.repeat = self.repeat
        self.requests.append(rec)
        if self.on_request is not None:
            self.on_request(rec)


class _Abort(Exception):
    """An LLM call failed: the session cannot continue without its answer."""


class SessionRunner:
    def __init__(
        self,
        client,
        agent: Agent,
        opts: RunOptions,
        out: Collector,
        *,
        slots: asyncio.Semaphore,
        pacer: Pacer,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.client, self.agent, self.opts, self.out = client, agent, opts, out
        self.slots, self.pacer, self.sleep = slots, pacer, sleep

    async def _wait(self, seconds: float) -> None:
        if seconds > 0 and self.opts.time_scale > 0:
            await self.sleep(seconds * self.opts.time_scale)

    async def _pause(self, seconds: float) -> None:
        """The user's pause before a turn (think time, a resumed session's gap): a user-pause span,
        so the breakdown shows it as the user's time, not the agent's app work."""
        if seconds > 0 and self.opts.time_scale > 0:
            async with self.agent.user_pause(PAUSE_REASON):
                await self._wait(seconds)

    async def run(self, plan: SessionPlan, session_id: str) -> SessionRecord:
        t0, paused, error, calls = time.perf_counter(), 0.0, None, [0]
        history: list[dict] = [{"role": "system", "content": plan.system_text}] if plan.system_text else []
        pending: list[str] = []
        done = 0
        async with self.agent.session(session_id, self.opts.agent_name, self.opts.scenario):
            for turn in plan.turns:
                p0 = time.perf_counter()
                await self._pause(turn.pause_s)
                paused += time.perf_counter() - p0
                rec = TurnRecord(session_id, turn.index, turn.label, 0.0, repeat=self.out.repeat)
                try:
                    await self._turn(turn, session_id, history, pending, rec, calls)
                except _Abort as exc:
                    error = rec.error = str(exc)
                finally:
                    self.out.turns.append(rec)
                done += 1
                if error:
                    break
        wall = (time.perf_counter() - t0) * 1e3
        record = SessionRecord(session_id, plan.name, wall, wall - paused * 1e3, done, calls[0], error, self.out.repeat)
        self.out.sessions.append(record)
        return record

    async def _turn(self, turn: TurnPlan, sid: str, history: list, pending: list, rec: TurnRecord, calls: list) -> None:
        t0 = time.perf_counter()
        try:
            async with self.agent.turn(turn.index):
                pending.append(turn.user_text)
                for k, action in enumerate(turn.actions):
                    a0 = time.perf_counter()
                    if isinstance(action, LLMAction):
                        history.append({"role": "user", "content": "\n\n".join(pending) or "continue"})
                        pending.clear()
                        rec.requests += 1
                        answer, reasoning = await self._llm(history, action, sid, turn, calls)
                        message = {"role": "assistant", "content": answer}
                        if reasoning and self.opts.keep_reasoning:
                            message["reasoning"] = reasoning
                        history.append(message)
                        rec.llm_ms += (time.perf_counter() - a0) * 1e3
                    elif isinstance(action, ToolAction):
                        ids = [f"call_{turn.index}_{k}_{j}" for j in range(len(action.calls))]
                        pending += await asyncio.gather(
                            *(self._tool(c, i) for c, i in zip(action.calls, ids, strict=True))
                        )
                        rec.tool_ms += (time.perf_counter() - a0) * 1e3
                    elif isinstance(action, WorkAction):
                        async with self.agent.app_work(action.name):
                            await self._wait(action.duration_s)
                        rec.work_ms += (time.perf_counter() - a0) * 1e3
        finally:
            rec.latency_ms = (time.perf_counter() - t0) * 1e3

    async def _tool(self, call, call_id: str) -> str:
        async with self.agent.tool_call(call.name, call_id):
            await self._wait(call.wait_s)
        return f"[{call.name} output] {call.output}"

    async def _llm(self, history: list, action: LLMAction, sid: str, turn: TurnPlan, calls: list) -> tuple[str, str]:
        q0 = time.perf_counter()
        await self.pacer.wait()
        async with self.slots:
            rec = RequestRecord(
                sid,
                turn.index,
                calls[0],
                turn.label,
                time.perf_counter() - self.out.t0,
                max_tokens=action.max_tokens,
                wait_ms=(time.perf_counter() - q0) * 1e3,
            )
            calls[0] += 1
            extra = {"ignore_eos": True} if self.opts.ignore_eos else {}
            if self.opts.thinking:
                extra["chat_template_kwargs"] = {"enable_thinking": True}
            stream = None
            try:
                stream = await self.client.chat.completions.create(
                    model=self.opts.model,
                    messages=list(history),
                    max_tokens=action.max_tokens,
                    stream=True,
                    extra_body=extra or None,
                    timeout=self.opts.request_timeout_s,
                )
                answer = await _read(stream, action.interrupt_after)
            except (TimeoutError, openai.APIError, OSError, sdk_http().TransportError) as exc:
                # the SDK wraps its request's errors, not its stream's: a read that times out or
                # breaks mid-answer raises the HTTP library's own (httpx's ReadTimeout, ...)
                rec.error = type(exc).__name__
                raise _Abort(f"llm call {rec.call} failed: {rec.error}") from None
            finally:
                if stream is not None:
                    await stream.close()
                    _fill(rec, stream.result)
                self.out.add_request(rec)
        return answer


async def _read(stream, interrupt_after: int | None) -> tuple[str, str]:
    """(content, reasoning) read from the stream (vLLM's reasoning parser: ``reasoning`` deltas)."""
    parts: list[str] = []
    thoughts: list[str] = []
    n = 0
    async for chunk in stream:
        for choice in chunk.choices or ():
            piece = getattr(choice.delta, "content", None)
            if piece:
                parts.append(piece)
                n += 1
            thought = getattr(choice.delta, "reasoning", None) or getattr(choice.delta, "reasoning_content", None)
            if thought:
                thoughts.append(thought)
                n += 1
        if interrupt_after is not None and n >= interrupt_after:
            break
    return "".join(parts), "".join(thoughts)


def _fill(rec: RequestRecord, result) -> None:
    if result is None:
        return
    rec.latency_ms, rec.ttft_ms, rec.tpot_ms = result.latency_ms, result.ttft_ms, result.tpot_ms
    rec.input_tokens, rec.output_tokens = result.input_tokens, result.output_tokens
    rec.trace_id, rec.interrupted = result.trace_id, result.interrupted
    if rec.error is None and result.error and not result.interrupted:
        rec.error = result.error
    kvt = result.kv_transfer or {}
    rec.outcome, rec.pulled_tokens = result.outcome, result.pulled_tokens
    rec.offered = kvt.get(sc.KVT_OFFERED)
    rec.offer_reason = kvt.get(sc.KVT_OFFER_REASON)
    rec.recomputed_tokens = kvt.get(sc.KVT_RECOMPUTED_TOKENS)
    rec.request_id = kvt.get(sc.KVT_REQUEST_ID)
