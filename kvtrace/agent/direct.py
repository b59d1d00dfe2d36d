"""A traced streaming chat client without the ``openai`` SDK's machinery, for the bench on the
virtual clock (:mod:`kvtrace.bench.inproc`), where the SDK was a quarter of the loop's CPU
(request building, httpx's pool, a pydantic object per chunk).

:class:`DirectChat` wraps a :class:`~kvtrace.agent.openai_wrap.TracedAsyncOpenAI` and replaces
one call, ``chat.completions.create(..., stream=True)``: it sends the request the SDK sends (same
URL, headers and JSON bytes: :func:`request_of`), reads the same server-sent events, and hands the
stream wrapper the same fields (``choices[].delta``, ``finish_reason``, ``usage``, the proxy's
``kv_transfer``), so the ``kvtrace.agent.llm_call`` span and its result are the ones the SDK path
makes.  Failures raise what the SDK raises (a status error through the SDK's own mapping,
``APITimeoutError`` or ``APIConnectionError`` before the response, an event's ``APIError``,
httpx's ``ReadTimeout`` mid-stream).  The SDK draws a uuid4 per request (its idempotency key), and
so does this client: on the virtual clock uuid4 is seeded, and every later id stays the SDK
path's.  Everything else (``models.list``, ``close``) is the wrapped client's.  Chunks are
:class:`_Fields`: the event's JSON as attributes, nested objects likewise, ``model_extra`` the
whole mapping (the wrapper only looks up fields the SDK keeps as extras there).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
from opentelemetry import context as otel_context

from kvtrace import jsoncodec as codec
from kvtrace import semconv as sc
from kvtrace.agent.openai_wrap import TracedAsyncStream, begin

try:
    import orjson as _orjson
except ImportError:  # the agent extra installs it; without it the standard library writes the same bytes
    _orjson = None  # type: ignore[assignment]

_BODY_ORDER = ("model", "stream", "messages", "max_tokens", "stream_options")  # the SDK's order
_INT_MIN, _INT_MAX = -(2**63), 2**64  # what orjson writes as an integer


def _orjson_writes_as_json(obj: object) -> bool:
    """orjson's bytes for ``obj`` are ``json.dumps(obj, ensure_ascii=False, separators=(",", ":"))``'s:
    plain types only, str keys, integers orjson holds, and floats that ``repr`` writes without an
    exponent (below 1e-4 orjson writes ``0.00001`` where ``repr`` writes ``1e-05``)."""
    stack = [obj]
    while stack:
        o = stack.pop()
        t = type(o)
        if t is str or t is bool or o is None:
            continue
        if t is dict:
            if not all(type(k) is str for k in o):  # type: ignore[union-attr]
                return False
            stack.extend(o.values())  # type: ignore[union-attr]
        elif t is list:
            stack.extend(o)  # type: ignore[arg-type]
        elif t is int:
            if not _INT_MIN <= o < _INT_MAX:  # type: ignore[operator]
                return False
        elif t is float:
            if not (o == 0 or 1e-4 <= abs(o) < 1e16):  # type: ignore[arg-type]
                return False  # NaN and infinities too: json refuses them (allow_nan=False)
        else:
            return False
    return True


def sdk_json(body: dict) -> bytes:
    """The SDK's request body bytes for ``body``: ``json.dumps(ensure_ascii=False, separators=(",",
    ":"), allow_nan=False)``, written by orjson where its bytes are the same (far faster on a long
    conversation: docs/benchmarks.md)."""
    if _orjson is not None and _orjson_writes_as_json(body):
        try:
            return _orjson.dumps(body)
        except TypeError:  # orjson.JSONEncodeError: a lone surrogate, deep nesting
            pass
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def sdk_http() -> Any:
    """The HTTP library the installed openai SDK builds its requests and errors with (httpx2 in
    openai 3, httpx before): the errors raised here carry the same types as the SDK's own."""
    from openai import _base_client

    return getattr(_base_client, "httpx2", None) or _base_client.httpx


_TRANSPORT = {"Accept-Encoding": "gzip, deflate, zstd", "Connection": "keep-alive"}  # what httpx adds
_OMIT = (type(openai.omit), type(openai.not_given))


class _Fields:
    """One JSON object of a chunk: its keys as attributes (absent ones raise AttributeError, so
    ``getattr(chunk, key, None)`` reads None), each made on first read: the stream wrapper reads a
    few fields, and the rest (the proxy's ``kv_transfer`` with its block ids) only through
    ``model_extra``, the whole mapping."""

    def __init__(self, d: dict) -> None:
        self.model_extra = d

    def __getattr__(self, name: str) -> Any:  # only for what __init__ and earlier reads did not set
        d = self.__dict__.get("model_extra")
        if d is None or name not in d:
            raise AttributeError(name)
        value = _fields(d[name])
        setattr(self, name, value)
        return value


def _fields(v: Any) -> Any:
    if isinstance(v, dict):
        return _Fields(v)
    if isinstance(v, list):
        return [_fields(x) for x in v]
    return v


def request_of(sdk: openai.AsyncOpenAI, send: dict) -> tuple[str, dict[str, str], bytes]:
    """(url, headers, body) of the SDK's request for ``create(**send)`` with ``stream=True``."""
    headers = dict(sdk.auth_headers)
    headers.update((k, v) for k, v in sdk.default_headers.items() if not isinstance(v, _OMIT))
    headers["x-stainless-retry-count"] = "0"
    timeout = send.get("timeout", sdk.timeout)
    timeout = getattr(timeout, "read", timeout)
    if timeout is not None:
        headers["x-stainless-read-timeout"] = str(timeout)
    headers.update(send.get("extra_headers") or {})
    headers.update(_TRANSPORT)
    body = {k: send[k] for k in _BODY_ORDER if k in send}
    body.update(send.get("extra_body") or {})
    data = sdk_json(body)
    return str(sdk.base_url) + "chat/completions", headers, data


class _Completions:
    def __init__(self, chat: DirectChat) -> None:
        self._chat = chat

    async def create(self, **kwargs) -> TracedAsyncStream:
        return await self._chat.create(**kwargs)


class _Chat:
    def __init__(self, chat: DirectChat) -> None:
        self.completions = _Completions(chat)


class DirectChat:
    """``sdk`` with ``chat.completions.create(stream=True)`` sent directly over aiohttp."""

    def __init__(self, sdk, agent) -> None:
        self._sdk, self._agent = sdk, agent
        self.chat = _Chat(self)
        self._http: aiohttp.ClientSession | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sdk, name)

    async def create(self, **kwargs) -> TracedAsyncStream:
        if not kwargs.get("stream"):
            raise ValueError("DirectChat streams only (stream=True)")
        call, send = begin(self._sdk, self._agent, sc.OP_CHAT, kwargs)
        # the SDK draws an idempotency key per request (sent or not): on the virtual clock uuid4 is
        # seeded, so the same draw keeps every later id (request ids, instance ids) the SDK path's
        uuid.uuid4()
        url, headers, data = request_of(self._sdk, send)
        timeout = send.get("timeout", self._sdk.timeout)
        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        token = otel_context.attach(call.context())
        try:
            try:
                resp = await self._http.post(
                    url,
                    data=data,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(sock_connect=timeout, sock_read=timeout),
                    skip_auto_headers=("User-Agent",),
                )
            except TimeoutError:  # aiohttp's ServerTimeoutError is one
                raise openai.APITimeoutError(request=self._sdk._build_request(_options(url))) from None
            except aiohttp.ClientError as exc:
                raise openai.APIConnectionError(request=self._sdk._build_request(_options(url))) from exc
            if resp.status >= 400:
                raise await self._status_error(resp, url)
        except BaseException as exc:
            call.fail(exc)
            raise
        finally:
            otel_context.detach(token)
        return TracedAsyncStream(_Events(resp, lambda: self._sdk._build_request(_options(url))), call)

    async def _status_error(self, resp: aiohttp.ClientResponse, url: str) -> openai.APIStatusError:
        body = await resp.read()
        resp.release()
        request = self._sdk._build_request(_options(url))
        response = sdk_http().Response(resp.status, headers=dict(resp.headers), content=body, request=request)
        return self._sdk._make_status_error_from_response(response)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        await self._sdk.close()


def _options(url: str):
    from openai._models import FinalRequestOptions

    return FinalRequestOptions.construct(method="post", url=url)


class _Events:
    """The SDK's ``AsyncStream`` over server-sent events: chunks until ``data: [DONE]``, then the
    rest of the body drained; an event carrying ``error`` raises ``APIError`` with the SDK's
    message, and a read timeout mid-stream raises httpx's ``ReadTimeout`` as the SDK's stream does."""

    def __init__(self, resp: aiohttp.ClientResponse, request: Callable[[], Any]) -> None:
        self._resp, self._request = resp, request
        self._lines = self._iter()

    async def _iter(self):
        resp = self._resp
        try:
            data: list[str] = []
            async for raw in resp.content:
                line = raw.decode().rstrip("\r\n")
                if line:
                    if line.startswith("data:"):
                        value = line[5:]
                        data.append(value[1:] if value.startswith(" ") else value)
                    continue
                if not data:
                    continue
                text, data = "\n".join(data), []
                if text.startswith("[DONE]"):
                    break
                event = codec.loads(text.encode())  # json.loads's value (orjson where they agree)
                if isinstance(event, dict) and event.get("error"):
                    error = event["error"]
                    message = error.get("message") if isinstance(error, dict) else None
                    if not message or not isinstance(message, str):
                        message = "An error occurred during streaming"
                    raise openai.APIError(message, request=self._request(), body=error)
                yield _Fields(event)
            async for _ in resp.content:  # the SDK reads an HTTP/1.1 stream to its end
                pass
        except TimeoutError:
            raise sdk_http().ReadTimeout("timed out", request=self._request()) from None
        finally:
            resp.release()

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self._lines.__anext__()

    async def close(self) -> None:
        await self._lines.aclose()
        self._resp.close()
