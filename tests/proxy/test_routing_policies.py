"""The proxy's routing policies over a zero-cost simulated fleet (2 P, 3 D): where each turn goes,
why (the request span's kvtrace.route.* attributes), and what it does to reuse (local prefix hits
on the session's P or D)."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc

TURNS = 4


async def _conversation(stack, conv="c1", turns=TURNS):
    messages = [{"role": "user", "content": "plan a trip to the mountains in spring " * 8}]
    for i in range(turns):
        text, _, _ = await stack.chat(messages, conv=conv)
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"more on step {i}"}]


def _route(span) -> tuple:
    a = span.attributes
    return (
        a.get(sc.ROUTE_POLICY),
        a[sc.PROXY_PREFILL_ENDPOINT],
        a.get(sc.ROUTE_PREFILL_REASON),
        a[sc.PROXY_DECODE_ENDPOINT],
        a.get(sc.ROUTE_DECODE_REASON),
    )


def _hits(stack, direction: str) -> list[int]:
    """Local prefix hits of the decisions of ``direction`` (d2p: P's, p2d: D's), in turn order."""
    ds = [d for d in stack.spans(sc.SPAN_KV_DECISION) if d.attributes[sc.KV_DIRECTION] == direction]
    return [d.attributes[sc.KV_LOCAL_HIT_TOKENS] for d in sorted(ds, key=lambda s: s.start_time)]


async def _run(make_stack, policy):
    stack = await make_stack(n_prefill=2, n_decode=3, routing=policy)
    await _conversation(stack)
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, TURNS)
    return stack, [_route(s) for s in servers]


async def test_round_robin_rotates_both_roles(make_stack):
    stack, routes = await _run(make_stack, sc.ROUTING_ROUND_ROBIN)
    p, d = stack.cluster.prefill_urls, stack.cluster.decode_urls
    rot = sc.ROUTE_ROTATION
    assert routes == [(sc.ROUTING_ROUND_ROBIN, p[t % 2], rot, d[t % 3], rot) for t in range(TURNS)]
    hits = _hits(stack, sc.DIRECTION_P2D)
    assert hits[:3] == [0, 0, 0] and hits[3] > 0  # D's cache helps only when the rotation comes back (turn 3: d0)


async def test_least_loaded_avoids_the_busy_workers(make_stack):
    stack = await make_stack(n_prefill=2, n_decode=3, routing=sc.ROUTING_LEAST_LOADED)
    pool = stack.proxy.proxy.pool
    pool.prefill[0].gate.in_use = 5  # as if five requests were in flight there
    pool.decode[0].gate.in_use, pool.decode[2].gate.in_use = 3, 1
    await _conversation(stack, turns=2)
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
    p, d, least = stack.cluster.prefill_urls, stack.cluster.decode_urls, sc.ROUTE_LEAST_LOADED
    assert [_route(s) for s in servers] == [(sc.ROUTING_LEAST_LOADED, p[1], least, d[1], least)] * 2
    pool.prefill[0].gate.in_use = pool.decode[0].gate.in_use = pool.decode[2].gate.in_use = 0


async def test_session_affine_keeps_the_sessions_d(make_stack):
    stack, routes = await _run(make_stack, sc.ROUTING_SESSION_AFFINE)
    d0 = routes[0][3]
    assert [(r[0], r[3], r[4]) for r in routes] == [(sc.ROUTING_SESSION_AFFINE, d0, sc.ROUTE_LEAST_LOADED)] + [
        (sc.ROUTING_SESSION_AFFINE, d0, sc.ROUTE_HOLDER)
    ] * (TURNS - 1)
    assert all(r[2] == sc.ROUTE_LEAST_LOADED for r in routes)
    hits = _hits(stack, sc.DIRECTION_P2D)
    assert hits[0] == 0 and all(h > 0 for h in hits[1:])  # D's own cache holds the conversation so far


async def test_kv_aware_keeps_the_sessions_p_and_d(make_stack):
    stack, routes = await _run(make_stack, sc.ROUTING_KV_AWARE)
    p0, d0 = routes[0][1], routes[0][3]
    first = (sc.ROUTING_KV_AWARE, p0, sc.ROUTE_LEAST_LOADED, d0, sc.ROUTE_LEAST_LOADED)
    later = (sc.ROUTING_KV_AWARE, p0, sc.ROUTE_LAST_PREFILL, d0, sc.ROUTE_HOLDER)
    assert routes == [first] + [later] * (TURNS - 1)
    hits = _hits(stack, sc.DIRECTION_D2P)
    assert hits[0] == 0 and all(h > 0 for h in hits[1:])  # P's prefix cache holds the last prompt


async def test_two_sessions_spread_over_an_idle_fleet(make_stack):
    stack = await make_stack(n_prefill=2, n_decode=3, routing=sc.ROUTING_KV_AWARE)
    await _conversation(stack, conv="a", turns=1)
    await _conversation(stack, conv="b", turns=1)
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
    (pa, da), (pb, db) = [(_route(s)[1], _route(s)[3]) for s in servers]
    assert pa != pb and da != db


async def test_one_worker_per_role_names_no_policy(make_stack):
    stack = await make_stack(routing=sc.ROUTING_KV_AWARE)
    await _conversation(stack, turns=2)
    servers = await stack.wait_spans(sc.SPAN_PROXY_REQUEST, 2)
    assert [_route(s)[::2] for s in servers] == [(None, None, None)] * 2


def test_unknown_policy_is_a_one_line_error():
    from kvtrace.proxy.config import ProxyConfig, Worker

    with pytest.raises(ValueError, match=r"^unknown routing policy 'nearest'; choose from round-robin, "):
        ProxyConfig(prefill=[Worker("h", 1)], decode=[Worker("h", 2)], routing="nearest")
