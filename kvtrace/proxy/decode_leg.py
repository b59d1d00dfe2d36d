"""The proxy's D leg: open it, stream it back to the client through :class:`.stream.StreamPatcher`
(or aggregate it for a non-streaming client), keep D's final ``kv_transfer_params`` for the next
turn once they are valid, and record the served turn in the prefix table.  A mixin of
:class:`kvtrace.proxy.app.Proxy` (its ``config``, ``pool``, ``table``, ``chains``, ``retention`` and
``metrics``); the failure rules are the module docstring of :mod:`kvtrace.proxy.app`.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from kvtrace import semconv as sc
from kvtrace.proxy import legs
from kvtrace.proxy.call import CLIENT_GONE, Call, Done, end_stream, stream_failure
from kvtrace.proxy.config import ProxyConfig
from kvtrace.proxy.decoder_ttl import Retention
from kvtrace.proxy.metrics import ProxyMetrics
from kvtrace.proxy.parse import CHAT_PATH
from kvtrace.proxy.prefix_table import PrefixTable
from kvtrace.proxy.spans import end_leg
from kvtrace.proxy.stream import Aggregator, InvalidChunk, StreamPatcher
from kvtrace.proxy.table import ConversationTable
from kvtrace.proxy.upstream import UPSTREAM_ERRORS, Client, Pool, TooLarge, never_reached, pump, read_body


class DecodeLeg:
    """The D-leg half of :class:`~kvtrace.proxy.app.Proxy`, which sets these."""

    config: ProxyConfig
    pool: Pool
    table: ConversationTable
    chains: PrefixTable | None
    retention: Retention
    metrics: ProxyMetrics | None

    def _served(self, call: Call, reply: dict | str | None) -> None:
        """D finished the turn: the prefix table records its prompt and the reply."""
        if call.prompt is not None and call.session_id is not None and self.chains is not None and not call.recorded:
            call.recorded = True
            self.chains.served(call.session_id, call.prompt, reply, call.turn.index)

    async def _open_decode(self, call: Call):
        """D's leg, up to its response head; a D that cannot be reached passes the leg to another."""
        holder = call.turn.entry.decode_endpoint if call.turn.entry is not None else None
        if self.pool.fleet:
            call.route_policy = self.config.routing
        tried: tuple[Client, ...] = ()
        while True:
            choice = self.pool.choose_decode(call.session_id, holder, tried)
            assert choice is not None  # the loop ends before every D was tried
            client, call.d_route = choice
            call.d_client, tried = client, (*tried, client)
            call.decode_attempts = len(tried)
            call.decoder_ttl_s = self.retention.ttl(client.base)
            attrs = {sc.PROXY_DECODE_ENDPOINT: client.base, **({sc.PROXY_FAILOVER: True} if len(tried) > 1 else {})}
            span, tp = call.rt.leg(sc.SPAN_PROXY_DECODE, client.host, client.port, **attrs)
            call.legs.append(span)
            failed: Exception | None = None
            try:
                async with asyncio.timeout_at(call.deadline):
                    try:
                        r, data = await self._post_decode(call, client, span, tp)
                    except (*UPSTREAM_ERRORS, TooLarge) as exc:
                        failed = exc
            except TimeoutError:
                raise Done(self._deadline(call)) from None
            if failed is None:
                break
            etype = sc.ERROR_RESPONSE_TOO_LARGE if isinstance(failed, TooLarge) else type(failed).__name__
            unreached = never_reached(failed)
            end_leg(span, None, etype, **({sc.PROXY_UNREACHABLE: True} if unreached else {}))
            if not unreached or len(tried) == len(self.pool.decode):
                raise Done(self._decode_failed(call, etype, f"decode worker {client.base} failed: {etype}"))
            call.rt.upstream_error(etype, client.host, client.port)
        if r.status != 200:
            end_leg(span, r.status, str(r.status))
            if r.status < 500:
                raise Done(call.passthrough(r.status, data))
            raise Done(self._decode_failed(call, str(r.status), f"decode worker {client.base} failed: {r.status}"))
        return r, span

    async def _post_decode(self, call: Call, client: Client, span, tp) -> tuple[aiohttp.ClientResponse, bytes]:
        """POST D's leg; its response, and its body when D did not answer 200."""
        p_params = None if call.fallback == sc.FALLBACK_DECODE_ONLY else call.p_params
        body = legs.decode_body(call.req.body, p_params, legs.context(tp, call.session_id, call.turn.index))
        hdrs = legs.headers(call.request_id, tp, call.auth)
        data = b""
        r = await client.post(call.req.path, span, body, hdrs)
        if r.status != 200:
            try:
                data = await read_body(r, self.config.max_upstream_bytes)
            finally:
                r.release()
        return r, data

    def _decode_failed(self, call: Call, etype: str, msg: str) -> web.Response:
        call.rt.upstream_error(etype, call.decoder.host, call.decoder.port)
        return call.fail(502, etype, msg, "upstream_error")

    def _deadline(self, call: Call) -> web.Response:
        msg = f"request not completed within {self.config.request_timeout_s:g} s"
        return call.fail(504, sc.ERROR_DEADLINE_EXCEEDED, msg, sc.ERROR_DEADLINE_EXCEEDED)

    def _on_params(self, call: Call, params: dict) -> None:
        """D's final kv_transfer_params: remember where its blocks live for the next turn."""
        problem = legs.invalid_decode_params(params)
        if problem is not None:  # never kept nor offered: P would act on what D got wrong
            call.decode_params_invalid = problem[1]
            if self.metrics is not None:
                self.metrics.decode_params_rejected(problem[0])
            return
        base = call.decoder.base
        params["remote_host"] = call.decoder.host
        call.d_params = params
        self.retention.learn(base, params)
        call.decoder_ttl_s = self.retention.ttl(base)
        if legs.cacheable(params):
            self.table.store(call.session_id, call.turn.index, legs.kept(params), base)

    async def _decode_stream(self, call: Call, request: web.Request) -> web.StreamResponse:
        r, span = await self._open_decode(call)
        rt = call.rt
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        if call.patch:
            resp.headers[sc.HEADER_TRACE_ID] = rt.trace_id
        reply = call.reply
        patcher = StreamPatcher(
            patch_usage_chunk=call.req.include_usage,
            drop_usage=not call.req.include_usage,
            make_kv=call.kv_object if call.patch else None,
            on_params=lambda p: self._on_params(call, p),
            reply=reply,
            on_finish=None
            if call.prompt is None
            else lambda: self._served(call, reply.message() if reply is not None else None),
        )

        ended = False  # the client's stream is complete: the end of its body went out

        async def forward(chunk: bytes) -> None:
            nonlocal ended
            if patcher.done:
                return  # D's bytes after [DONE] (vLLM sends none): read to the end of its body, not sent
            out = patcher.feed(chunk)
            if patcher.done:  # its last event and the end of the chunked body in one write
                await resp.write_eof(out)
                ended = True
            elif out:
                await resp.write(out)

        error, failure, due = None, None, b""
        try:
            try:
                async with asyncio.timeout_at(call.deadline):
                    await resp.prepare(request)
                    error = await pump(r, self.config.max_upstream_bytes, rt.first_token, forward)
                    tail = b"" if patcher.done else patcher.flush()
                    if tail:
                        await resp.write(tail)
            except CLIENT_GONE:
                raise
            except Exception as exc:  # the deadline, D's garbage, or a proxy bug: end the stream all the same
                error, failure, due = stream_failure(call, exc, self.config.request_timeout_s)
            if error is None and not patcher.done:
                error = sc.ERROR_INCOMPLETE_STREAM
            if error is not None:
                return await end_stream(
                    call, request, resp, r, span, error, failure, due, ended, self.config.max_upstream_bytes
                )
            if patcher.error is not None:
                error = str(patcher.error.get("type") or "upstream_error")
            await resp.write_eof()
        except CLIENT_GONE:
            r.close()
            call.disconnected()
            return resp
        finally:
            r.release() if error is None and patcher.done else r.close()
        call.usage, call.finish_reasons = patcher.usage, patcher.finish_reasons
        end_leg(span, 200, error, **{sc.REQUEST_TTFT_MS: rt.ttft_ms})
        call.finish(200, error)
        return resp

    async def _decode_aggregate(self, call: Call) -> web.Response:
        r, span = await self._open_decode(call)
        rt = call.rt
        agg = Aggregator(chat=call.req.path == CHAT_PATH)
        error = None

        async def collect(chunk: bytes) -> None:
            agg.feed(chunk)

        try:
            async with asyncio.timeout_at(call.deadline):
                error = await pump(r, self.config.max_upstream_bytes, rt.first_token, collect)
                agg.flush()
        except TimeoutError:
            error = sc.ERROR_DEADLINE_EXCEEDED
        except InvalidChunk:
            error = sc.ERROR_INVALID_CHUNK
        finally:
            r.release() if error is None and agg.done else r.close()
        if error is None and not agg.done:
            error = sc.ERROR_INCOMPLETE_STREAM
        if error is None and agg.error is not None:
            error = str(agg.error.get("type") or "upstream_error")
        end_leg(span, 200, error, **{sc.REQUEST_TTFT_MS: rt.ttft_ms})
        if error == sc.ERROR_DEADLINE_EXCEEDED:
            return self._deadline(call)
        if error is not None:
            why = (
                f"response exceeds {self.config.max_upstream_bytes} bytes"
                if error == sc.ERROR_RESPONSE_TOO_LARGE
                else error
            )
            return self._decode_failed(call, error, f"decode worker {call.decoder.base} failed: {why}")
        if agg.kv_params is not None:
            self._on_params(call, agg.kv_params)
        call.usage, call.finish_reasons = agg.usage, agg.finish_reasons
        body = agg.body()
        if call.prompt is not None and agg.finish_reasons:
            choices = body["choices"]
            one = choices[0] if len(choices) == 1 and isinstance(choices[0], dict) else {}
            self._served(call, one.get("message") if call.req.path == CHAT_PATH else one.get("text"))
        if call.patch:
            body[sc.RESPONSE_KV_TRANSFER] = call.kv_object()
        call.finish(200, None)
        return call.json(body, 200)
