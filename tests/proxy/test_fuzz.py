"""The proxy's fuzz corpus: what clients and decode workers may send, and the proxy stays healthy.

- Client side: a Hypothesis fuzz of request bodies (JSON of every shape, random bytes, unpaired
  surrogates, over-long ids) through the parser and over HTTP, plus a checked-in corpus of the
  inputs that once broke it: never a 5xx, always a JSON error, and a valid request
  succeeds right after each.
- Worker side: a Hypothesis fuzz of D's stream (valid chunks, garbage chunks of every JSON shape,
  raw bytes, cut streams): a streaming client always gets one status line, a well-formed chunked
  body ending in ``data: [DONE]``, a non-streaming client 200 or 502 with a JSON body, and the
  proxy keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import threading

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace import semconv as sc
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.proxy.parse import CHAT_PATH, RequestError, parse_request
from kvtrace.testing.proxy import http_head, raw_request, sse

_text = st.text(max_size=8) | st.text(
    st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010, exclude_categories=()), max_size=4
)
_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
_keys = st.sampled_from(
    [
        "model",
        "messages",
        "prompt",
        "stream",
        "stream_options",
        "max_tokens",
        "n",
        "max_completion_tokens",
        "min_tokens",
        sc.BODY_CONVERSATION_ID,
        "kv_transfer_params",
    ]
)
_ids = st.text(min_size=250, max_size=262) | st.text(
    st.characters(min_codepoint=0x4E00, max_codepoint=0x4E10), min_size=80, max_size=90
)
_bodies = st.one_of(
    st.binary(max_size=64),
    st.dictionaries(_keys, _values, max_size=6).map(lambda d: json.dumps(d).encode()),
    _values.map(lambda v: json.dumps(v).encode()),
    st.tuples(_ids, _text).map(
        lambda t: json.dumps(
            {"model": t[1], "messages": [{"role": "user", "content": t[1]}], sc.BODY_CONVERSATION_ID: t[0]}
        ).encode()
    ),
)
VALID = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()


def _body(**kw) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, **kw}).encode()


# inputs that once broke the proxy or are close to them: (body, extra header lines, error code)
_U, _L, _J = "invalid_unicode", "id_too_long", "invalid_json"
CLIENT_CORPUS = {
    "surrogate-conversation-id": (_body(conversation_id="\ud800"), "", _U),
    "surrogate-model": (_body(model="m\udfff"), "", _U),
    "surrogate-content": (_body(messages=[{"role": "user", "content": "\ud83d"}]), "", _U),
    "surrogate-raw-bytes": (b'{"model":"m","messages":[{"role":"user","content":"\xed\xa0\x80"}]}', "", _U),
    "surrogate-utf16-body": (
        '{"model":"m","messages":[{"role":"user","content":"\ud800"}]}'.encode("utf-16", "surrogatepass"),
        "",
        _U,
    ),
    "long-conversation-id": (_body(conversation_id="c" * 5000), "", _L),
    "long-multibyte-id": (_body(conversation_id="\u4e00" * 100), "", _L),  # 100 chars, 300 bytes
    "long-session-header": (_body(), f"{sc.HEADER_SESSION_ID}: {'s' * 300}\r\n", _L),
    "undecodable-session-header": (_body(), f"{sc.HEADER_SESSION_ID}: \udcff\udcfe\r\n", _U),
    "undecodable-request-id": (_body(), f"{sc.HEADER_REQUEST_ID}: r\udc80\r\n", _U),
    "long-baggage-session": (_body(), f"baggage: session.id={'b' * 300}\r\n", _L),
    "deep-json": (b"[" * 100_000, "", _J),
}


@given(_bodies)
@settings(max_examples=300, deadline=None)
def test_parser_only_raises_request_errors(raw):
    try:
        req = parse_request(raw, CHAT_PATH)
    except RequestError as exc:
        assert 400 <= exc.status < 500 and exc.body()["error"]["message"]
    else:
        assert isinstance(req.body["messages"], list) and sc.BODY_CONVERSATION_ID not in req.body
        json.dumps(req.body).encode()  # whatever passes is text UTF-8 can carry
        assert req.conversation_id is None or len(req.conversation_id.encode()) <= 256


class _Live:
    """A proxy over fake workers on a background loop (hypothesis tests are synchronous)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.p, self.d, self.proxy, self.http = self.run(self._setup())

    def run(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _setup(self):
        from kvtrace.proxy.server import start
        from kvtrace.testing.proxy import FakeWorker

        p, d = await FakeWorker("p0").start(), await FakeWorker("d0").start()
        config = ProxyConfig(
            prefill=[Worker("127.0.0.1", p.port)],
            decode=[Worker("127.0.0.1", d.port)],
            max_body_bytes=1 << 20,
            request_timeout_s=10,
        )
        return p, d, await start(config, None, port=0), aiohttp.ClientSession()

    def post(self, raw: bytes, headers=None):
        async def go():
            async with self.http.post(self.proxy.url + CHAT_PATH, data=raw, headers=headers or {}) as r:
                return r.status, await r.read()

        return self.run(go())

    def raw(self, body: bytes, extra: str = ""):
        return self.run(raw_request(self.proxy.url, http_head(CHAT_PATH, body, extra), body, timeout=10))

    def healthy(self) -> bool:
        self.d.script = None
        status, data = self.post(VALID)
        return status == 200

    def close(self) -> None:
        async def teardown():
            await self.http.close()
            await self.proxy.close()
            await self.p.close()
            await self.d.close()

        self.run(teardown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def live():
    proxy = _Live()
    yield proxy
    proxy.close()


@given(_bodies)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_requests_never_5xx(live, raw):
    status, data = live.post(raw)
    assert status < 500, data
    if status >= 400:
        assert json.loads(data)["error"]["message"]
    assert live.healthy()


@pytest.mark.parametrize("name", list(CLIENT_CORPUS))
def test_client_corpus_is_4xx_and_proxy_stays_healthy(live, name):
    body, extra, code = CLIENT_CORPUS[name]
    px = live.proxy.proxy
    before = (px.table.health()["table_bytes"], px.chains.health()["prefix_table_bytes"])
    got = live.raw(body, extra)
    assert got.status_lines == ["HTTP/1.1 400 Bad Request"] and got.complete, (got.status_lines, got.body[:200])
    assert json.loads(got.body)["error"]["code"] == code
    assert (px.table.health()["table_bytes"], px.chains.health()["prefix_table_bytes"]) == before  # nothing kept
    assert live.healthy()


# ---------------------------------------------------------------------------- D's stream
def _chunk(choices=None, **extra) -> dict:
    return {"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": choices or [], **extra}


_token = st.builds(
    lambda t: _chunk([{"index": 0, "delta": {"content": t}, "finish_reason": None}]), st.text(max_size=6)
)
_finish = st.builds(
    lambda p: _chunk([{"index": 0, "delta": {}, "finish_reason": "length"}], kv_transfer_params=p),
    st.none() | st.just({"do_remote_decode": True, "remote_block_ids": [[1, 2]]}),
)
_usage = st.just(_chunk(usage={"prompt_tokens": 3, "completion_tokens": 2}))
_garbage = st.dictionaries(
    st.sampled_from(["choices", "finish_reason", "usage", "error", "kv_transfer_params", "delta", "index"]),
    _values,
    min_size=1,
    max_size=4,
)
_line = st.one_of(
    _token.map(lambda o: b"data: " + json.dumps(o).encode() + b"\n\n"),
    _finish.map(lambda o: b"data: " + json.dumps(o).encode() + b"\n\n"),
    _usage.map(lambda o: b"data: " + json.dumps(o).encode() + b"\n\n"),
    _garbage.map(lambda o: b"data: " + json.dumps(o).encode() + b"\n\n"),
    st.binary(max_size=24),
    st.sampled_from(
        [
            b": keep-alive\n\n",
            b"data: [1,2]\n\n",
            b'data: {"usage": nope}\n\n',
            b"\n",
            b'data: {"choices":[{"finish_reason":"stop","delta":[1]}]}\n\n',
        ]
    ),
)
_streams = st.tuples(st.lists(_line, max_size=6), st.booleans())


@given(_streams, st.booleans())
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_decoder_streams_end_cleanly(live, stream, client_streams):
    lines, done = stream
    live.d.script = lines + ([b"data: [DONE]\n\n"] if done else [])
    if client_streams:
        body = _body(max_tokens=2)
        got = live.raw(body)
        assert got.status_lines == ["HTTP/1.1 200 OK"] and got.complete and got.closed
        assert got.body.endswith(b"data: [DONE]\n\n")
    else:
        status, data = live.post(_body(max_tokens=2, stream=False))
        assert status in (200, 502), data
        obj = json.loads(data)
        assert ("error" in obj) == (status == 502)
    assert live.healthy()


def test_decoder_corpus_garbage_after_tokens(live):
    """The reported example (garbage after tokens), with the tokens before it reaching the client first."""
    first = b'data: {"choices":[{"index":0,"delta":{"content":"t0"},"finish_reason":null}]}\n\n'
    live.d.script = [first + b'data: {"finish_reason":"stop","choices":5}\n\n']
    got = live.raw(_body())
    events = sse(got.body)
    assert got.status_lines == ["HTTP/1.1 200 OK"] and got.complete
    assert events[0] == first[6:].decode().strip() and events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == 502
    assert live.healthy()
