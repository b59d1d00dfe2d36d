"""One proxied request's state (:class:`Call`) and the ways it ends: a JSON answer, a passthrough
of a worker's 4xx, a 503 when a worker's connection queue is full, a client disconnect, a finished
stream, or a failed one (:func:`end_stream`) — each ends the SERVER span once with the client-facing
status and the merged ``kv_transfer`` facts (:mod:`.metadata`), and every leg span that is still
open.  Used by :mod:`kvtrace.proxy.app`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from aiohttp import hdrs, web

from kvtrace import jsoncodec as codec
from kvtrace import semconv as sc
from kvtrace.proxy import identity, metadata, prefix_table
from kvtrace.proxy.parse import ClientRequest, error_body
from kvtrace.proxy.spans import RequestTrace, end_leg
from kvtrace.proxy.stream import InvalidChunk, sse_event
from kvtrace.proxy.table import Turn
from kvtrace.proxy.upstream import Client, PoolFull

log = logging.getLogger(__name__)
STATUS_CLIENT_CLOSED = 499
CLIENT_GONE = (ConnectionResetError, ConnectionError)  # the client went away while we wrote to it
TAIL_WRITE_S = 5.0  # the closing SSE events of a failed stream must reach the client within this


class Done(Exception):
    """Stop the flow and answer ``response`` (raised by the legs)."""

    def __init__(self, response: web.StreamResponse) -> None:
        self.response = response


@dataclass
class Call:
    """State of one request while it flows through P and D."""

    req: ClientRequest
    rt: RequestTrace
    request_id: str
    session_id: str | None
    turn: Turn
    auth: str | None
    deadline: float  # event-loop time when --request-timeout runs out
    patch: bool  # add the trace-id header / kv_transfer object
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
    prefill_attempts: int = 1
    decode_attempts: int = 1
    read_failure: str | None = None  # sc.OUTCOME_EXPIRED / OUTCOME_FAILED: P failed to read the offer
    decoder_ttl_s: float | None = None
    prompt: identity.Prompt | None = None  # the request's identity (prefix matching on, a session's turn)
    reply: prefix_table.Reply | None = None  # rebuilding a streamed answer
    decode_params_invalid: str | None = None  # why D's final params were not kept
    recorded: bool = False  # the prefix table has this turn
    route_policy: str | None = None  # the routing policy, when the fleet gave a choice (Pool.fleet)
    p_route: str | None = None  # why this P / this D (sc.ROUTE_REASONS)
    d_route: str | None = None

    @property
    def decoder(self) -> Client:
        """The decode worker: chosen when D's leg opens, before anything that reports it."""
        assert self.d_client is not None
        return self.d_client

    def kv_object(self) -> dict:
        if self.kv is None:
            turn = self.turn
            self.kv = metadata.build(
                trace_id=self.rt.trace_id,
                request_id=self.request_id,
                session_id=self.session_id,
                turn=turn.index,
                offered=turn.offered,
                offer_reason=turn.reason,
                offered_params=turn.params,
                p_params=self.p_params,
                p_usage=self.p_usage,
                prefill_answered=self.p_answered,
                d_params=self.d_params,
                fallback=self.fallback,
                ttft_ms=self.rt.ttft_ms,
            )
            if self.read_failure is not None and self.p_answered:
                self.kv[sc.KVT_DECISION] = self.read_failure
        return self.kv

    def finish(self, status: int, error_type: str | None) -> None:
        """End the open legs (with ``error_type``) and the SERVER span."""
        for span in self.legs:
            end_leg(span, None, error_type or "unfinished")
        kv = self.kv_object()
        usage = self.usage or {}
        local, pulled, prompt = (
            _count(kv[k]) for k in (sc.KVT_LOCAL_HIT_TOKENS, sc.KVT_PULLED_TOKENS, sc.KVT_PROMPT_TOKENS)
        )
        lost = None
        if self.turn.dropped_tokens is not None and local is not None and prompt is not None:
            lost = max(0, min(self.turn.dropped_tokens, prompt) - local)
        self.rt.finish(
            status,
            error_type,
            **{
                sc.PROXY_FALLBACK: self.fallback,
                sc.PROXY_PREFILL_ENDPOINT: self.p_client.base if self.p_client else None,
                sc.PROXY_DECODE_ENDPOINT: self.d_client.base if self.d_client else None,
                sc.ROUTE_POLICY: self.route_policy,
                sc.ROUTE_PREFILL_REASON: self.p_route if self.route_policy else None,
                sc.ROUTE_DECODE_REASON: self.d_route if self.route_policy else None,
                sc.PROXY_PREFILL_ATTEMPTS: self.prefill_attempts if self.prefill_attempts > 1 else None,
                sc.PROXY_DECODE_ATTEMPTS: self.decode_attempts if self.decode_attempts > 1 else None,
                sc.PROXY_DECODER_KV_TTL_S: self.decoder_ttl_s,
                sc.GEN_AI_USAGE_INPUT_TOKENS: usage.get("prompt_tokens"),
                sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: local + pulled
                if local is not None and pulled is not None
                else None,
                sc.SESSION_REUSABLE_TOKENS_LOST: lost,
                sc.GEN_AI_USAGE_OUTPUT_TOKENS: usage.get("completion_tokens"),
                sc.GEN_AI_RESPONSE_FINISH_REASONS: tuple(self.finish_reasons) or None,
                sc.KV_OUTCOME: kv[sc.KVT_DECISION],
                sc.KV_PULLED_TOKENS: kv[sc.KVT_PULLED_TOKENS],
                sc.PROXY_DECODE_PARAMS_INVALID: self.decode_params_invalid,
            },
        )

    def json(self, body: dict, status: int) -> web.Response:
        return json_response(self.rt, self.patch, body, status)

    def fail(self, status: int, etype: str, msg: str, type_: str) -> web.Response:
        self.finish(status, etype)
        return self.json(error_body(msg, type_, status), status)

    def busy(self, full: PoolFull) -> web.Response:
        """A worker's connection queue was full: 503 with Retry-After (the client may send it again)."""
        resp = self.fail(503, sc.ERROR_POOL_FULL, str(full), sc.ERROR_POOL_FULL)
        resp.headers[hdrs.RETRY_AFTER] = str(full.retry_after_s)
        return resp

    def passthrough(self, status: int, data: bytes) -> web.Response:
        """A worker's 4xx goes back to the client as it is (the request was at fault)."""
        self.finish(status, str(status))
        resp = web.Response(status=status, body=data, content_type="application/json")
        if self.patch:
            resp.headers[sc.HEADER_TRACE_ID] = self.rt.trace_id
        return resp

    def disconnected(self) -> None:
        """The client went away: P never used the offer unless it answered; spans end as 499."""
        self.turn.restore()  # no-op once P answered (consumed)
        rt = self.rt
        if not rt.span.is_recording():
            return
        rt.span.add_event(sc.EVENT_CLIENT_DISCONNECT)
        for span in self.legs:
            end_leg(span, None, sc.ERROR_CLIENT_DISCONNECT)
        rt.finish(STATUS_CLIENT_CLOSED, sc.ERROR_CLIENT_DISCONNECT, **{sc.PROXY_FALLBACK: self.fallback})


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def json_response(rt: RequestTrace, patch: bool, body: dict, status: int) -> web.Response:
    headers = {sc.HEADER_TRACE_ID: rt.trace_id} if patch else None
    return web.Response(body=codec.dumps(body), status=status, content_type="application/json", headers=headers)


def stream_failure(call: Call, exc: Exception, request_timeout_s: float) -> tuple[str, dict, bytes]:
    """Error type, the client's error object and bytes still due to the client, for an
    exception while streaming."""
    if isinstance(exc, TimeoutError) and asyncio.get_running_loop().time() >= call.deadline:
        msg = f"request not completed within {request_timeout_s:g} s"
        return sc.ERROR_DEADLINE_EXCEEDED, error_body(msg, sc.ERROR_DEADLINE_EXCEEDED, 504), b""
    if isinstance(exc, InvalidChunk):
        msg = f"decode worker {call.decoder.base} failed mid-stream: {sc.ERROR_INVALID_CHUNK} ({exc})"
        call.rt.upstream_error(sc.ERROR_INVALID_CHUNK, call.decoder.host, call.decoder.port)
        return sc.ERROR_INVALID_CHUNK, error_body(msg, "upstream_error", 502), exc.passed
    log.exception("kvtrace proxy: request %s failed mid-stream", call.request_id)
    return type(exc).__name__, error_body("internal proxy error", "internal_error", 500), b""


async def end_stream(
    call: Call,
    request: web.Request,
    resp: web.StreamResponse,
    r,
    span,
    error: str,
    failure: dict | None,
    due: bytes,
    ended: bool,
    max_upstream_bytes: int,
) -> web.StreamResponse:
    """End a failed stream: an SSE error event and [DONE] (or a JSON error before it began;
    nothing when ``ended``: D failed after [DONE], the client already has its whole stream)."""
    r.close()
    if failure is None:  # D's stream broke
        why = f"response exceeds {max_upstream_bytes} bytes" if error == sc.ERROR_RESPONSE_TOO_LARGE else error
        msg = f"decode worker {call.decoder.base} failed mid-stream: {why}"
        failure = error_body(msg, "upstream_error", 502)
        call.rt.upstream_error(error, call.decoder.host, call.decoder.port)
    end_leg(span, 200, error, **{sc.REQUEST_TTFT_MS: call.rt.ttft_ms})
    if not resp.prepared:
        status = failure["error"]["code"]
        call.finish(status, error)
        return call.json(failure, status)
    if ended:
        call.finish(200, error)
        return resp
    try:
        async with asyncio.timeout(TAIL_WRITE_S):
            await resp.write(due + sse_event(failure) + b"data: [DONE]\n\n")
            await resp.write_eof()
    except (*CLIENT_GONE, TimeoutError):
        if request.transport is not None:
            request.transport.close()
    call.finish(200, error)
    return resp
