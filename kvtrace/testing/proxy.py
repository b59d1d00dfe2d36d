"""A scriptable fake OpenAI worker for the proxy's fault tests (not the simulator).

The multi-turn behaviour is tested against :class:`kvtrace.sim.cluster.SimCluster`; this fake
exists to inject what the simulator does not do on purpose: answer 5xx, die mid-stream, stall
until the client goes away.  Each instance records the requests it received.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class FakeWorker:
    engine_id: str
    status: int = 200  # answer this status (with an error body) when not 200
    die_after: int | None = None  # D: drop the connection after this many content chunks
    stall_after: int | None = None  # D: stop sending after this many chunks until cancelled
    tokens: int = 3
    received: list = field(default_factory=list)  # (headers dict, body dict)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    stalled: asyncio.Event = field(default_factory=asyncio.Event)
    runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> "FakeWorker":
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    async def close(self) -> None:
        if self.runner:
            await self.runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append((dict(request.headers), body))
        if self.status != 200:
            err = {"error": {"message": f"fake {self.status}", "type": "Fake", "code": self.status}}
            return web.json_response(err, status=self.status)
        chat = request.path.endswith("chat/completions")
        if not body.get("stream"):
            return web.json_response(self._full(body, chat))
        try:
            return await self._stream(request, body, chat)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    def _params(self) -> dict:
        return {
            "do_remote_decode": self.engine_id.startswith("d"),
            "do_remote_prefill": self.engine_id.startswith("p"),
            "remote_engine_id": self.engine_id,
            "remote_block_ids": [[1, 2, 3]],
            "remote_request_id": "r-" + self.engine_id,
            "remote_host": "10.0.0.9",
            "remote_port": 5600,
            "remote_num_tokens": 40,
        }

    def _full(self, body: dict, chat: bool) -> dict:
        choice = {"index": 0, "finish_reason": "length", "logprobs": None}
        choice.update({"message": {"role": "assistant", "content": "x"}} if chat else {"text": "x"})
        return {
            "id": "fake-1",
            "object": "chat.completion" if chat else "text_completion",
            "created": 1,
            "model": "fake",
            "choices": [choice],
            "usage": {"prompt_tokens": 40, "completion_tokens": 1, "total_tokens": 41,
                      "prompt_tokens_details": {"cached_tokens": 16}},
            "kv_transfer_params": self._params(),
        }

    def _chunk(self, chat: bool, text: str, finish: str | None, kvp: dict | None) -> bytes:
        choice = {"index": 0, "finish_reason": finish, "logprobs": None}
        choice.update({"delta": {"content": text}} if chat else {"text": text})
        obj = {"id": "fake-1", "object": "chat.completion.chunk" if chat else "text_completion",
               "created": 1, "model": "fake", "choices": [choice], "kv_transfer_params": kvp}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def _stream(self, request: web.Request, body: dict, chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(self.tokens):
            if self.die_after is not None and i >= self.die_after:
                request.transport.close()  # the worker process died
                return resp
            if self.stall_after is not None and i >= self.stall_after:
                self.stalled.set()
                await asyncio.Event().wait()  # until the proxy cancels us
            last = i == self.tokens - 1
            await resp.write(self._chunk(chat, f"t{i}", "length" if last else None, self._params() if last else None))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 40, "completion_tokens": self.tokens, "total_tokens": 40 + self.tokens}
            obj = {"id": "fake-1", "object": "chat.completion.chunk", "created": 1, "model": "fake",
                   "choices": [], "usage": usage}
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
