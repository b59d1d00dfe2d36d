"""A scriptable fake OpenAI worker for the proxy's fault tests (not the simulator).

The multi-turn behaviour is tested against :class:`kvtrace.sim.cluster.SimCluster`; this fake
exists to inject what the simulator does not do on purpose: answer 5xx, die mid-stream, stall
until the client goes away, send a scripted (garbage) stream, trickle bytes, answer oversized
bodies.  Each instance records the requests it received.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field

from aiohttp import web

from kvtrace import semconv as sc
from kvtrace.testing.wait import wait_for_async


def closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused): a dead worker."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@dataclass
class FakeWorker:
    engine_id: str
    status: int = 200  # answer this status (with an error body) when not 200
    die_after: int | None = None  # D: drop the connection after this many content chunks
    stall_after: int | None = None  # stop sending after this many chunks until cancelled (0: P never answers)
    tokens: int = 3
    script: list | None = None  # D: send these raw chunks (bytes) as the stream body, then end it
    trickle_s: float | None = None  # D: after the first chunk, send one SSE comment byte every trickle_s, forever
    pad_bytes: int = 0  # add this many bytes to every response (a "pad" field / SSE comment lines)
    after_done: str | None = None  # D after [DONE]: "hold" its body open until ``release`` is set; "die"
    release: asyncio.Event = field(default_factory=asyncio.Event)
    hold_each: bool = False  # D: hold each stream before its [DONE] until the test sets its event in ``held``
    held: dict = field(default_factory=dict)  # X-Request-Id -> asyncio.Event (hold_each)
    received: list = field(default_factory=list)  # (headers dict, body dict)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    stalled: asyncio.Event = field(default_factory=asyncio.Event)
    runner: web.AppRunner | None = None
    url: str = ""
    kv_params: list | None = None  # P: ``[value]``: answer ``kv_transfer_params: value`` (any JSON value)

    async def start(self, port: int = 0) -> FakeWorker:
        """Listen on 127.0.0.1:``port`` (0: any free port)."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port, reuse_address=True)
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
        """Any request cancelled (its client gone), wherever it was (reading the body included), sets
        ``cancelled``."""
        try:
            return await self._answer(request)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append((dict(request.headers), body))
        if self.status != 200:
            err = {"error": {"message": f"fake {self.status}", "type": "Fake", "code": self.status}}
            return web.json_response(err, status=self.status)
        chat = request.path.endswith("chat/completions")
        if not body.get("stream"):
            if self.stall_after == 0:  # P: never answer until cancelled
                self.stalled.set()
                await asyncio.Event().wait()
            full = self._full(body, chat)
            if self.pad_bytes:
                return await self._padded(request, full)
            return web.json_response(full)
        return await self._stream(request, body, chat)

    async def _padded(self, request: web.Request, full: dict) -> web.StreamResponse:
        """``full`` with a ``pad`` field of ``pad_bytes`` bytes, sent chunked (no Content-Length)."""
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(json.dumps(full)[:-1].encode() + b', "pad": "')
        piece = b"x" * 65536
        for _ in range(self.pad_bytes // len(piece)):
            await resp.write(piece)
        await resp.write(b"x" * (self.pad_bytes % len(piece)) + b'"}')
        await resp.write_eof()
        return resp

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
            "usage": {
                "prompt_tokens": 40,
                "completion_tokens": 1,
                "total_tokens": 41,
                "prompt_tokens_details": {"cached_tokens": 16},
            },
            "kv_transfer_params": self._params() if self.kv_params is None else self.kv_params[0],
        }

    def _chunk(self, chat: bool, text: str, finish: str | None, kvp: dict | None) -> bytes:
        choice = {"index": 0, "finish_reason": finish, "logprobs": None}
        choice.update({"delta": {"content": text}} if chat else {"text": text})
        obj = {
            "id": "fake-1",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1,
            "model": "fake",
            "choices": [choice],
            "kv_transfer_params": kvp,
        }
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def _stream(self, request: web.Request, body: dict, chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if self.script is not None:
            for chunk in self.script:
                await resp.write(chunk)
            await resp.write_eof()
            return resp
        if self.pad_bytes:
            line = b": " + b"x" * 65534 + b"\n"
            for _ in range(self.pad_bytes // len(line) + 1):
                await resp.write(line)
        for i in range(self.tokens):
            if self.trickle_s is not None and i == 1:
                while True:  # until the proxy gives up on us
                    await resp.write(b":")
                    await asyncio.sleep(self.trickle_s)
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
            obj = {
                "id": "fake-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "fake",
                "choices": [],
                "usage": usage,
            }
            await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        if self.hold_each:
            event = self.held[request.headers.get(sc.HEADER_REQUEST_ID)] = asyncio.Event()
            await event.wait()
        await resp.write(b"data: [DONE]\n\n")
        if self.after_done == "die":
            request.transport.close()  # no end of the chunked body
            return resp
        if self.after_done == "hold":
            await self.release.wait()
        await resp.write_eof()
        return resp


# ---------------------------------------------------------------------------- test helpers
CHAT = "/v1/chat/completions"
BODY = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}


async def wait_for(pred, timeout: float = 5.0) -> None:
    """Poll ``pred`` until true, at most ``timeout`` s (spans end asynchronously after a response):
    :func:`kvtrace.testing.wait.wait_for_async` under the name the proxy tests use."""
    await wait_for_async(pred, timeout, "condition")


def sse(data: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body."""
    return [line[6:] for line in data.decode(errors="replace").splitlines() if line.startswith("data: ")]


@dataclass
class RawResponse:
    """What a curl-like client saw: every status line, headers of the first, the de-chunked body,
    whether the chunked body was terminated properly, and whether the server closed the connection."""

    status_lines: list
    headers: dict
    body: bytes
    complete: bool
    closed: bool


async def raw_request(url: str, head: bytes, body: bytes = b"", timeout: float = 5.0) -> RawResponse:
    """Send ``head`` + ``body`` on a fresh connection and read one response the way curl does."""
    host, port = url.rsplit("//", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head + body)
        await writer.drain()
        return await asyncio.wait_for(_read_response(reader), timeout)
    finally:
        writer.close()


async def _read_response(reader: asyncio.StreamReader) -> RawResponse:
    raw_head = await reader.readuntil(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    status_lines, body, complete = [lines[0]], b"", False
    if headers.get("transfer-encoding") == "chunked":
        while True:
            size_line = await reader.readline()
            if not size_line:
                break
            try:
                size = int(size_line.strip().split(b";")[0], 16)
            except ValueError:  # not a chunk size: e.g. a second status line inside the body
                status_lines.append(size_line.decode("latin-1").strip())
                break
            if size == 0:
                await reader.readline()
                complete = True
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    else:
        n = int(headers.get("content-length", 0))
        body = await reader.readexactly(n)
        complete = True
    body_lines = body.split(b"\n")
    status_lines += [ln.decode("latin-1") for ln in body_lines if ln.startswith(b"HTTP/1.")]
    closed = False
    if headers.get("connection", "").lower() == "close":
        closed = await reader.read() == b""
    return RawResponse(status_lines, headers, body, complete, closed)


def http_head(path: str, body: bytes, extra: str = "", connection: str = "close") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: {connection}\r\n{extra}\r\n"
    ).encode("latin-1", "surrogateescape")
