"""Proxy hardening, each case against fake workers and reproduced first:
unpaired surrogates and over-long ids are 400s and never reach a span; a decode worker failing or
sending garbage mid-stream ends the stream with an SSE error event and [DONE] (one status line, a
well-formed chunked body, every span ended with ERROR); the total request deadline, the upstream
size cap and the client header/body read timeouts; a client gone during the prefill leg keeps the
conversation's KV location; the conversation table is bounded by bytes and /health is O(1)."""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import sys
import tracemalloc

import pytest
from opentelemetry.trace import StatusCode

from kvtrace import semconv as sc
from kvtrace.proxy.table import ConversationTable
from kvtrace.testing.proxy import BODY, CHAT, http_head, raw_request, sse, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def spans_are_utf8(span_exporter):
    """After every test: no attribute of any span holds text that is not valid UTF-8."""
    yield
    for span in span_exporter.get_finished_spans():
        for value in span.attributes.values():
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, str):
                    v.encode("utf-8")  # raises on an unpaired surrogate
        for event in span.events:
            for v in event.attributes.values():
                if isinstance(v, str):
                    v.encode("utf-8")


def _ended(rig) -> bool:
    """Every span the proxy started has ended (the exporter holds ended spans only)."""
    return all(s.end_time for s in rig.exporter.get_finished_spans())


# ---------------------------------------------------------------------------- 1. surrogates
def _conv(value):
    return {**BODY, sc.BODY_CONVERSATION_ID: value}


@pytest.mark.parametrize(
    "body",
    [
        _conv("c\ud800"),
        {**BODY, "model": "\udfff"},
        {**BODY, "messages": [{"role": "user", "content": "hi \ud83d there"}]},
        {**BODY, "messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]},
        {**BODY, "stop": ["\ud800"]},
    ],
    ids=["conversation_id", "model", "content", "content-part", "other-field"],
)
async def test_unpaired_surrogate_in_body_is_400(rig_factory, body):
    rig = await rig_factory()
    raw = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as a \\udXXX escape
    assert b"\\ud" in raw
    status, headers, data = await rig.post(raw=raw)
    assert status == 400 and headers["Content-Type"].startswith("application/json")
    err = json.loads(data)["error"]
    assert (err["code"], err["type"]) == ("invalid_unicode", "invalid_request_error")
    span = await rig.server_span()
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 400
    assert span.attributes[sc.ERROR_TYPE] == "invalid_unicode"
    assert sc.SESSION_ID not in span.attributes and sc.GEN_AI_REQUEST_MODEL not in span.attributes
    assert rig.p.received == [] and rig.d.received == []
    assert (await rig.post())[0] == 200


async def test_paired_surrogate_escape_is_a_valid_character(rig_factory):
    rig = await rig_factory()
    raw = json.dumps(_conv("emoji \U0001f600")).encode()  # a \\ud83d\\ude00 pair
    status, _, _ = await rig.post(raw=raw)
    assert status == 200
    span = await rig.server_span()
    assert span.attributes[sc.SESSION_ID] == "emoji \U0001f600"


@pytest.mark.parametrize("header", [sc.HEADER_SESSION_ID, sc.HEADER_REQUEST_ID])
async def test_header_id_that_is_not_utf8_is_400(rig_factory, header):
    rig = await rig_factory()
    body = json.dumps(BODY).encode()
    # the raw bytes 0xff 0xfe: aiohttp hands them over as surrogate escapes
    got = await raw_request(rig.proxy.url, http_head(CHAT, body, f"{header}: x\udcff\udcfey\r\n"), body)
    assert got.status_lines == ["HTTP/1.1 400 Bad Request"] and got.complete
    assert json.loads(got.body)["error"]["code"] == "invalid_unicode"
    span = await rig.server_span()
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 400
    assert rig.p.received == []


async def test_surrogates_from_the_decode_worker_never_reach_a_span(rig_factory):
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"st\\ud800op"}],"kv_transfer_params":null}\n\n'
    error = b'data: {"error":{"type":"bad\\udfff","message":"m"}}\n\n'
    rig = await rig_factory(d_kwargs={"script": [finish, error, b"data: [DONE]\n\n"]})
    status, _, data = await rig.post()
    assert status == 200 and sse(data)[-1] == "[DONE]"
    span = await rig.server_span()
    assert span.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("st\ufffdop",)
    assert span.attributes[sc.ERROR_TYPE] == "bad\ufffd"


# ---------------------------------------------------------------------------- 3. mid-stream failures
GARBAGE = {
    "choices-not-a-list": b'data: {"finish_reason":"stop","choices":5}\n\n',
    "choice-finish-int": b'data: {"choices":[{"index":0,"finish_reason":5}]}\n\n',
    "usage-not-object": b'data: {"choices":[],"usage":"lots"}\n\n',
    "finish-choices-str": b'data: {"choices":"abc","usage":{"prompt_tokens":1}}\n\n',
    "too-deep": b'data: {"usage":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n\n",
    "kv-params-list-in-finish": b'data: {"choices":[{"finish_reason":"stop","delta":[]}],"kv_transfer_params":[1]}\n\n',
}


def _first_token() -> bytes:
    return b'data: {"choices":[{"index":0,"delta":{"content":"t0"},"finish_reason":null}]}\n\n'


@pytest.mark.parametrize("name", list(GARBAGE))
async def test_garbage_mid_stream_ends_stream_and_spans(rig_factory, name):
    rig = await rig_factory(d_kwargs={"script": [_first_token(), GARBAGE[name], b"data: [DONE]\n\n"]})
    body = json.dumps(BODY).encode()
    got = await raw_request(rig.proxy.url, http_head(CHAT, body, f"{sc.HEADER_REQUEST_ID}: g\r\n"), body)
    assert got.status_lines == ["HTTP/1.1 200 OK"]  # no second status line inside the body
    assert got.complete and got.closed  # a terminated chunked body; Connection: close honoured
    events = sse(got.body)
    assert json.loads(events[0]) == json.loads(_first_token()[6:])  # what D sent before the garbage
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert (err["type"], err["code"]) == ("upstream_error", 502) and "mid-stream" in err["message"]
    span = await rig.server_span()
    assert span.status.status_code == StatusCode.ERROR and span.attributes[sc.ERROR_TYPE] == "invalid_chunk"
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    (leg,) = rig.spans(sc.SPAN_PROXY_DECODE)  # the decode leg ended, with the error
    assert leg.status.status_code == StatusCode.ERROR and leg.attributes[sc.ERROR_TYPE] == "invalid_chunk"
    assert [e.name for e in span.events] == [sc.EVENT_FIRST_TOKEN, sc.EVENT_UPSTREAM_ERROR]
    assert (await rig.post())[0] == 200


async def test_garbage_mid_stream_aiohttp_client_does_not_hang(rig_factory):
    rig = await rig_factory(d_kwargs={"script": [_first_token(), GARBAGE["choices-not-a-list"]]})
    status, _, data = await asyncio.wait_for(rig.post(), 5)
    assert status == 200
    events = sse(data)
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 502


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs the curl command")
async def test_garbage_mid_stream_curl_exits_0(rig_factory):
    """As reported: curl exited 56 (a broken chunked body) on D's garbage mid-stream."""
    rig = await rig_factory(d_kwargs={"script": [_first_token(), GARBAGE["choices-not-a-list"]]})
    proc = await asyncio.create_subprocess_exec(
        "curl",
        "-sS",
        "-N",
        "--max-time",
        "10",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        json.dumps(BODY),
        rig.proxy.url + CHAT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    events = sse(out)
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 502


@pytest.mark.parametrize("name", ["choices-not-a-list", "finish-choices-str", "too-deep"])
async def test_garbage_for_non_streaming_client_is_502(rig_factory, name):
    rig = await rig_factory(d_kwargs={"script": [_first_token(), GARBAGE[name], b"data: [DONE]\n\n"]})
    status, _, data = await rig.post({**BODY, "stream": False})
    assert status == 502 and json.loads(data)["error"]["type"] == "upstream_error"
    span = await rig.server_span()
    assert span.attributes[sc.ERROR_TYPE] == "invalid_chunk"
    (leg,) = rig.spans(sc.SPAN_PROXY_DECODE)
    assert leg.status.status_code == StatusCode.ERROR


async def test_proxy_bug_mid_stream_ends_the_stream(rig_factory, monkeypatch):
    """Any exception once the stream started (here: a bug in the patcher) ends it the same way."""
    from kvtrace.proxy import stream

    def broken(self, line):
        raise KeyError("bug")

    monkeypatch.setattr(stream.StreamPatcher, "_line", broken)
    rig = await rig_factory()
    body = json.dumps(BODY).encode()
    got = await raw_request(rig.proxy.url, http_head(CHAT, body), body)
    assert got.status_lines == ["HTTP/1.1 200 OK"] and got.complete
    events = sse(got.body)
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == 500
    span = await rig.server_span()
    assert span.attributes[sc.ERROR_TYPE] == "KeyError" and span.status.status_code == StatusCode.ERROR
    (leg,) = rig.spans(sc.SPAN_PROXY_DECODE)
    assert leg.attributes[sc.ERROR_TYPE] == "KeyError"


# ---------------------------------------------------------------------------- 4. ids and the table
@pytest.mark.parametrize("where", ["body", "header", "request-id"])
async def test_long_ids_are_400(rig_factory, where):
    rig = await rig_factory()
    long_id = "x" * 257
    body, headers = BODY, {}
    if where == "body":
        body = _conv(long_id)
    elif where == "header":
        headers = {sc.HEADER_SESSION_ID: long_id}
    else:
        headers = {sc.HEADER_REQUEST_ID: long_id}
    status, _, data = await rig.post(body, headers=headers)
    assert status == 400
    err = json.loads(data)["error"]
    assert err["code"] == "id_too_long" and "256 bytes" in err["message"]
    table = rig.proxy.proxy.table
    assert (len(table), table.nbytes) == (0, 0)
    assert (await rig.post(_conv("x" * 256)))[0] == 200  # the limit itself is fine
    assert len(table) == 1


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
async def test_long_ids_do_not_grow_memory(rig_factory):
    """200 requests with 512 KB conversation ids: before, each id was kept (table key, span
    attributes, the P and D bodies): +100 MB or more.  Now each is a 400 and RSS stays flat."""
    rig = await rig_factory(max_body_bytes=1 << 20)
    raw = [json.dumps(_conv(f"{i:04d}" + "y" * (512 * 1024))).encode() for i in range(4)]
    for i in range(20):  # warm the allocator with the same request sizes
        await rig.post(raw=raw[i % 4])
    before = _rss_bytes()
    statuses = set()
    for i in range(200):
        statuses.add((await rig.post(raw=raw[i % 4]))[0])
    grown = _rss_bytes() - before
    assert statuses == {400}
    assert grown < 20 * 1024 * 1024, f"RSS grew {grown / 2**20:.1f} MiB"
    assert len(rig.proxy.proxy.table) == 0


def test_table_is_bounded_by_bytes_lru():
    t = ConversationTable(ttl_s=450, max_entries=1000, max_bytes=10_000)
    params = {"remote_block_ids": [list(range(300))]}  # ~1.4 KB of JSON
    for i in range(20):
        t.begin(f"c{i}")
        t.store(f"c{i}", 0, params, "http://d")
    assert t.nbytes <= 10_000
    kept = [f"c{i}" for i in range(20) if t.peek(f"c{i}") is not None]
    assert kept == [f"c{i}" for i in range(20 - len(kept), 20)]  # the most recent survive
    assert t.evicted_lru == 20 - len(kept) > 0
    assert len(t) == len(kept) and t.peek(kept[-1]).params == params
    for key in kept:
        t.begin(key).consumed()  # taking entries releases their bytes
    assert t.nbytes == sum(t.key_bytes(k) for k in kept)


def test_table_memory_stays_within_its_byte_bound(monkeypatch):
    """What the table really holds (tracemalloc) stays within --max-table-bytes (+5 %: the dicts'
    spare slots after evictions are not counted) while 4000 conversations with D params of
    0-800 block ids pass through it."""
    from kvtrace import jsoncodec as codec

    monkeypatch.setattr(codec, "_nonfinite_seen", False)  # orjson, whatever earlier tests decoded
    bound = 512 << 10
    t = ConversationTable(ttl_s=450, max_entries=10**6, max_bytes=bound)
    params = [{"remote_block_ids": [list(range(n))], "remote_engine_id": "d0"} for n in range(0, 801, 16)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(4000):
            key = f"conversation-{i}"
            t.begin(key)
            t.store(key, 0, params[i % len(params)], "http://d")
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert t.nbytes <= bound and held <= bound * 1.05, (t.nbytes, held)
    assert t.evicted_lru > 3000 and len(t) > 100


def test_table_entry_larger_than_the_byte_bound_is_not_kept():
    t = ConversationTable(ttl_s=450, max_bytes=2_000)
    t.begin("a")
    assert not t.store("a", 0, {"remote_block_ids": [list(range(2000))]}, "d")
    assert t.peek("a") is None and t.nbytes <= 2_000 and t.evicted_lru == 1


def test_stale_entries_expire_incrementally():
    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()
    t = ConversationTable(ttl_s=5, clock=clock)
    t.store("a", 0, {}, "d")
    clock.t = 3
    t.store("b", 0, {}, "d")
    clock.t = 6  # a is stale, b is not
    t.store("c", 0, {}, "d")  # each store expires what is stale at the front
    assert (t.peek("a"), t.evicted_stale, len(t)) == (None, 1, 2)
    assert t.health()["cached_conversations"] == 2


def _opcodes(fn) -> int:
    """Bytecode instructions executed by ``fn()`` in Python frames (a deterministic cost measure)."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


@pytest.mark.parametrize("n", [100_000])
def test_health_cost_does_not_grow_with_the_table(n):
    from kvtrace.proxy.app import Proxy
    from kvtrace.proxy.config import ProxyConfig, Worker

    def proxy_with(entries: int) -> Proxy:
        px = Proxy(ProxyConfig(prefill=[Worker("h", 1)], decode=[Worker("h", 2)], max_conversations=10 * n))
        for i in range(entries):
            px.table.begin(f"conv-{i}")
            px.table.store(f"conv-{i}", 0, {"remote_block_ids": [[i]]}, "http://d")
        return px

    small, big = proxy_with(10), proxy_with(n)
    assert big.table.health()["cached_conversations"] == n
    gc.disable()  # no collector callbacks inside the measured calls
    try:
        cost = [min(_opcodes(lambda px=px: px.health_body()) for _ in range(3)) for px in (small, big)]
    finally:
        gc.enable()
    assert cost[0] == cost[1] and cost[0] < 300, cost  # constant: the table, the prefix chains, the workers down


# ---------------------------------------------------------------------------- 5. deadlines and sizes
async def test_trickling_decoder_is_cut_at_the_request_deadline(rig_factory):
    rig = await rig_factory(d_kwargs={"trickle_s": 0.02, "tokens": 3}, request_timeout_s=0.5, read_timeout_s=5)
    status, _, data = await asyncio.wait_for(rig.post(), 10)
    assert status == 200
    events = sse(data)
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "t0"
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert (err["type"], err["code"]) == ("deadline_exceeded", 504)
    await asyncio.wait_for(rig.d.cancelled.wait(), 5)  # D's request was abandoned
    span = await rig.server_span()
    assert span.attributes[sc.ERROR_TYPE] == "deadline_exceeded" and span.status.status_code == StatusCode.ERROR
    assert span.attributes[sc.REQUEST_LATENCY_MS] >= 500
    (leg,) = rig.spans(sc.SPAN_PROXY_DECODE)
    assert leg.attributes[sc.ERROR_TYPE] == "deadline_exceeded"


async def test_stalled_prefill_is_cut_at_the_request_deadline(rig_factory):
    # a deadline P's request surely reaches P within: at 0.3 s one CI run's P never saw it cancelled
    rig = await rig_factory(p_kwargs={"stall_after": 0}, request_timeout_s=1.0, prefill_failure="decode_only")
    status, _, data = await asyncio.wait_for(rig.post(), 10)
    assert status == 504  # no time is left for a decode-only fallback
    assert json.loads(data)["error"]["type"] == "deadline_exceeded"
    await asyncio.wait_for(rig.p.cancelled.wait(), 5)
    span = await rig.server_span()
    assert span.attributes[sc.ERROR_TYPE] == "deadline_exceeded"
    (leg,) = rig.spans(sc.SPAN_PROXY_PREFILL)
    assert leg.attributes[sc.ERROR_TYPE] == "deadline_exceeded"
    assert rig.d.received == []


@pytest.mark.parametrize("stream", [True, False])
async def test_oversized_decode_response_is_cut(rig_factory, stream):
    rig = await rig_factory(d_kwargs={"pad_bytes": 3 << 20}, max_upstream_bytes=1 << 20)
    status, _, data = await rig.post({**BODY, "stream": stream})
    if stream:
        assert status == 200 and len(data) < 2 << 20
        events = sse(data)
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["type"] == "upstream_error"
        assert "1048576 bytes" in json.loads(events[-2])["error"]["message"]
    else:
        assert status == 502 and "1048576 bytes" in json.loads(data)["error"]["message"]
    span = await rig.server_span()
    assert span.attributes[sc.ERROR_TYPE] == "response_too_large"
    (leg,) = rig.spans(sc.SPAN_PROXY_DECODE)
    assert leg.attributes[sc.ERROR_TYPE] == "response_too_large"


async def test_oversized_prefill_response_is_a_prefill_failure(rig_factory):
    rig = await rig_factory(p_kwargs={"pad_bytes": 3 << 20}, max_upstream_bytes=1 << 20)
    status, _, data = await rig.post()
    assert status == 502 and "response_too_large" in json.loads(data)["error"]["message"]
    (leg,) = rig.spans(sc.SPAN_PROXY_PREFILL)
    assert leg.attributes[sc.ERROR_TYPE] == "response_too_large"


async def _closed_by_server(reader, timeout=5.0) -> bytes:
    """Read until the server closes the connection (bounded by ``timeout``)."""
    return await asyncio.wait_for(reader.read(), timeout)


async def test_client_that_never_finishes_its_headers_is_dropped(rig_factory):
    rig = await rig_factory(client_header_timeout_s=0.3)
    host, port = rig.proxy.url.rsplit("//", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # ... and nothing more
    await writer.drain()
    assert await _closed_by_server(reader) == b""
    writer.close()
    assert (await rig.post())[0] == 200


async def test_half_sent_body_gets_408(rig_factory):
    rig = await rig_factory(client_body_timeout_s=0.3)
    body = json.dumps(BODY).encode()
    host, port = rig.proxy.url.rsplit("//", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(http_head(CHAT, body, connection="keep-alive") + body[:10])  # the rest never comes
    await writer.drain()
    data = await _closed_by_server(reader)
    writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert json.loads(rest)["error"]["code"] == "body_timeout"
    span = await rig.server_span()
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 408
    assert rig.p.received == []


# ---------------------------------------------------------------------------- 8. disconnect during prefill
async def test_client_gone_during_prefill_keeps_the_location(rig_factory):
    rig = await rig_factory()
    conv = _conv("keep")
    assert (await rig.post(conv))[0] == 200  # turn 0: D's blocks are now in the table
    rig.p.stall_after = 0
    task = asyncio.ensure_future(rig.post(conv))  # turn 1: P never answers ...
    await asyncio.wait_for(rig.p.stalled.wait(), 5)
    task.cancel()  # ... and the client goes away
    await asyncio.wait_for(rig.p.cancelled.wait(), 5)
    span = await rig.server_span(2)
    assert span.attributes[sc.ERROR_TYPE] == "client_disconnect"
    (leg,) = [s for s in rig.spans(sc.SPAN_PROXY_PREFILL) if s.attributes.get(sc.ERROR_TYPE) == "client_disconnect"]
    assert leg.status.status_code == StatusCode.ERROR
    rig.p.stall_after = None
    assert (await rig.post(conv))[0] == 200  # turn 2 is offered turn 0's blocks
    third = await rig.server_span(3)
    assert (third.attributes[sc.TURN_INDEX], third.attributes[sc.PROXY_OFFER_REASON]) == (2, sc.OFFER_OFFERED)
    await wait_for(lambda: _ended(rig))
