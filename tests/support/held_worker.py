"""A loopback relay in front of one worker that holds chosen requests' responses: an older turn's D
leg stays open while newer turns go through, so a test orders turns' ends without sleeping."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from kvtrace import semconv as sc


class HeldWorker:
    """Relays POSTs to ``target``; a request whose ``X-Request-Id`` is in :attr:`holds` gets its
    response only once the test sets that event (:attr:`arrived` names the ones waiting)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.holds: dict[str, asyncio.Event] = {}
        self.arrived: set[str] = set()
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    def hold(self, request_id: str) -> asyncio.Event:
        event = self.holds[request_id] = asyncio.Event()
        return event

    async def start(self) -> HeldWorker:
        self._http = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_post("/{path:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._http is not None
        rid = request.headers.get(sc.HEADER_REQUEST_ID, "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._http.post(self.target + request.path, data=await request.read(), headers=headers) as r:
            body = await r.read()  # the worker answered in full; the hold decides when the proxy sees it
            status, ctype = r.status, r.headers.get("Content-Type", "application/json")
        event = self.holds.get(rid)
        if event is not None:
            self.arrived.add(rid)
            await event.wait()
        return web.Response(status=status, body=body, headers={"Content-Type": ctype})
