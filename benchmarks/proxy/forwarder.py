"""A bare aiohttp P-then-D forwarder: the least a P/D proxy does, as a CPU and latency baseline.

Per request: read the JSON body, POST it to P with ``max_tokens=1``, ``stream: false`` and
``kv_transfer_params = {do_remote_decode: true}``, then POST it to D with P's
``kv_transfer_params`` and stream D's body back chunk by chunk.  No tracing, no conversation
state, no validation, no limits, stdlib ``json``, aiohttp defaults (access log off, as any
production proxy would run).  Used by ``bench_proxy.py`` (mode ``forwarder``)::

    python benchmarks/proxy/forwarder.py --port 8000 --prefill-port 8100 --decode-port 8200
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

HOST = "127.0.0.1"
SESSIONS = web.AppKey("sessions", dict)


async def handle(request: web.Request) -> web.StreamResponse:
    p, d = request.app[SESSIONS]["p"], request.app[SESSIONS]["d"]
    body = await request.json()
    p_body = {
        **body,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
    }
    p_body.pop("stream_options", None)
    async with p.post(request.path, json=p_body) as r:
        params = (await r.json()).get("kv_transfer_params")
    async with d.post(request.path, json={**body, "kv_transfer_params": params}) as r:
        resp = web.StreamResponse(status=r.status, headers={"Content-Type": r.headers.get("Content-Type", "")})
        await resp.prepare(request)
        async for chunk in r.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def app(prefill_port: int, decode_port: int) -> web.Application:
    application = web.Application()
    application.router.add_post("/v1/chat/completions", handle)
    application.router.add_post("/v1/completions", handle)
    application.router.add_get("/health", health)

    async def sessions(application: web.Application):
        made = {
            name: aiohttp.ClientSession(f"http://{HOST}:{port}", connector=aiohttp.TCPConnector(limit=0))
            for name, port in (("p", prefill_port), ("d", decode_port))
        }
        application[SESSIONS] = made
        yield
        for session in made.values():
            await session.close()

    application.cleanup_ctx.append(sessions)
    return application


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefill-port", type=int, required=True)
    ap.add_argument("--decode-port", type=int, required=True)
    args = ap.parse_args()
    web.run_app(app(args.prefill_port, args.decode_port), host=HOST, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
