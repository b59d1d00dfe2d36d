"""The proxy's request flow: routes, and the P-leg / D-leg flow of one request.

Per completion request, :class:`Proxy` parses the body (:mod:`.parse`), takes the conversation's
entry from the table (:mod:`.table`), sends the P leg (non-streaming, ``max_tokens=1``), then the D
leg (:mod:`.decode_leg`): streamed back through :class:`.stream.StreamPatcher` (or aggregated for
non-streaming clients), D's final ``kv_transfer_params`` cached for the next turn and the merged
``kv_transfer`` object attached (:mod:`.metadata`).  Request state and endings: :mod:`.call`; spans: :mod:`.spans`.

Sessions: the body's ``conversation_id``, else ``X-Session-ID``, else W3C baggage ``session.id``,
else the body's ``prompt_cache_key``; with prefix matching on (default), a chat request without any
of them continues the session whose served turn its messages extend, or starts one the proxy names
(:mod:`.prefix_table`), and every turn of a session, of any kind (:mod:`.identity`), is checked for
continuity: only a turn that extends what D holds is offered D's blocks, and only when they are of
the turn it was checked against (otherwise their KV belongs to other tokens).  The span records how
the session was found (``kvtrace.session.source``) and the continuity.  D's final
``kv_transfer_params`` are validated before they are kept for the next offer
(``kvtrace.proxy.decode_params_invalid`` when they are not).

Faults: when P answers 5xx to a turn that offered D's blocks (vLLM under
``kv_load_failure_policy=fail`` when the blocks expired or the read failed), P is asked once more
without them (a fresh prefill) and the decision is recorded as ``expired`` (the entry was older than
D's retention minus vLLM's 5 s margin) or ``failed``.  Everything runs under ``--request-timeout``
(504, or an SSE error event once streaming) and reads at most ``--max-upstream-bytes`` per worker
response.  A leg waits for one of its worker's connections (:class:`.upstream.Gate`); past the
worker's queue bound the request is answered 503 with ``Retry-After`` (``pool_full``).  Once a
stream has started, every failure — the worker, its garbage, the deadline, a proxy bug — ends it
with an SSE error event and ``[DONE]`` and ends the spans with ERROR.  D's ``[DONE]`` goes to the
client together with the end of the chunked body, at once; a failure after it (D's body not ending
cleanly) is recorded on the spans only: the client already has its stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from aiohttp import web

from kvtrace import semconv as sc
from kvtrace import settings, telemetry
from kvtrace.proxy import identity, legs, prefix_table
from kvtrace.proxy.call import Call, Done, json_response
from kvtrace.proxy.config import PREFILL_FAILURE_DECODE_ONLY, ProxyConfig
from kvtrace.proxy.decode_leg import DecodeLeg
from kvtrace.proxy.decoder_ttl import Retention
from kvtrace.proxy.metrics import ProxyMetrics
from kvtrace.proxy.parse import CHAT_PATH, ClientRequest, RequestError, check_id, error_body, parse_request
from kvtrace.proxy.spans import RequestTrace, end_leg, tracer
from kvtrace.proxy.table import ConversationTable
from kvtrace.proxy.upstream import (
    UPSTREAM_ERRORS,
    Client,
    Pool,
    PoolFull,
    TooLarge,
    json_object,
    loop_time,
    never_reached,
    read_body,
)

log = logging.getLogger(__name__)
# continuities whose turn is not offered D's blocks, and the offer reason they give
_REFUSED = {
    sc.CONTINUITY_DIVERGED: sc.OFFER_DIVERGED,
    sc.CONTINUITY_REUSED_ID: sc.OFFER_REUSED_ID,
    sc.CONTINUITY_UNKNOWN: sc.OFFER_HISTORY_UNKNOWN,
}


@dataclass
class _PResult:
    """What one P leg got: status, body, decoded object, error type, whether P got the request."""

    status: int = 0  # 0: P sent no answer (its leg failed before a status)
    data: bytes = b""
    obj: dict | None = None
    error: str | None = None
    error_leg: str | None = None  # the leg failed although P answered (invalid_response)
    reached: bool = True


class Proxy(DecodeLeg):
    def __init__(
        self, config: ProxyConfig, tracer_provider=None, clock=time.monotonic, metrics: bool | None = None
    ) -> None:
        self.config = config
        self.tracer = tracer(tracer_provider)
        self.table = ConversationTable(
            config.conversation_ttl_s, config.max_conversations, clock, config.max_table_bytes
        )
        self.pool = Pool(config)
        self.chains = (
            prefix_table.PrefixTable(config.max_conversations, config.max_chain_bytes, on_evict=self.table.drop)
            if config.prefix_match
            else None
        )
        if self.chains is not None:  # the two tables are evicted together
            self.table.on_evict = self.chains.forget
        self.retention = Retention(config)  # warns now when --conversation-ttl outlives --decoder-kv-ttl
        on = settings.METRICS.get(metrics) and not settings.DISABLE.get()  # GET /metrics (None: KVTRACE_METRICS)
        self.metrics = ProxyMetrics(self.table, self.pool) if on else None

    # ------------------------------------------------------------------ routes
    def health_body(self) -> dict:
        prefix = self.chains.health() if self.chains is not None else {}
        # spans this process lost (e.g. write_failed: a full trace disk); serving goes on regardless
        t, pool = loop_time(), self.pool
        return {
            "status": "ok",
            **self.table.health(),
            **prefix,
            "prefill_workers_down": pool.down_count(sc.ROLE_PREFILL, t),
            "decode_workers_down": pool.down_count(sc.ROLE_DECODE, t),
            "dropped_spans": telemetry.dropped_spans(),
        }

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(self.health_body())

    async def prometheus(self, request: web.Request) -> web.Response:
        assert self.metrics is not None  # the route exists only with metrics on (server.py)
        body, content_type = self.metrics.render(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def models(self, request: web.Request) -> web.Response:
        """D's model list: the D workers in turn, those in the routing first; one that cannot be
        reached passes the question to the next."""
        clients = self.pool.decode_order()
        for i, client in enumerate(clients):
            try:
                async with asyncio.timeout(self.config.request_timeout_s):
                    async with client.session.get("/v1/models", headers=self._auth_headers(request)) as r:
                        data = await read_body(r, self.config.max_upstream_bytes)
                        return web.Response(status=r.status, body=data, content_type=r.content_type)
            except (*UPSTREAM_ERRORS, TooLarge) as exc:
                if never_reached(exc):
                    client.unreachable(exc)  # as a chat leg's failed connection would
                    if i + 1 < len(clients):
                        continue
                msg = f"decode worker {client.base} failed: {type(exc).__name__}"
                return web.json_response(error_body(msg, "upstream_error", 502), status=502)
        raise AssertionError("unreachable: the pool has at least one D")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        rt = RequestTrace(self.tracer, request.headers, request.method, request.path, self.metrics)
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout_s
        try:
            req = await self._parse(request)
            call = self._begin(request, req, rt, deadline)
        except RequestError as exc:
            rt.finish(exc.status, exc.code)
            resp = json_response(rt, self.config.patch_responses, exc.body(), exc.status)
            if exc.status == 408:
                resp.force_close()  # the rest of the body is not worth waiting for
            return resp
        try:
            await self._prefill(call)
            if req.stream:
                return await self._decode_stream(call, request)
            return await self._decode_aggregate(call)
        except Done as done:
            return done.response
        except PoolFull as full:  # a worker's queue is full: 503, never a 502
            call.turn.restore()  # P never got it (a no-op once P answered)
            return call.busy(full)
        except asyncio.CancelledError:
            call.disconnected()
            raise
        except Exception as exc:  # a proxy bug must not kill the server or leak a traceback
            log.exception("kvtrace proxy: request %s failed", call.request_id)
            call.turn.restore()
            return call.fail(500, type(exc).__name__, "internal proxy error", "internal_error")

    # ------------------------------------------------------------------ request set-up
    async def _parse(self, request: web.Request) -> ClientRequest:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise RequestError(413, f"body exceeds {limit} bytes", "body_too_large")
        try:
            if request.content.is_eof():  # the whole body came with the head (nearly always): no timer
                raw = await request.read()
            else:
                async with asyncio.timeout(self.config.client_body_timeout_s):
                    raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(413, f"body exceeds {limit} bytes", "body_too_large") from None
        except TimeoutError:
            msg = f"request body not received within {self.config.client_body_timeout_s:g} s"
            raise RequestError(408, msg, "body_timeout") from None
        return parse_request(raw, request.path, self.config.max_id_bytes)

    def _identify(self, hdrs, req: ClientRequest, rt: RequestTrace) -> tuple[str | None, str]:
        """The session a request names and where it was found (``sc.SOURCE_*``)."""
        if req.conversation_id:
            return req.conversation_id, sc.SOURCE_CONVERSATION_ID
        max_id = self.config.max_id_bytes
        session = hdrs.get(sc.HEADER_SESSION_ID)
        if session:
            return check_id(session, "session id (X-Session-ID / baggage session.id)", max_id), sc.SOURCE_HEADER
        session = rt.baggage_session()
        if session:
            return check_id(session, "session id (X-Session-ID / baggage session.id)", max_id), sc.SOURCE_BAGGAGE
        if req.prompt_cache_key:
            return req.prompt_cache_key, sc.SOURCE_PROMPT_CACHE_KEY
        return None, sc.SOURCE_NONE

    def _begin(self, request: web.Request, req: ClientRequest, rt: RequestTrace, deadline: float) -> Call:
        hdrs, max_id = request.headers, self.config.max_id_bytes
        session, source = self._identify(hdrs, req, rt)
        request_id = hdrs.get(sc.HEADER_REQUEST_ID)
        request_id = check_id(request_id, sc.HEADER_REQUEST_ID, max_id) if request_id else uuid.uuid4().hex
        attrs = {
            sc.GEN_AI_OPERATION_NAME: req.operation,
            sc.REQUEST_STREAM: req.stream,
            sc.PROXY_CONVERSATION_TTL_S: self.config.conversation_ttl_s,
        }
        prompt, refuse, history = None, None, None
        chains = self.chains
        if chains is not None and (session is not None or req.path == CHAT_PATH):
            prompt = identity.chat(req.body) if req.path == CHAT_PATH else identity.completion(req.body)
            if session is None:
                session, source = chains.find(prompt.hashes) or prefix_table.new_session_id(), sc.SOURCE_PREFIX
            continuity, diverged_at = chains.check(session, prompt)
            history = chains.turn(session)
            refuse = _REFUSED.get(continuity)
            attrs[sc.SESSION_CONTINUITY] = continuity
            if diverged_at is not None:
                attrs[sc.SESSION_DIVERGED_AT] = diverged_at
            if self.metrics is not None:
                self.metrics.continuity(continuity)
        attrs[sc.SESSION_SOURCE] = source
        turn = self.table.begin(session, refuse, checked=prompt is not None, history=history, down=self.pool.down)
        attrs[sc.PROXY_OFFER] = turn.offered
        attrs[sc.PROXY_OFFER_REASON] = turn.reason
        if req.model:
            attrs[sc.GEN_AI_REQUEST_MODEL] = req.model
        if turn.entry_age_s is not None:
            attrs[sc.PROXY_ENTRY_AGE_S] = round(turn.entry_age_s, 3)
        rt.set_identity(request_id, session, turn.index, attrs)
        auth = self._auth(hdrs)
        call = Call(req, rt, request_id, session, turn, auth, deadline, self.config.patch_responses)
        if prompt is not None:
            call.prompt = prompt
            if req.stream and prompt.reply_known:
                call.reply = prefix_table.Reply(text=prompt.kind == identity.KIND_TEXT)
        return call

    # ------------------------------------------------------------------ P leg
    async def _prefill(self, call: Call) -> None:
        choice = self.pool.choose_prefill(call.session_id)
        assert choice is not None  # nothing tried yet
        client, call.p_route = choice
        call.p_client = client
        if self.pool.fleet:
            call.route_policy = self.config.routing
        turn = call.turn
        p = await self._prefill_leg(call, client, turn.params)
        p, client = await self._prefill_failover(call, client, p, turn.params)
        if turn.offered and p.error is None and p.status >= 500:
            # P could not read the offered blocks (expired or failed): once more, without them
            call.rt.upstream_error(str(p.status), client.host, client.port)
            call.prefill_attempts += 1
            entry, age = turn.entry, turn.entry_age_s
            assert entry is not None and age is not None  # an offered turn holds the entry it offered
            call.read_failure = self.retention.read_failure(entry.decode_endpoint, age)
            p = await self._prefill_leg(call, client, None, retry=True)
            p, client = await self._prefill_failover(call, client, p, None, retry=True)
        if p.error == sc.ERROR_DEADLINE_EXCEEDED:
            turn.restore()
            msg = f"no answer from prefill worker {client.base} within {self.config.request_timeout_s:g} s"
            raise Done(call.fail(504, p.error, msg, sc.ERROR_DEADLINE_EXCEEDED))
        if p.error is not None:
            return self._prefill_failed(call, p.error, client, restore=not p.reached)
        if p.status >= 400:
            turn.restore()
            if p.status < 500:
                raise Done(call.passthrough(p.status, p.data))
            return self._prefill_failed(call, str(p.status), client, restore=True)
        if p.obj is None:
            return self._prefill_failed(call, sc.ERROR_INVALID_RESPONSE, client, restore=False)
        turn.consumed()
        call.p_answered = True
        params = p.obj.get("kv_transfer_params")
        if params is not None and legs.unusable_params(params):
            # D cannot pull what P described: it prefills locally, and the record says so
            call.rt.upstream_error(sc.ERROR_INVALID_RESPONSE, client.host, client.port)
            call.fallback = sc.FALLBACK_DECODE_ONLY
        elif isinstance(params, dict):
            params["remote_host"] = client.host
            call.p_params = params
        call.p_usage = p.obj.get("usage") if isinstance(p.obj.get("usage"), dict) else None

    async def _prefill_failover(
        self, call: Call, client: Client, p: _PResult, offered: dict | None, retry: bool = False
    ) -> tuple[_PResult, Client]:
        """While P's leg could not reach its worker, the same leg to another P (the worker never
        got it); the last result and its P."""
        tried: tuple[Client, ...] = (client,)
        while p.error is not None and not p.reached:  # a deadline leaves reached True: P may have it
            choice = self.pool.choose_prefill(call.session_id, tried)
            if choice is None:
                break
            call.rt.upstream_error(p.error, client.host, client.port)
            client, call.p_route = choice
            call.p_client, tried = client, (*tried, client)
            call.prefill_attempts += 1
            p = await self._prefill_leg(call, client, offered, retry, failover=True)
        return p, client

    async def _prefill_leg(
        self, call: Call, client: Client, offered: dict | None, retry: bool = False, failover: bool = False
    ) -> _PResult:
        """Send one P leg (``offered``: D's params to offer) and end its span."""
        attrs = {sc.PROXY_PREFILL_ENDPOINT: client.base, sc.PROXY_OFFER: offered is not None}
        if retry:
            attrs[sc.PROXY_RETRY] = True
        if failover:
            attrs[sc.PROXY_FAILOVER] = True
        span, tp = call.rt.leg(sc.SPAN_PROXY_PREFILL, client.host, client.port, **attrs)
        call.legs.append(span)
        body = legs.prefill_body(call.req.body, offered, legs.context(tp, call.session_id, call.turn.index))
        out = _PResult()
        try:
            async with asyncio.timeout_at(call.deadline):
                try:
                    async with await client.post(
                        call.req.path, span, body, legs.headers(call.request_id, tp, call.auth)
                    ) as r:
                        out.status = r.status
                        out.data = await read_body(r, self.config.max_upstream_bytes)
                except TooLarge:
                    out.error = sc.ERROR_RESPONSE_TOO_LARGE
                except UPSTREAM_ERRORS as exc:
                    out.error, out.reached = type(exc).__name__, not never_reached(exc)
        except TimeoutError:
            out.error = sc.ERROR_DEADLINE_EXCEEDED
        if out.error is None and out.status < 400:
            out.obj = json_object(out.data)
            if out.obj is None:
                out.error_leg = sc.ERROR_INVALID_RESPONSE
        end_leg(
            span,
            out.status or None,
            out.error or out.error_leg or (str(out.status) if out.status >= 400 else None),
            **({sc.PROXY_UNREACHABLE: True} if not out.reached else {}),
        )
        return out

    def _prefill_failed(self, call: Call, etype: str, client: Client, restore: bool) -> None:
        call.rt.upstream_error(etype, client.host, client.port)
        if restore:
            call.turn.restore()
        else:
            call.turn.consumed()
        if self.config.prefill_failure == PREFILL_FAILURE_DECODE_ONLY:
            call.fallback = sc.FALLBACK_DECODE_ONLY
            return
        raise Done(call.fail(502, etype, f"prefill worker {client.base} failed: {etype}", "upstream_error"))

    def _auth(self, hdrs) -> str | None:
        """The client's Authorization header, else the configured API key as a bearer token."""
        return hdrs.get("Authorization") or (f"Bearer {self.config.api_key}" if self.config.api_key else None)

    def _auth_headers(self, request: web.Request) -> dict:
        auth = self._auth(request.headers)
        return {"Authorization": auth} if auth else {}
