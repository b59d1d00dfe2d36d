"""The agent API: sessions, turns, LLM calls, tool calls, app work and user pauses as spans.

An :class:`Agent` binds a tracer (from the ``tracer_provider`` it is given -- kvtrace never
relies on the global provider unless you pass none) and hands out scopes::

    agent = Agent(tracer_provider=provider, name="coder")
    async with agent.session(scenario="demo") as s:      # kvtrace.agent.session (invoke_agent)
        with agent.turn():                               # kvtrace.agent.turn, index 0, 1, ...
            with agent.app_work("plan"): ...             # kvtrace.agent.app_work
            await asyncio.gather(run("a"), run("b"))     # tool calls keep the turn as parent
            with agent.llm_call(model="m") as call:      # kvtrace.agent.llm_call (CLIENT, chat)
                http.post(url, headers=call.headers(), json={**body, **call.extra_body()})
        async with agent.user_pause("think"):            # kvtrace.agent.user_pause
            reply = await ask_user()                     # waiting for the user, not app work

The module-level functions (:func:`session`, :func:`turn`, :func:`tool_call`, :func:`app_work`,
:func:`user_pause`, :func:`traced_tool`, :func:`llm_call`) use the agent of the session open in the current task, or
an agent on ``tracer_provider`` / the global provider outside one.  State lives in
``contextvars`` (:mod:`kvtrace.agent.context`), so asyncio tasks and threads never mix sessions.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from opentelemetry import baggage, trace
from opentelemetry.trace import TracerProvider

import kvtrace
from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.agent import context as actx
from kvtrace.agent.llm import LLMCall
from kvtrace.agent.scopes import SpanScope, reset_var, scoped
from kvtrace.semconv.ids import id_problem

DEFAULT_AGENT_NAME = "kvtrace-agent"
log = logging.getLogger(__name__)


class _Count:
    """A thread-safe running count (``value``)."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.value += 1


REPLACED_SESSION_IDS = _Count()
"""Session ids given to :meth:`Agent.session` that were not valid ids, replaced by fresh ones."""


def _valid_session_id(session_id: str | None) -> str:
    if session_id is None or session_id == "":
        return uuid.uuid4().hex
    problem = id_problem(session_id)
    if problem is None:
        return session_id
    REPLACED_SESSION_IDS.add()
    fresh = uuid.uuid4().hex
    log.warning("kvtrace agent: session id %s; using %s instead", problem, fresh)  # never the value itself
    return fresh


class Agent:
    """Factory of agent spans on one tracer.  Cheap; make one per component."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        name: str = DEFAULT_AGENT_NAME,
        *,
        capture_content: bool | None = None,
    ) -> None:
        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer_provider = provider
        self.tracer = provider.get_tracer("kvtrace.agent", kvtrace.__version__)
        self.name = name
        self.capture_content = bool(settings.CAPTURE_CONTENT.get(capture_content))

    # -- session ------------------------------------------------------------------------
    def session(
        self, session_id: str | None = None, agent_name: str | None = None, scenario: str | None = None
    ) -> SpanScope:
        """A ``kvtrace.agent.session`` span (invoke_agent).  Entering yields a
        :class:`~kvtrace.agent.context.SessionState`; inside it, requests carry the session id
        (header, body field, baggage) and turns are numbered 0, 1, ...  A ``session_id`` that is
        not a valid id (:func:`kvtrace.semconv.ids.id_problem`) is replaced by a fresh one and
        counted (:data:`REPLACED_SESSION_IDS`): it would reach headers, spans and reports."""
        state = actx.SessionState(
            session_id=_valid_session_id(session_id),
            agent=self,
            agent_name=agent_name or self.name,
            scenario=scenario,
        )
        attrs = {
            sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
            sc.OPENINFERENCE_SPAN_KIND: sc.OI_AGENT,
            sc.GEN_AI_AGENT_NAME: state.agent_name,
            sc.SESSION_ID: state.session_id,
            sc.GEN_AI_CONVERSATION_ID: state.session_id,
        }
        if scenario:
            attrs[sc.AGENT_SCENARIO] = scenario
        holder: dict[str, Any] = {}

        def enter(scope: SpanScope):
            state.span = scope.span
            holder["s"] = actx._session.set(state)
            holder["t"] = actx._turn.set(None)
            return state

        def leave(scope: SpanScope) -> None:
            reset_var(actx._turn, holder.pop("t", None))
            reset_var(actx._session, holder.pop("s", None))

        scope = SpanScope(
            self.tracer,
            sc.SPAN_AGENT_SESSION,
            lambda: dict(attrs),
            on_enter=enter,
            on_exit=leave,
            extra_context=lambda: baggage.set_baggage(sc.BAGGAGE_SESSION_ID, state.session_id),
        )
        scope.factory = lambda: self.session(session_id, agent_name, scenario)
        return scope

    # -- turn ---------------------------------------------------------------------------
    def turn(self, index: int | None = None) -> SpanScope:
        """A ``kvtrace.agent.turn`` span.  ``index`` None = the session's next index (0 first)."""
        holder: dict[str, Any] = {}

        def attributes() -> dict:
            state = actx.current_session()
            if index is None:
                idx = state.next_turn() if state is not None else 0
            else:
                idx = int(index)
                if state is not None:
                    state.reserve_turn(idx)
            holder["turn"] = actx.TurnState(index=idx)
            # one agent run per turn (GenAI invoke_agent); a CHAIN under the session's AGENT for OpenInference
            attrs: dict[str, Any] = {
                sc.TURN_INDEX: idx,
                sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
                sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN,
            }
            if state is not None:
                attrs.update({sc.GEN_AI_AGENT_NAME: state.agent_name, **_session_attrs(state)})
            return attrs

        def enter(scope: SpanScope):
            turn_state = holder["turn"]
            turn_state.span = scope.span
            holder["t"] = actx._turn.set(turn_state)
            return turn_state

        def leave(scope: SpanScope) -> None:
            reset_var(actx._turn, holder.pop("t", None))

        scope = SpanScope(self.tracer, sc.SPAN_AGENT_TURN, attributes, on_enter=enter, on_exit=leave)
        scope.factory = lambda: self.turn(index)
        return scope

    # -- tools and app work ---------------------------------------------------------------
    def tool_call(self, name: str, call_id: str | None = None) -> SpanScope:
        """A ``kvtrace.agent.tool_call`` span (execute_tool): the agent waits on a tool."""

        def attributes() -> dict:
            attrs: dict[str, Any] = {
                sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
                sc.OPENINFERENCE_SPAN_KIND: sc.OI_TOOL,
                sc.GEN_AI_TOOL_NAME: name,
                sc.GEN_AI_TOOL_TYPE: sc.TOOL_TYPE_FUNCTION,
            }
            if call_id:
                attrs[sc.GEN_AI_TOOL_CALL_ID] = call_id
            return {**attrs, **_where()}

        return SpanScope(self.tracer, sc.SPAN_AGENT_TOOL_CALL, attributes)

    def app_work(self, name: str) -> SpanScope:
        """A ``kvtrace.agent.app_work`` span: the agent's own work (parse, plan, I/O)."""

        def attributes() -> dict:
            return {
                sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TASK,
                sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN,
                sc.AGENT_WORK_NAME: name,
                **_where(),
            }

        return SpanScope(self.tracer, sc.SPAN_AGENT_APP_WORK, attributes)

    def user_pause(self, reason: str | None = None) -> SpanScope:
        """A ``kvtrace.agent.user_pause`` span: the agent waits for its user (think time, an
        approval, a resumed session's gap).  The breakdown views count it as a part of its own,
        ``user_pause_ms``, instead of app work; ``reason`` (optional) says what it waits for."""

        def attributes() -> dict:
            attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_USER_PAUSE, sc.OPENINFERENCE_SPAN_KIND: sc.OI_CHAIN}
            return {**attrs, **({sc.AGENT_PAUSE_REASON: reason} if reason else {}), **_where()}

        return SpanScope(self.tracer, sc.SPAN_AGENT_USER_PAUSE, attributes)

    def traced_tool(self, name: str | None = None) -> Callable[[Callable], Callable]:
        """Decorator: every call of the (sync or async) function is a tool call span."""

        def decorate(fn: Callable) -> Callable:
            return scoped(fn, lambda: self.tool_call(name or fn.__name__))

        return decorate

    # -- LLM calls ----------------------------------------------------------------------
    def llm_call(
        self,
        model: str | None = None,
        *,
        operation: str = sc.OP_CHAT,
        stream: bool = False,
        max_tokens: int | None = None,
        request_id: str | None = None,
        server_address: str | None = None,
        server_port: int | None = None,
        input_messages: Any = None,
    ) -> LLMCall:
        """A ``kvtrace.agent.llm_call`` CLIENT span for a request you send yourself; use
        ``call.headers()`` / ``call.extra_body()`` on the request and ``call.observe()`` /
        ``call.finish(...)`` for what comes back."""
        return LLMCall(
            self,
            model=model,
            operation=operation,
            stream=stream,
            max_tokens=max_tokens,
            request_id=request_id,
            server_address=server_address,
            server_port=server_port,
            input_messages=input_messages,
        )


def _session_attrs(state) -> dict:
    return {sc.SESSION_ID: state.session_id, sc.GEN_AI_CONVERSATION_ID: state.session_id}


def _where() -> dict:
    """session.id (and gen_ai.conversation.id) / turn index of the current task, for tool, app-work
    and user-pause spans."""
    attrs: dict[str, Any] = {}
    state, turn_state = actx.current_session(), actx.current_turn()
    if state is not None:
        attrs.update(_session_attrs(state))
    if turn_state is not None:
        attrs[sc.TURN_INDEX] = turn_state.index
    return attrs


# -- module-level API ---------------------------------------------------------------------
def current_agent(tracer_provider: TracerProvider | None = None) -> Agent:
    """The agent of the open session; else a new one on ``tracer_provider`` (or the global one)."""
    state = actx.current_session()
    if state is not None and tracer_provider is None:
        return state.agent
    return Agent(tracer_provider)


def session(
    session_id: str | None = None,
    agent_name: str = DEFAULT_AGENT_NAME,
    scenario: str | None = None,
    *,
    tracer_provider: TracerProvider | None = None,
) -> SpanScope:
    return Agent(tracer_provider, name=agent_name).session(session_id, agent_name, scenario)


def turn(index: int | None = None, *, tracer_provider: TracerProvider | None = None) -> SpanScope:
    return current_agent(tracer_provider).turn(index)


def tool_call(name: str, call_id: str | None = None, *, tracer_provider: TracerProvider | None = None) -> SpanScope:
    return current_agent(tracer_provider).tool_call(name, call_id)


class _LateScope:
    """``app_work(name)`` outside an agent: resolves the agent when entered or called."""

    def __init__(self, factory: Callable[[], SpanScope]) -> None:
        self._factory = factory
        self._scope: SpanScope | None = None

    def __enter__(self):
        self._scope = self._factory()
        return self._scope.__enter__()

    def __exit__(self, *exc):
        return self._scope.__exit__(*exc)

    async def __aenter__(self):
        return self.__enter__()

    async def __aexit__(self, *exc):
        return self.__exit__(*exc)

    def __call__(self, fn: Callable) -> Callable:
        return scoped(fn, self._factory)


def app_work(name: str, *, tracer_provider: TracerProvider | None = None) -> _LateScope:
    """Context manager or decorator; the agent is the one of the session open at entry."""
    return _LateScope(lambda: current_agent(tracer_provider).app_work(name))


def user_pause(reason: str | None = None, *, tracer_provider: TracerProvider | None = None) -> _LateScope:
    """Context manager or decorator: a user pause of the session open at entry."""
    return _LateScope(lambda: current_agent(tracer_provider).user_pause(reason))


def traced_tool(name: str | None = None, *, tracer_provider: TracerProvider | None = None):
    """Decorator: each call is a tool-call span under the session/turn open at call time."""

    def decorate(fn: Callable) -> Callable:
        return scoped(fn, lambda: current_agent(tracer_provider).tool_call(name or fn.__name__))

    return decorate


def llm_call(model: str | None = None, *, tracer_provider: TracerProvider | None = None, **kwargs) -> LLMCall:
    return current_agent(tracer_provider).llm_call(model, **kwargs)
