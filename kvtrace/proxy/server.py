"""Run the proxy: ``create_app`` (aiohttp Application) and ``start`` (bound to a port).

Used by :mod:`kvtrace.cli.proxy`, the tests and ``benchmarks/proxy``.  The server runs with
``handler_cancellation=True`` so a client that disconnects cancels its handler, which closes the
upstream P/D requests (vLLM aborts them) and records ``kvtrace.client_disconnect``.  aiohttp's
keep-alive timer runs from a connection's start (and from each response) until a complete request
head has arrived, so ``keepalive_timeout=client_header_timeout_s`` is the client header timeout:
a client that opens a connection and never finishes its headers (or idles between requests) is
dropped after it.  After an early answer (408, 413) aiohttp reads and drops the rest of the body
for at most ``lingering_time`` before closing; that is bounded by ``client_body_timeout_s`` too.
It keeps aiohttp's listen backlog (128): asyncio accepts up to the backlog's count of connections per
loop iteration, and with 2,048 a burst's handlers ran back to back for longer than the connect timeout
on a loaded machine, so connections to the workers that had connected meanwhile were reported as
``ConnectionTimeoutError`` (the timer's callback runs before the waiting task resumes; seen once for
all 1,024 of P's).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web

from kvtrace.proxy.app import Proxy
from kvtrace.proxy.config import ProxyConfig
from kvtrace.proxy.parse import CHAT_PATH, COMPLETIONS_PATH

PROXY_KEY = web.AppKey("kvtrace_proxy", Proxy)
_LINGERING_S = 10.0  # aiohttp's default lingering_time


def create_app(
    config: ProxyConfig, tracer_provider=None, clock=time.monotonic, metrics: bool | None = None
) -> web.Application:
    proxy = Proxy(config, tracer_provider, clock, metrics)
    app = web.Application(client_max_size=config.max_body_bytes)
    app[PROXY_KEY] = proxy
    app.router.add_post(CHAT_PATH, proxy.handle)
    app.router.add_post(COMPLETIONS_PATH, proxy.handle)
    app.router.add_get("/health", proxy.health)
    app.router.add_get("/v1/models", proxy.models)
    if proxy.metrics is not None:
        app.router.add_get("/metrics", proxy.prometheus)

    async def _start(app: web.Application) -> None:
        await proxy.pool.start()

    async def _stop(app: web.Application) -> None:
        await proxy.pool.close()

    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app


@dataclass
class Running:
    """A started proxy: ``url`` (http://host:port), ``proxy`` (its state), ``close()``."""

    runner: web.AppRunner
    url: str
    proxy: Proxy

    async def close(self) -> None:
        await self.runner.cleanup()


async def start(config: ProxyConfig, tracer_provider=None, clock=time.monotonic, port: int | None = None) -> Running:
    """Run the proxy on ``config.host`` / ``port`` (default ``config.port``; 0 = any free port)."""
    app = create_app(config, tracer_provider, clock)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=config.client_header_timeout_s,
        lingering_time=min(_LINGERING_S, config.client_body_timeout_s),
    )
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port if port is None else port)
    await site.start()
    host, bound = runner.addresses[0][:2]
    return Running(runner, f"http://{host}:{bound}", app[PROXY_KEY])
