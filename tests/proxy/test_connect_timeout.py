"""A P leg whose connection attempt times out never reached P: the 502 leaves D's blocks offered
for the session's next turn."""

from __future__ import annotations

import contextlib
import socket

import aiohttp

from kvtrace import semconv as sc
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.proxy.server import start
from kvtrace.testing.proxy import BODY, CHAT, FakeWorker, wait_for


@contextlib.contextmanager
def unanswered_port():
    """A loopback port whose accept queue is full: a new connection attempt gets no answer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    for _ in range(4):  # fill the (backlog + 1)-long queue; later SYNs are dropped
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(listener.getsockname())
        fillers.append(s)
    try:
        yield listener.getsockname()[1]
    finally:
        for s in fillers:
            s.close()
        listener.close()


async def test_a_prefill_connect_timeout_keeps_the_offer_for_the_next_turn(tracer_provider, span_exporter):
    p, d = await FakeWorker("p0").start(), await FakeWorker("d0").start()
    with unanswered_port() as silent:
        config = ProxyConfig(
            prefill=[Worker("127.0.0.1", p.port), Worker("127.0.0.1", silent)],  # turns alternate
            decode=[Worker("127.0.0.1", d.port)],
            connect_timeout_s=0.3,
        )
        proxy = await start(config, tracer_provider, port=0)
        statuses = []
        async with aiohttp.ClientSession() as http:
            for _ in range(3):
                async with http.post(proxy.url + CHAT, json={**BODY, sc.BODY_CONVERSATION_ID: "c1"}) as r:
                    statuses.append((r.status, (await r.json()) if r.status != 200 else None))
        await proxy.close()
    await p.close()
    await d.close()
    assert [s for s, _ in statuses] == [200, 502, 200]
    msg = f"prefill worker http://127.0.0.1:{silent} failed: ConnectionTimeoutError"
    assert statuses[1][1] == {"error": {"message": msg, "type": "upstream_error", "code": 502}}
    await wait_for(lambda: len([s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_PROXY_REQUEST]) == 3)
    servers = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_PROXY_REQUEST]
    assert [s.attributes[sc.PROXY_OFFER] for s in servers] == [False, True, True]  # the third still offered
    offered = p.received[1][1]["kv_transfer_params"]  # what P got on the third turn: D's blocks
    assert (offered["remote_engine_id"], offered["remote_block_ids"]) == ("d0", [[1, 2, 3]])
