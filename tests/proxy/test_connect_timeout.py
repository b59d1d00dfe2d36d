"""A leg whose connection attempt times out never reached its worker: in a fleet the leg goes on to
another worker of the role (with the same offer); with none left the 502 leaves D's blocks offered
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
def unanswered_port(port: int = 0):
    """A loopback port whose accept queue is full: a new connection attempt gets no answer."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
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


def _servers(span_exporter) -> list:
    return [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_PROXY_REQUEST]


def _leg_spans(span_exporter, server) -> list:
    """The P legs of request span ``server``, in the order they started."""
    legs = [
        s
        for s in span_exporter.get_finished_spans()
        if s.name == sc.SPAN_PROXY_PREFILL and s.parent.span_id == server.context.span_id
    ]
    return sorted(legs, key=lambda s: s.start_time)


def _legs(span_exporter, server) -> list[tuple]:
    keep = (sc.SERVER_PORT, sc.PROXY_OFFER, sc.PROXY_FAILOVER, sc.ERROR_TYPE)
    return [tuple(s.attributes.get(k) for k in keep) for s in _leg_spans(span_exporter, server)]


async def test_a_prefill_connect_timeout_goes_on_to_another_prefiller(tracer_provider, span_exporter):
    p, d = await FakeWorker("p0").start(), await FakeWorker("d0").start()
    with unanswered_port() as silent:
        config = ProxyConfig(
            prefill=[Worker("127.0.0.1", p.port), Worker("127.0.0.1", silent)],  # turns alternate
            decode=[Worker("127.0.0.1", d.port)],
            connect_timeout_s=0.3,
            routing=sc.ROUTING_ROUND_ROBIN,
        )
        proxy = await start(config, tracer_provider, port=0)
        statuses = []
        async with aiohttp.ClientSession() as http:
            for _ in range(4):
                async with http.post(proxy.url + CHAT, json={**BODY, sc.BODY_CONVERSATION_ID: "c1"}) as r:
                    statuses.append(r.status)
        await proxy.close()
    await p.close()
    await d.close()
    assert statuses == [200] * 4
    await wait_for(lambda: len(_servers(span_exporter)) == 4)
    servers = _servers(span_exporter)
    assert [s.attributes[sc.PROXY_OFFER] for s in servers] == [False, True, True, True]
    got = [
        (
            s.attributes[sc.ROUTE_PREFILL_REASON],
            s.attributes.get(sc.PROXY_PREFILL_ATTEMPTS),
            s.attributes[sc.PROXY_PREFILL_ENDPOINT],
        )
        for s in servers
    ]
    # turn 1: the rotation's silent P, then P0 (failover); turn 3: the silent P is out (cooldown), the turn passes it
    assert (
        got
        == [(sc.ROUTE_ROTATION, None, p.url), (sc.ROUTE_FAILOVER, 2, p.url)] + [(sc.ROUTE_ROTATION, None, p.url)] * 2
    )
    assert _legs(span_exporter, servers[1]) == [
        (silent, True, None, "ConnectionTimeoutError"),
        (p.port, True, True, None),
    ]
    ident = {
        sc.SESSION_ID: "c1",
        sc.GEN_AI_CONVERSATION_ID: "c1",
        sc.TURN_INDEX: 1,
        sc.GEN_AI_REQUEST_ID: servers[1].attributes[sc.GEN_AI_REQUEST_ID],
    }
    failed, failover = _leg_spans(span_exporter, servers[1])
    assert dict(failed.attributes) == {
        **ident,
        sc.SERVER_ADDRESS: "127.0.0.1",
        sc.SERVER_PORT: silent,
        sc.PROXY_PREFILL_ENDPOINT: f"http://127.0.0.1:{silent}",
        sc.PROXY_OFFER: True,
        sc.PROXY_UNREACHABLE: True,
        sc.ERROR_TYPE: "ConnectionTimeoutError",
    }
    assert dict(failover.attributes) == {
        **ident,
        sc.SERVER_ADDRESS: "127.0.0.1",
        sc.SERVER_PORT: p.port,
        sc.PROXY_PREFILL_ENDPOINT: p.url,
        sc.PROXY_OFFER: True,
        sc.PROXY_FAILOVER: True,
        sc.HTTP_RESPONSE_STATUS_CODE: 200,
    }
    assert _legs(span_exporter, servers[3]) == [(p.port, True, None, None)]
    upstream = [e for e in servers[1].events if e.name == sc.EVENT_UPSTREAM_ERROR]
    assert [dict(e.attributes) for e in upstream] == [
        {sc.ERROR_TYPE: "ConnectionTimeoutError", sc.SERVER_ADDRESS: "127.0.0.1", sc.SERVER_PORT: silent}
    ]
    offered = [body["kv_transfer_params"] for _, body in p.received[1:]]  # turns 1 to 3, all at P0: D's blocks
    assert [(o["remote_engine_id"], o["remote_block_ids"]) for o in offered] == [("d0", [[1, 2, 3]])] * 3


async def test_with_no_prefiller_left_the_502_keeps_the_offer_for_the_next_turn(tracer_provider, span_exporter, caplog):
    p, d = await FakeWorker("p0").start(), await FakeWorker("d0").start()
    port = p.port
    config = ProxyConfig(
        prefill=[Worker("127.0.0.1", port)], decode=[Worker("127.0.0.1", d.port)], connect_timeout_s=0.3
    )
    proxy = await start(config, tracer_provider, port=0)
    body = {**BODY, sc.BODY_CONVERSATION_ID: "c1"}
    replies = []
    async with aiohttp.ClientSession() as http:

        async def post() -> None:
            async with http.post(proxy.url + CHAT, json=body) as r:
                replies.append((r.status, (await r.json()) if r.status != 200 else None))

        await post()
        await p.close()
        with unanswered_port(port):  # P's port stops answering
            await post()
        p2 = await FakeWorker("p0").start(port)
        await post()
    await proxy.close()
    await p2.close()
    await d.close()
    assert [s for s, _ in replies] == [200, 502, 200]
    base = f"http://127.0.0.1:{port}"
    assert [r.getMessage() for r in caplog.records if r.name == "kvtrace.proxy.upstream"] == [
        f"kvtrace proxy: prefill worker {base} could not be reached (ConnectionTimeoutError): "
        "out of the routing for 5 s",
        f"kvtrace proxy: prefill worker {base} answers again: back in the routing",
    ]
    msg = f"prefill worker http://127.0.0.1:{port} failed: ConnectionTimeoutError"
    assert replies[1][1] == {"error": {"message": msg, "type": "upstream_error", "code": 502}}
    await wait_for(lambda: len(_servers(span_exporter)) == 3)
    servers = _servers(span_exporter)
    assert [s.attributes[sc.PROXY_OFFER] for s in servers] == [False, True, True]  # the third still offered
    offered = p2.received[0][1]["kv_transfer_params"]  # what P got on the third turn: D's blocks
    assert (offered["remote_engine_id"], offered["remote_block_ids"]) == ("d0", [[1, 2, 3]])
