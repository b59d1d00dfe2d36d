"""OTLP/HTTP trace receiver: ``POST /v1/traces`` with binary protobuf or JSON bodies.

Started by :class:`kvtrace.collect.server.Collector` on its own event-loop thread (aiohttp).
Responses use the request's encoding (OTLP spec, "OTLP/HTTP Response"): 200 with an
``ExportTraceServiceResponse`` (``partial_success`` when spans were rejected), 400 with a
``google.rpc.Status`` for malformed payloads (bad protobuf or JSON, bad ids, JSON nested too
deeply, a body marked gzip that is not), 503 + ``Retry-After`` when the queue is full or the
in-flight byte budget is spent, 413 for bodies over the size limit (after decompression), 415
for other content types and encodings.  ``GET /health`` answers the queue's state and counters
(:meth:`~kvtrace.collect.queue.SpanQueue.health`: ``status`` ``ok`` or ``unwritable``, refusals,
losses).  ``Content-Encoding: gzip`` (what the OTel SDKs send with
compression on) and ``deflate`` bodies are inflated here, not by aiohttp, in bounded steps
(:mod:`kvtrace.collect.limits`).
"""

from __future__ import annotations

import asyncio
import logging
import threading

from aiohttp import hdrs, web

from kvtrace.collect import otlp_convert
from kvtrace.collect.limits import Body, ByteBudget, Hold, RequestRefused
from kvtrace.collect.queue import SpanQueue
from kvtrace.collect.receiver import (
    ACCEPTED,
    INTERNAL,
    MALFORMED,
    RETRY,
    TOO_LARGE,
    UNSUPPORTED,
    Outcome,
    ingest,
    rpc_status,
    write_failed,
)

log = logging.getLogger(__name__)

PATH = "/v1/traces"
HEALTH_PATH = "/health"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY_BYTES = 64 * 1024 * 1024
_STATUS = {ACCEPTED: 200, MALFORMED: 400, TOO_LARGE: 413, UNSUPPORTED: 415, RETRY: 503, INTERNAL: 500}


def _reply(outcome: Outcome, as_json: bool) -> web.Response:
    message = outcome.response if outcome.response is not None else rpc_status(outcome)
    body = otlp_convert.to_json(message) if as_json else message.SerializeToString()
    headers = {"Retry-After": str(outcome.retry_after_s)} if outcome.kind == RETRY else None
    return web.Response(
        status=_STATUS[outcome.kind], body=body, content_type=JSON if as_json else PROTOBUF, headers=headers
    )


def make_app(
    queue: SpanQueue, *, budget: ByteBudget | None = None, max_body_bytes: int = MAX_BODY_BYTES, durable: bool = False
) -> web.Application:
    """The aiohttp application serving ``POST /v1/traces`` into ``queue``; run it with
    ``auto_decompress=False`` (:class:`HTTPReceiver` does): it inflates bodies itself."""
    budget = budget or ByteBudget(4 * max_body_bytes)

    async def receive(request: web.Request, as_json: bool) -> Outcome:
        if request.content_length is not None and request.content_length > max_body_bytes:
            raise RequestRefused(TOO_LARGE, f"request body larger than {max_body_bytes} bytes")
        with Hold(budget) as hold:
            body = Body(request.headers.get(hdrs.CONTENT_ENCODING, ""), max_body_bytes, hold)
            async for chunk in request.content.iter_any():
                body.feed(chunk)
            data = body.finish()
            parsed = otlp_convert.parse_json(data) if as_json else otlp_convert.parse_protobuf(data)
            del data, body
            outcome = ingest(queue, parsed, durable=durable)
        if outcome.written is not None:
            try:
                await asyncio.wrap_future(outcome.written)
            except Exception as exc:
                return write_failed(exc)
        return outcome

    async def export(request: web.Request) -> web.Response:
        ctype = request.content_type
        if ctype not in (PROTOBUF, JSON):
            raise web.HTTPUnsupportedMediaType(text=f"Content-Type must be {PROTOBUF} or {JSON}")
        as_json = ctype == JSON
        try:
            outcome = await receive(request, as_json)
        except RequestRefused as exc:
            outcome = Outcome(exc.kind, str(exc))
        except otlp_convert.MalformedPayload as exc:
            outcome = Outcome(MALFORMED, str(exc))
        except Exception as exc:  # a bug, not the sender's fault: log it, answer a Status all the same
            log.exception("kvtrace collect: internal error on %s", PATH)
            outcome = Outcome(INTERNAL, f"internal error: {type(exc).__name__}")
        return _reply(outcome, as_json)

    async def health(request: web.Request) -> web.Response:
        # 200 even while unwritable: the body says so; a probe that restarted the collector then
        # would lose the acknowledged spans it holds in memory
        return web.json_response(queue.health())

    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_post(PATH, export)
    app.router.add_get(HEALTH_PATH, health)
    return app


class HTTPReceiver:
    """Runs :func:`make_app` on a private event loop in a daemon thread (sync start/stop)."""

    def __init__(
        self,
        queue: SpanQueue,
        host: str,
        port: int,
        *,
        grace_s: float = 5.0,
        budget: ByteBudget | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        durable: bool = False,
    ) -> None:
        self.queue, self.host, self.requested_port, self.grace_s = queue, host, port, grace_s
        self._app_args = dict(budget=budget, max_body_bytes=max_body_bytes, durable=durable)
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="kvtrace-collect-http", daemon=True)

    def start(self) -> int:
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        try:
            self.port = fut.result(timeout=30)
        except Exception:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            raise
        return self.port

    async def _start(self) -> int:
        self._runner = web.AppRunner(
            make_app(self.queue, **self._app_args),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self.grace_s,
            auto_decompress=False,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.requested_port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise OSError(f"cannot listen on {self.host}:{self.requested_port} (HTTP): {exc.strerror or exc}") from None
        return site._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (up to ``grace_s``), stop the loop."""
        if not self._thread.is_alive():
            return
        if self._runner is not None:
            fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            try:
                fut.result(timeout=self.grace_s + 5)
            except Exception:
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
