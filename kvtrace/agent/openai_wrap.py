"""Tracing for the official ``openai`` client (sync and async).

:func:`instrument_openai` replaces ``client.chat.completions.create`` and
``client.completions.create`` on one client instance (no class is patched, nothing global);
:class:`TracedOpenAI` / :class:`TracedAsyncOpenAI` are clients that do it to themselves.  Each
call becomes a ``kvtrace.agent.llm_call`` span that

- sends ``traceparent`` / ``baggage`` / ``X-Session-ID`` headers and, inside a session, the body
  field ``conversation_id`` (what the kvtrace proxy and vLLM's multi-turn proxy key on);
- asks streams for ``stream_options.include_usage`` (unless the caller set it) to get tokens;
- records TTFT (first content chunk), TPOT, tokens (cached prompt tokens as
  ``gen_ai.usage.cache_read.input_tokens``: the proxy's local hit + pulled, else the usage's
  ``prompt_tokens_details.cached_tokens``) and the proxy's ``kv_transfer`` object (a top-level field
  of non-streaming responses, the final chunk of streams);
- ends when the stream is exhausted, closed (``close()`` / ``with``) or garbage-collected; a
  stream abandoned before its end is recorded as ``error.type=stream_interrupted``.

Results: ``stream.result`` / ``stream.kv_transfer`` on the returned stream wrapper,
``kvtrace.agent.last_result()`` / ``last_kv_transfer()`` after any call, and for non-streaming
responses ``response.model_extra["kv_transfer"]`` as the proxy sent it.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import openai
from opentelemetry import context as otel_context

from kvtrace import semconv as sc
from kvtrace.agent.api import Agent, current_agent
from kvtrace.agent.llm import LLMCall

log = logging.getLogger(__name__)
_MARK = "_kvtrace_instrumented"


def instrument_openai(client, tracer_provider=None, *, agent: Agent | None = None):
    """Trace ``client``'s chat and text completions (sync ``OpenAI`` or ``AsyncOpenAI``);
    returns the same client.  ``agent`` (else one on ``tracer_provider``) makes the spans; inside
    a session the session's agent is used.  Idempotent."""
    if getattr(client, _MARK, False):
        return client
    is_async = isinstance(client, openai.AsyncOpenAI)
    fixed = agent or (Agent(tracer_provider) if tracer_provider is not None else None)
    for resource, operation in ((client.chat.completions, sc.OP_CHAT), (client.completions, sc.OP_TEXT_COMPLETION)):
        original = resource.create
        wrapper = _async_create if is_async else _sync_create
        resource.create = functools.update_wrapper(
            functools.partial(wrapper, original, client, fixed, operation), original
        )
    setattr(client, _MARK, True)
    return client


class TracedOpenAI(openai.OpenAI):
    """``openai.OpenAI`` whose completions are traced (see :func:`instrument_openai`)."""

    def __init__(self, *args, tracer_provider=None, agent: Agent | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        instrument_openai(self, tracer_provider, agent=agent)


class TracedAsyncOpenAI(openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` whose completions are traced (see :func:`instrument_openai`)."""

    def __init__(self, *args, tracer_provider=None, agent: Agent | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        instrument_openai(self, tracer_provider, agent=agent)


# -- request side ---------------------------------------------------------------------------
def begin(client, agent: Agent | None, operation: str, kwargs: dict) -> tuple[LLMCall, dict]:
    """Start the span and return the kwargs to send (headers, body fields, include_usage); also
    :mod:`kvtrace.agent.direct`'s."""
    agent = agent or current_agent(None)
    stream = bool(kwargs.get("stream"))
    host, port = _server(client)
    call = LLMCall(
        agent,
        model=kwargs.get("model"),
        operation=operation,
        stream=stream,
        max_tokens=kwargs.get("max_tokens", kwargs.get("max_completion_tokens")),
        server_address=host,
        server_port=port,
        input_messages=kwargs.get("messages", kwargs.get("prompt")),
    ).start()
    send = dict(kwargs)
    try:
        send["extra_headers"] = {**call.headers(), **(kwargs.get("extra_headers") or {})}
        body = dict(kwargs.get("extra_body") or {})
        for key, value in call.extra_body().items():
            body.setdefault(key, value)
        if body:
            send["extra_body"] = body
        if stream:
            opts = kwargs.get("stream_options")
            opts = dict(opts) if isinstance(opts, dict) else {}
            opts.setdefault("include_usage", True)
            send["stream_options"] = opts
    except Exception:  # telemetry never breaks the call
        log.exception("kvtrace: preparing trace headers failed; sending the request untouched")
        send = dict(kwargs)
    return call, send


def _server(client) -> tuple[str | None, int | None]:
    try:
        url = client.base_url
        return url.host or None, url.port
    except Exception:
        return None, None


def _sync_create(original, client, agent, operation, *args, **kwargs):
    try:
        call, send = begin(client, agent, operation, kwargs)
    except Exception:  # telemetry never breaks the call
        log.exception("kvtrace: starting the llm_call span failed; calling untraced")
        return original(*args, **kwargs)
    token = otel_context.attach(call.context())
    try:
        response = original(*args, **send)
    except BaseException as exc:
        call.fail(exc)
        raise
    finally:
        otel_context.detach(token)
    if send.get("stream"):
        return TracedStream(response, call)
    _finish_response(call, response)
    return response


async def _async_create(original, client, agent, operation, *args, **kwargs):
    try:
        call, send = begin(client, agent, operation, kwargs)
    except Exception:  # telemetry never breaks the call
        log.exception("kvtrace: starting the llm_call span failed; calling untraced")
        return await original(*args, **kwargs)
    token = otel_context.attach(call.context())
    try:
        response = await original(*args, **send)
    except BaseException as exc:
        call.fail(exc)
        raise
    finally:
        otel_context.detach(token)
    if send.get("stream"):
        return TracedAsyncStream(response, call)
    _finish_response(call, response)
    return response


# -- response side ----------------------------------------------------------------------------
def kv_transfer_of(obj: Any) -> dict | None:
    """The ``kv_transfer`` object on a response or chunk (pydantic extra field), or None."""
    extra = getattr(obj, "model_extra", None) or {}
    value = extra.get(sc.RESPONSE_KV_TRANSFER)
    return value if isinstance(value, dict) else None


def _usage(obj: Any) -> tuple[int | None, int | None]:
    usage = getattr(obj, "usage", None)
    if usage is None:
        return None, None
    return getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)


def _cached(obj: Any) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` (OpenAI's cached prompt tokens), if given."""
    details = getattr(getattr(obj, "usage", None), "prompt_tokens_details", None)
    return getattr(details, "cached_tokens", None) if details is not None else None


def _finish_response(call: LLMCall, response: Any) -> None:
    try:
        texts, reasons = [], []
        for choice in getattr(response, "choices", None) or []:
            message = getattr(choice, "message", None)
            texts.append(
                (getattr(message, "content", None) if message is not None else getattr(choice, "text", None)) or ""
            )
            if getattr(choice, "finish_reason", None):
                reasons.append(choice.finish_reason)
        inp, out = _usage(response)
        call.finish(
            input_tokens=inp,
            output_tokens=out,
            cached_tokens=_cached(response),
            kv_transfer=kv_transfer_of(response),
            finish_reasons=reasons,
            output_text="".join(texts),
        )
    except Exception:
        log.exception("kvtrace: reading the response failed")
        call.finish()


class _StreamState:
    """What a stream wrapper accumulates from chunks."""

    def __init__(self, call: LLMCall) -> None:
        self.call = call
        self.kv_transfer: dict | None = None
        self.usage: tuple[int | None, int | None] = (None, None)
        self.cached: int | None = None
        self.reasons: list[str] = []

    def chunk(self, chunk: Any) -> None:
        try:
            kvt = kv_transfer_of(chunk)
            if kvt is not None:
                self.kv_transfer = kvt
            inp, out = _usage(chunk)
            if inp is not None or out is not None:
                self.usage = (inp, out)
                self.cached = _cached(chunk)
            text, has_content = _chunk_text(chunk, self.reasons)
            self.call.observe(text, content=has_content)
        except Exception:
            log.exception("kvtrace: reading a stream chunk failed")

    def end(self, exc: BaseException | None = None, interrupted: bool = False) -> None:
        measured = dict(
            input_tokens=self.usage[0],
            output_tokens=self.usage[1],
            kv_transfer=self.kv_transfer,
            finish_reasons=self.reasons,
            cached_tokens=self.cached,
        )
        if exc is not None:
            self.call.fail(exc, **measured)
        else:
            self.call.finish(interrupted=interrupted, **measured)


def _chunk_text(chunk: Any, reasons: list[str]) -> tuple[str, bool]:
    text, content = [], False
    for choice in getattr(chunk, "choices", None) or []:
        if getattr(choice, "finish_reason", None):
            reasons.append(choice.finish_reason)
        delta = getattr(choice, "delta", None)
        if delta is None:  # text completion chunk
            piece = getattr(choice, "text", None)
            if piece:
                text.append(piece)
                content = True
            continue
        piece = getattr(delta, "content", None)
        if piece:
            text.append(piece)
        extra = getattr(delta, "model_extra", None) or {}
        if (
            piece
            or getattr(delta, "tool_calls", None)
            or getattr(delta, "refusal", None)
            or extra.get("reasoning_content")
            or extra.get("reasoning")
        ):
            content = True
    return "".join(text), content


class _StreamBase:
    def __init__(self, stream: Any, call: LLMCall) -> None:
        self._stream = stream
        self._state = _StreamState(call)
        self._done = False

    @property
    def llm_call(self) -> LLMCall:
        return self._state.call

    @property
    def result(self):
        """:class:`~kvtrace.agent.llm.LLMResult` (complete once the stream has ended)."""
        return self._state.call.result

    @property
    def kv_transfer(self) -> dict | None:
        """The proxy's ``kv_transfer`` object (known once the final chunk has arrived)."""
        return self._state.kv_transfer

    def _end(self, exc: BaseException | None = None, interrupted: bool = False) -> None:
        if not self._done:
            self._done = True
            self._state.end(exc, interrupted)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._stream, name)

    def __del__(self) -> None:
        try:
            self._end(interrupted=True)
        except Exception:
            pass


class TracedStream(_StreamBase):
    """Wraps ``openai.Stream``: iterate it, close it, or use it as a context manager."""

    def __iter__(self):
        return self

    def __next__(self):
        try:
            chunk = next(self._stream)
        except StopIteration:
            self._end()
            raise
        except BaseException as exc:
            self._end(exc)
            raise
        self._state.chunk(chunk)
        return chunk

    def close(self) -> None:
        self._end(interrupted=True)
        self._stream.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            self._end(exc)
        self.close()


class TracedAsyncStream(_StreamBase):
    """Wraps ``openai.AsyncStream``: ``async for``, ``await close()``, ``async with``."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            chunk = await self._stream.__anext__()
        except StopAsyncIteration:
            self._end()
            raise
        except BaseException as exc:
            self._end(exc)
            raise
        self._state.chunk(chunk)
        return chunk

    async def close(self) -> None:
        self._end(interrupted=True)
        await self._stream.close()

    async def aclose(self) -> None:
        await self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            self._end(exc)
        await self.close()
