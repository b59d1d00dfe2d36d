"""The proxy's aiohttp application: routes, and the P-leg / D-leg flow of one request.

``create_app(config, tracer_provider=...)`` builds the app; ``start(...)`` runs it on a port (the
CLI, tests and the benchmark use it).  Per completion request, :class:`Proxy` parses the body
(:mod:`.parse`), takes the conversation's entry from the table (:mod:`.table`), sends the P leg
(non-streaming, ``max_tokens=1``), then streams the D leg back through :class:`.stream.StreamPatcher`
(or aggregates it for non-streaming clients), caches D's final ``kv_transfer_params`` for the
next turn and attaches the merged ``kv_transfer`` object (:mod:`.metadata`).  Spans: :mod:`.spans`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.proxy import codec, legs, metadata
from kvtrace.proxy.config import PREFILL_FAILURE_DECODE_ONLY, ProxyConfig
from kvtrace.proxy.metrics import ProxyMetrics
from kvtrace.proxy.parse import CHAT_PATH, ClientRequest, RequestError, error_body, parse_request
from kvtrace.proxy.spans import RequestTrace, end_leg, tracer
from kvtrace.proxy.stream import Aggregator, StreamPatcher, sse_event
from kvtrace.proxy.table import ConversationTable, Turn
from kvtrace.proxy.upstream import UPSTREAM_ERRORS, Client, Pool

log = logging.getLogger(__name__)
_CLIENT_GONE = (ConnectionResetError, ConnectionError)
_STATUS_CLIENT_CLOSED = 499



async def _read_upstream(r, rt, sink) -> str | None:
    """Pass D's stream to ``sink`` chunk by chunk, marking the first token on the request's span.
    Returns the upstream error's class name, or None when D ended the stream."""
    while True:
        try:
            chunk = await r.content.readany()
        except UPSTREAM_ERRORS as exc:
            return type(exc).__name__
        if not chunk:
            return None
        if rt.ttft_ms is None:
            rt.first_token()
        await sink(chunk)

class _Done(Exception):
    """Stop the flow and answer ``response`` (raised by the legs)."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response


@dataclass
class _Call:
    """State of one request while it flows through P and D."""

    req: ClientRequest
    rt: RequestTrace
    request_id: str
    session_id: str | None
    turn: Turn
    auth: str | None
    p_client: Client | None = None
    d_client: Client | None = None
    p_params: dict | None = None
    p_usage: dict | None = None
    p_answered: bool = False
    d_params: dict | None = None
    usage: dict | None = None
    finish_reasons: list = field(default_factory=list)
    fallback: str = sc.FALLBACK_NONE
    kv: dict | None = None
    legs: list = field(default_factory=list)


class Proxy:
    def __init__(self, config: ProxyConfig, tracer_provider=None, clock=time.monotonic, metrics: bool | None = None) -> None:
        self.config = config
        self.tracer = tracer(tracer_provider)
        self.table = ConversationTable(config.conversation_ttl_s, config.max_conversations, clock)
        self.pool = Pool(config)
        on = settings.METRICS.get(metrics) and not settings.DISABLE.get()  # GET /metrics (None: KVTRACE_METRICS)
        self.metrics = ProxyMetrics(self.table) if on else None

    # ------------------------------------------------------------------ routes
    async def health(self, request: web.Request) -> web.Response:
        evicted = self.table.evict_stale()
        return web.json_response({"status": "ok", "cached_conversations": len(self.table), "evicted_stale": evicted})

    async def prometheus(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.render(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def models(self, request: web.Request) -> web.Response:
        client = self.pool.next_decode()
        try:
            async with client.session.get("/v1/models", headers=self._auth_headers(request)) as r:
                data = await r.read()
                return web.Response(status=r.status, body=data, content_type=r.content_type)
        except UPSTREAM_ERRORS as exc:
            msg = f"decode worker {client.base} unreachable: {type(exc).__name__}"
            return web.json_response(error_body(msg, "upstream_error", 502), status=502)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        rt = RequestTrace(self.tracer, request.headers, request.method, request.path, self.metrics)
        try:
            req = await self._parse(request)
        except RequestError as exc:
            rt.finish(exc.status, exc.code)
            return self._json(rt, exc.body(), exc.status)
        call = self._begin(request, req, rt)
        try:
            await self._prefill(call)
            if req.stream:
                return await self._decode_stream(call, request)
            return await self._decode_aggregate(call)
        except _Done as done:
            return done.response
        except asyncio.CancelledError:
            self._disconnected(call)
            raise
        except Exception as exc:  # a proxy bug must not kill the server or leak a traceback
            log.exception("kvtrace proxy: request %s failed", call.request_id)
            call.turn.restore()
            return self._fail(call, 500, type(exc).__name__, "internal proxy error", "internal_error")

    # ------------------------------------------------------------------ request set-up
    async def _parse(self, request: web.Request) -> ClientRequest:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise RequestError(413, f"body exceeds {limit} bytes", "body_too_large")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(413, f"body exceeds {limit} bytes", "body_too_large") from None
        return parse_request(raw, request.path)

    def _begin(self, request: web.Request, req: ClientRequest, rt: RequestTrace) -> _Call:
        hdrs = request.headers
        session = req.conversation_id or hdrs.get(sc.HEADER_SESSION_ID) or rt.baggage_session()
        request_id = hdrs.get(sc.HEADER_REQUEST_ID) or uuid.uuid4().hex
        turn = self.table.begin(session)
        attrs = {
            sc.GEN_AI_OPERATION_NAME: req.operation,
            sc.REQUEST_STREAM: req.stream,
            sc.PROXY_OFFER: turn.offered,
            sc.PROXY_OFFER_REASON: turn.reason,
        }
        if req.model:
            attrs[sc.GEN_AI_REQUEST_MODEL] = req.model
        if turn.entry_age_s is not None:
            attrs[sc.PROXY_ENTRY_AGE_S] = round(turn.entry_age_s, 3)
        rt.set_identity(request_id, session, turn.index, attrs)
        auth = hdrs.get("Authorization") or (f"Bearer {self.config.api_key}" if self.config.api_key else None)
        return _Call(req, rt, request_id, session, turn, auth)

    # ------------------------------------------------------------------ P leg
    async def _prefill(self, call: _Call) -> None:
        client = call.p_client = self.pool.next_prefill()
        turn, rt = call.turn, call.rt
        span, tp = rt.leg(sc.SPAN_PROXY_PREFILL, client.host, client.port, **{sc.PROXY_OFFER: turn.offered})
        call.legs.append(span)
        offered = turn.entry.params if turn.offered else None
        body = legs.prefill_body(call.req.body, offered, legs.context(tp, call.session_id, turn.index))
        try:
            async with client.session.post(call.req.path, data=body, headers=legs.headers(call.request_id, tp, call.auth)) as r:
                status, data = r.status, await r.read()
        except UPSTREAM_ERRORS as exc:
            etype = type(exc).__name__
            end_leg(span, None, etype)
            return self._prefill_failed(call, etype, client, restore=_never_reached(exc))
        if status >= 400:
            end_leg(span, status, str(status))
            turn.restore()
            if status < 500:
                raise _Done(self._passthrough(call, status, data))
            return self._prefill_failed(call, str(status), client, restore=True)
        obj = _json_object(data)
        if obj is None:
            end_leg(span, status, "invalid_response")
            return self._prefill_failed(call, "invalid_response", client, restore=False)
        turn.consumed()
        call.p_answered = True
        params = obj.get("kv_transfer_params")
        if isinstance(params, dict):
            params["remote_host"] = client.host
            call.p_params = params
        call.p_usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
        end_leg(span, status)

    def _prefill_failed(self, call: _Call, etype: str, client: Client, restore: bool) -> None:
        call.rt.upstream_error(etype, client.host, client.port)
        if restore:
            call.turn.restore()
        else:
            call.turn.consumed()
        if self.config.prefill_failure == PREFILL_FAILURE_DECODE_ONLY:
            call.fallback = sc.FALLBACK_DECODE_ONLY
            return
        msg = f"prefill worker {client.base} failed: {etype}"
        raise _Done(self._fail(call, 502, etype, msg, "upstream_error"))

    # ------------------------------------------------------------------ D leg
    async def _open_decode(self, call: _Call):
        client = call.d_client = self.pool.next_decode()
        span, tp = call.rt.leg(sc.SPAN_PROXY_DECODE, client.host, client.port)
        call.legs.append(span)
        p_params = None if call.fallback == sc.FALLBACK_DECODE_ONLY else call.p_params
        body = legs.decode_body(call.req.body, p_params, legs.context(tp, call.session_id, call.turn.index))
        hdrs = legs.headers(call.request_id, tp, call.auth)
        try:
            r = await client.session.post(call.req.path, data=body, headers=hdrs)
        except UPSTREAM_ERRORS as exc:
            etype = type(exc).__name__
            end_leg(span, None, etype)
            raise _Done(self._decode_failed(call, etype, f"decode worker {client.base} failed: {etype}"))
        if r.status != 200:
            data = await r.read()
            r.release()
            end_leg(span, r.status, str(r.status))
            if r.status < 500:
                raise _Done(self._passthrough(call, r.status, data))
            raise _Done(self._decode_failed(call, str(r.status), f"decode worker {client.base} failed: {r.status}"))
        return r, span

    def _decode_failed(self, call: _Call, etype: str, msg: str) -> web.Response:
        call.rt.upstream_error(etype, call.d_client.host, call.d_client.port)
        return self._fail(call, 502, etype, msg, "upstream_error")

    def _on_params(self, call: _Call, params: dict) -> None:
        """D's final kv_transfer_params: remember where its blocks live for the next turn."""
        params["remote_host"] = call.d_client.host
        call.d_params = params
        if legs.cacheable(params):
            self.table.store(call.session_id, call.turn.index, params, call.d_client.base)

    async def _decode_stream(self, call: _Call, request: web.Request) -> web.StreamResponse:
        r, span = await self._open_decode(call)
        rt = call.rt
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if self.config.patch_responses:
            resp.headers[sc.HEADER_TRACE_ID] = rt.trace_id
        patcher = StreamPatcher(
            patch_usage_chunk=call.req.include_usage,
            drop_usage=not call.req.include_usage,
            make_kv=(lambda: self._kv(call)) if self.config.patch_responses else None,
            on_params=lambda p: self._on_params(call, p),
        )
        error = None

        async def forward(chunk: bytes) -> None:
            out = patcher.feed(chunk)
            if out:
                await resp.write(out)

        try:
            await resp.prepare(request)
            error = await _read_upstream(r, rt, forward)
            tail = patcher.flush()
            if tail:
                await resp.write(tail)
            if error is None and not patcher.done:
                error = "incomplete_stream"
            if error is not None:
                msg = f"decode worker {call.d_client.base} failed mid-stream: {error}"
                await resp.write(sse_event(error_body(msg, "upstream_error", 502)) + b"data: [DONE]\n\n")
                rt.upstream_error(error, call.d_client.host, call.d_client.port)
            elif patcher.error is not None:
                error = str(patcher.error.get("type") or "upstream_error")
            await resp.write_eof()
        except _CLIENT_GONE:
            r.close()
            self._disconnected(call)
            return resp
        finally:
            r.release() if error is None and patcher.done else r.close()
        call.usage, call.finish_reasons = patcher.usage, patcher.finish_reasons
        end_leg(span, 200, error, **{sc.REQUEST_TTFT_MS: rt.ttft_ms})
        self._finish(call, 200, error)
        return resp

    async def _decode_aggregate(self, call: _Call) -> web.Response:
        r, span = await self._open_decode(call)
        rt = call.rt
        agg = Aggregator(chat=call.req.path == CHAT_PATH)
        error = None

        async def collect(chunk: bytes) -> None:
            agg.feed(chunk)

        try:
            error = await _read_upstream(r, rt, collect)
            agg.flush()
        finally:
            r.release() if error is None and agg.done else r.close()
        if error is None and not agg.done:
            error = "incomplete_stream"
        if error is None and agg.error is not None:
            error = str(agg.error.get("type") or "upstream_error")
        end_leg(span, 200, error, **{sc.REQUEST_TTFT_MS: rt.ttft_ms})
        if error is not None:
            return self._decode_failed(call, error, f"decode worker {call.d_client.base} failed: {error}")
        if agg.kv_params is not None:
            self._on_params(call, agg.kv_params)
        call.usage, call.finish_reasons = agg.usage, agg.finish_reasons
        body = agg.body()
        if self.config.patch_responses:
            body[sc.RESPONSE_KV_TRANSFER] = self._kv(call)
        self._finish(call, 200, None)
        return self._json(rt, body, 200)

    # ------------------------------------------------------------------ ending
    def _kv(self, call: _Call) -> dict:
        if call.kv is None:
            turn = call.turn
            call.kv = metadata.build(
                trace_id=call.rt.trace_id,
                request_id=call.request_id,
                session_id=call.session_id,
                turn=turn.index,
                offered=turn.offered,
                offer_reason=turn.reason,
                offered_params=turn.entry.params if turn.offered else None,
                p_params=call.p_params,
                p_usage=call.p_usage,
                prefill_answered=call.p_answered,
                d_params=call.d_params,
                fallback=call.fallback,
                ttft_ms=call.rt.ttft_ms,
            )
        return call.kv

    def _finish(self, call: _Call, status: int, error_type: str | None) -> None:
        kv = self._kv(call)
        usage = call.usage or {}
        call.rt.finish(
            status,
            error_type,
            **{
                sc.PROXY_FALLBACK: call.fallback,
                sc.PROXY_PREFILL_ENDPOINT: call.p_client.base if call.p_client else None,
                sc.PROXY_DECODE_ENDPOINT: call.d_client.base if call.d_client else None,
                sc.GEN_AI_USAGE_INPUT_TOKENS: usage.get("prompt_tokens"),
                sc.GEN_AI_USAGE_OUTPUT_TOKENS: usage.get("completion_tokens"),
                sc.GEN_AI_RESPONSE_FINISH_REASONS: tuple(call.finish_reasons) or None,
                sc.KV_OUTCOME: kv[sc.KVT_DECISION],
                sc.KV_PULLED_TOKENS: kv[sc.KVT_PULLED_TOKENS],
            },
        )

    def _fail(self, call: _Call, status: int, etype: str, msg: str, type_: str) -> web.Response:
        self._finish(call, status, etype)
        return self._json(call.rt, error_body(msg, type_, status), status)

    def _passthrough(self, call: _Call, status: int, data: bytes) -> web.Response:
        """A worker's 4xx goes back to the client as it is (the request was at fault)."""
        self._finish(call, status, str(status))
        resp = web.Response(status=status, body=data, content_type="application/json")
        if self.config.patch_responses:
            resp.headers[sc.HEADER_TRACE_ID] = call.rt.trace_id
        return resp

    def _disconnected(self, call: _Call) -> None:
        if not call.rt.span.is_recording():
            return
        call.rt.span.add_event(sc.EVENT_CLIENT_DISCONNECT)
        for span in call.legs:
            end_leg(span, None, "client_disconnect")
        call.rt.finish(_STATUS_CLIENT_CLOSED, "client_disconnect", **{sc.PROXY_FALLBACK: call.fallback})

    def _json(self, rt: RequestTrace, body: dict, status: int) -> web.Response:
        headers = {sc.HEADER_TRACE_ID: rt.trace_id} if self.config.patch_responses else None
        return web.Response(body=codec.dumps(body), status=status, content_type="application/json", headers=headers)

    def _auth_headers(self, request: web.Request) -> dict:
        auth = request.headers.get("Authorization") or (f"Bearer {self.config.api_key}" if self.config.api_key else None)
        return {"Authorization": auth} if auth else {}


def _json_object(data: bytes) -> dict | None:
    try:
        obj = codec.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _never_reached(exc: BaseException) -> bool:
    """The worker never got the request (connect failed): its table entry is still unused."""
    return isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError))
