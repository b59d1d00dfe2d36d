"""HTTP surface of one simulated vLLM worker (aiohttp), as a P/D proxy sees it.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or SSE), ``GET /health``,
``GET /v1/models``, and ``GET /metrics`` when the worker has :mod:`~kvtrace.sim.metrics`.  Request
ids follow vLLM 0.33: ``cmpl-{X-Request-Id}`` / ``chatcmpl-{X-Request-Id}`` (a random hex id
without the header); the engine-internal id sent as ``remote_request_id`` adds ``-0``
(completions) and an 8-character random suffix, like ``InputProcessor.assign_request_id``.
KVRecorder keys requests by that internal id and records the X-Request-Id (``public_id``) as
gen_ai.request.id, the join key of proxy, P and D.

:class:`SimWorker` is created by :class:`kvtrace.sim.cluster.SimCluster`; several run in one
process, each on its own port.
"""

from __future__ import annotations

import logging
import time
import uuid

from aiohttp import web

from kvtrace import jsoncodec as codec
from kvtrace import semconv as sc
from kvtrace import telemetry
from kvtrace.sim import streaming, tokenizer, wire
from kvtrace.sim.engine import FINISH_LENGTH, Engine, EngineError
from kvtrace.sim.metrics import WorkerMetrics

log = logging.getLogger(__name__)
LISTEN_BACKLOG = 2048  # vLLM's API server listens with uvicorn's default backlog (aiohttp's is 128)
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def _json(obj, status: int = 200) -> web.Response:
    return web.Response(body=codec.dumps(obj), status=status, content_type="application/json")


def _error(message: str, status: int, err_type: str, param: str | None = None) -> web.Response:
    return _json(wire.error_body(message, status, err_type, param), status)


class SimWorker:
    """aiohttp application around one :class:`Engine`."""

    def __init__(
        self,
        engine: Engine,
        *,
        model: str,
        max_model_len: int,
        strict_model: bool = False,
        metrics: WorkerMetrics | None = None,
        tool_calls: str | None = None,
        stream_interval: float = 1,
    ) -> None:
        wire.check_tool_calls(tool_calls)
        #: vLLM's --stream-interval: tokens per streamed write after the first one with text (1: every
        #: token; the virtual arms' math.inf: that first one, then the rest with the last)
        self.stream_interval = stream_interval
        self.tool_calls = tool_calls  # wire.scripted_tool_call's mode; None = never call a tool
        self.engine = engine
        self.metrics = metrics
        self.model = model
        self.strict_model = strict_model
        self.max_model_len = max_model_len
        self.created = int(time.time())
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.add_routes(
            [
                web.post("/v1/completions", self.completions),
                web.post("/v1/chat/completions", self.chat_completions),
                web.get("/health", self.health),
                web.get("/v1/models", self.models),
            ]
        )
        if metrics is not None:
            self.app.router.add_get("/metrics", self.prometheus)
            engine.on_first_token = metrics.first_token
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        # a client that hangs up cancels its handler, which aborts its request: vLLM's routes do the
        # same (with_cancellation, and Starlette's streaming response), so its blocks free at once
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, reuse_address=True, backlog=LISTEN_BACKLOG)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    # ------------------------------------------------------------------ routes
    async def health(self, request: web.Request) -> web.Response:
        # vLLM answers an empty 200; the JSON body adds the spans this process lost (full trace disk)
        return _json({"status": "ok", "dropped_spans": telemetry.dropped_spans()})

    async def prometheus(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.render(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def models(self, request: web.Request) -> web.Response:
        return _json(wire.models_body(self.model, self.created, self.max_model_len))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    # ------------------------------------------------------------------ serving
    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = codec.loads(await request.read())  # as vLLM's server reads it: json.loads of the bytes
        except (ValueError, UnicodeDecodeError, RecursionError):
            return _error("request body is not valid JSON", 400, "BadRequestError")
        try:
            req = wire.parse_request(body, chat, self.model if self.strict_model else None, self.tool_calls)
        except wire.WireError as exc:
            return _error(str(exc), exc.status, exc.err_type, exc.param)
        base = request.headers.get(sc.HEADER_REQUEST_ID) or uuid.uuid4().hex
        rid = f"chatcmpl-{base}" if chat else f"cmpl-{base}"
        internal = f"{rid}-{uuid.uuid4().hex[:8]}" if chat else f"{rid}-0-{uuid.uuid4().hex[:8]}"
        try:
            gen = self.engine.submit(
                req.prompt_ids,
                max_tokens=req.max_tokens,
                params=req.kv_transfer_params,
                request_id=base,
                internal_id=internal,
                seed=req.seed,
                headers=dict(request.headers),
                thinking=req.thinking,
            )
        except EngineError as exc:
            return _error(str(exc), exc.status, exc.err_type)
        model = req.model or self.model
        if req.stream:
            return await self._stream(request, req, gen, rid, model)
        try:
            await gen.prefill()
            pieces = [piece async for batch in gen.decode_batches(None) for _, piece in batch]
        except EngineError as exc:
            return _error(str(exc), exc.status, exc.err_type)
        except BaseException:
            gen.abort(sc.ERROR_CLIENT_DISCONNECT)
            raise
        finish = wire.FINISH_TOOL_CALLS if req.tool_name else FINISH_LENGTH
        kvp = gen.finish(finish)
        if not chat:
            return _json(
                wire.completion_body(
                    rid, int(time.time()), model, "".join(pieces), FINISH_LENGTH, len(req.prompt_ids), len(pieces), kvp
                )
            )
        content, reasoning = tokenizer.split(pieces)
        calls = wire.tool_calls(rid, req.tool_name) if req.tool_name else None
        n_prompt, n_out = len(req.prompt_ids), len(pieces)
        body = wire.chat_body(rid, int(time.time()), model, content, finish, n_prompt, n_out, kvp, reasoning, calls)
        return _json(body)

    async def _stream(self, request, req: wire.ParsedRequest, gen, rid: str, model: str) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        await resp.prepare(request)
        created = int(time.time())
        n_prompt = len(req.prompt_ids)
        cont = req.continuous_usage
        try:
            try:
                await gen.prefill()
            except EngineError as exc:
                await resp.write(streaming.sse(wire.error_body(str(exc), exc.status, exc.err_type)))
                await resp.write(wire.DONE)
                return resp
            if req.chat:
                first = wire.chat_role_chunk(rid, created, model, wire.usage(n_prompt, 0, False) if cont else None)
                await resp.write(streaming.sse(first))
            await self._write_tokens(resp, req, gen, rid, model, created)
            if req.include_usage:
                chunk = wire.usage_chunk(rid, created, model, req.chat, n_prompt, len(gen.output))
                await resp.write(streaming.sse(chunk))
            await resp.write(wire.DONE)
            await resp.write_eof()
        except ConnectionResetError:  # the proxy hung up (its client left, a timeout): vLLM aborts, quietly
            gen.abort(sc.ERROR_CLIENT_DISCONNECT)
        except BaseException:
            gen.abort(sc.ERROR_CLIENT_DISCONNECT)
            raise
        return resp

    async def _write_tokens(self, resp, req, gen, rid, model, created) -> None:
        """The tokens as chunks, the last one with finish_reason and kv_transfer_params: one chunk per
        token, or (``stream_interval`` > 1) one write per delivered batch, a field's consecutive
        deltas in one chunk."""
        max_tokens = req.max_tokens
        reasoning = tokenizer.reasoning_words(max_tokens, gen.thinking)
        pace = streaming.Pacing(self.stream_interval, req, reasoning, self.engine.cost.enabled)
        n_out, merge = 0, self.stream_interval > 1
        # merged, a plain answer's batch is one chunk: one field's deltas, the last token's finish
        plain = merge and not req.tool_name and not req.continuous_usage and not (req.chat and reasoning)
        async for batch in gen.decode_batches(pace):
            runs: list[streaming.Run] = []
            if plain:  # what _token_runs makes of it, without a step per token
                n_out += len(batch)
                finish = FINISH_LENGTH if n_out >= max_tokens else None
                kvp = gen.finish(finish) if finish else None
                text = "".join([piece for _, piece in batch])
                runs.append(streaming.Run("content" if req.chat else "text", [text], None, finish, kvp))
            else:
                n_out = self._token_runs(runs, req, gen, batch, n_out, reasoning, merge, rid, model, created)
            body = [streaming.encode(run, req.chat, rid, created, model) for run in runs]
            if body:
                await resp.write(b"".join(body))

    def _token_runs(self, runs, req, gen, batch, n_out, reasoning, merge, rid, model, created) -> int:
        """``batch``'s tokens onto ``runs``, one by one (tool calls, continuous usage, reasoning, or
        unmerged); returns the tokens counted so far."""
        n_prompt, max_tokens = len(req.prompt_ids), req.max_tokens
        for _, piece in batch:
            n_out += 1
            last = n_out >= max_tokens
            finish = (wire.FINISH_TOOL_CALLS if req.tool_name else FINISH_LENGTH) if last else None
            kvp = gen.finish(finish) if last else None
            usage = wire.usage(n_prompt, n_out, False) if req.continuous_usage else None
            if req.tool_name:
                chunk = self._tool_chunk(req, rid, model, created, n_out, finish, kvp, usage)
                if chunk is not None:  # a tool parser holds the tokens between name and arguments back
                    runs.append(streaming.Run(None, [], chunk))
                continue
            field, text = tokenizer.delta(n_out - 1, piece, reasoning) if req.chat else ("text", piece)
            streaming.add(runs, field, text, finish, kvp, usage, merge)
        return n_out

    @staticmethod
    def _tool_chunk(req, rid, model, created, n_out, finish, kvp, usage) -> dict | None:
        """A scripted tool call streamed: the name at the first token, the arguments with the finish
        (one chunk with both for a one-token reply), nothing in between."""
        if n_out == 1 and finish is not None:
            call = wire.tool_calls(rid, req.tool_name)[0]
            delta = {"tool_calls": [{**call, "index": 0}]}
        elif n_out == 1:
            delta = wire.tool_call_delta(rid, req.tool_name)
        elif finish is not None:
            delta = wire.tool_call_delta(rid, None)
        else:
            return None
        return wire.chat_chunk(rid, created, model, "", finish, kvp, usage, delta=delta)
