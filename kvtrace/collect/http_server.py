"""OTLP/HTTP trace receiver: ``POST /v1/traces`` with binary protobuf or JSON bodies.

Started by :class:`kvtrace.collect.server.Collector` on its own event-loop thread (aiohttp).
Responses use the request's encoding (OTLP spec, "OTLP/HTTP Response"): 200 with an
``ExportTraceServiceResponse`` (``partial_success`` when spans were rejected), 400 with a
``google.rpc.Status`` for malformed payloads, 503 + ``Retry-After`` when the queue is full,
415 for other content types, 413 for bodies over the size limit.  gzip request bodies
(``Content-Encoding: gzip``, what the OTel SDKs send with compression on) are decompressed by
aiohttp.
"""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from kvtrace.collect import otlp_convert
from kvtrace.collect.queue import SpanQueue
from kvtrace.collect.receiver import ACCEPTED, MALFORMED, Outcome, ingest, rpc_status

PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MAX_BODY_BYTES = 64 * 1024 * 1024
_STATUS = {ACCEPTED: 200, MALFORMED: 400}


def _reply(outcome: Outcome, as_json: bool) -> web.Response:
    message = outcome.response if outcome.response is not None else rpc_status(outcome)
    body = otlp_convert.to_json(message) if as_json else message.SerializeToString()
    headers = {"Retry-After": str(outcome.retry_after_s)} if outcome.kind not in _STATUS else None
    return web.Response(status=_STATUS.get(outcome.kind, 503), body=body,
                        content_type=JSON if as_json else PROTOBUF, headers=headers)


def make_app(queue: SpanQueue) -> web.Application:
    """The aiohttp application serving ``POST /v1/traces`` into ``queue``."""

    async def export(request: web.Request) -> web.Response:
        ctype = request.content_type
        if ctype not in (PROTOBUF, JSON):
            raise web.HTTPUnsupportedMediaType(text=f"Content-Type must be {PROTOBUF} or {JSON}")
        as_json = ctype == JSON
        body = await request.read()
        try:
            parsed = otlp_convert.parse_json(body) if as_json else otlp_convert.parse_protobuf(body)
        except otlp_convert.MalformedPayload as exc:
            return _reply(Outcome(MALFORMED, str(exc)), as_json)
        return _reply(ingest(queue, parsed), as_json)

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(PATH, export)
    return app


class HTTPReceiver:
    """Runs :func:`make_app` on a private event loop in a daemon thread (sync start/stop)."""

    def __init__(self, queue: SpanQueue, host: str, port: int, *, grace_s: float = 5.0) -> None:
        self.queue, self.host, self.requested_port, self.grace_s = queue, host, port, grace_s
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
        self._runner = web.AppRunner(make_app(self.queue), access_log=None, handle_signals=False,
                                    shutdown_timeout=self.grace_s)
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
