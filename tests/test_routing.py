"""kvtrace.routing: each policy's choice and reason, from loads and what the proxy knows of a session."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.routing import Choice, Router, RoutingError

P = ["http://p0", "http://p1", "http://p2"]
D = ["http://d0", "http://d1"]


def test_round_robin_ignores_load_and_sessions():
    r = Router(sc.ROUTING_ROUND_ROBIN, P, D)
    got = [r.prefill("s", [9, 0, 0]) for _ in range(4)]
    assert got == [Choice(i, sc.ROUTE_ROTATION) for i in (0, 1, 2, 0)]
    assert [r.decode("s", "http://d1", [0, 9]).index for _ in range(3)] == [0, 1, 0]


def test_least_loaded_picks_the_idlest_and_spreads_ties():
    r = Router(sc.ROUTING_LEAST_LOADED, P, D)
    assert r.prefill(None, [3, 1, 2]) == Choice(1, sc.ROUTE_LEAST_LOADED)
    # an idle pool: ties rotate instead of piling on worker 0
    assert [r.prefill(None, [0, 0, 0]).index for _ in range(3)] == [2, 0, 1]
    assert r.decode("s", "http://d0", [5, 4]) == Choice(1, sc.ROUTE_LEAST_LOADED)  # holder ignored


def test_session_affine_sends_d_to_the_holder_else_least_loaded():
    r = Router(sc.ROUTING_SESSION_AFFINE, P, D)
    assert r.decode("s", "http://d0", [7, 0]) == Choice(0, sc.ROUTE_HOLDER)
    assert r.decode("s", None, [7, 0]) == Choice(1, sc.ROUTE_LEAST_LOADED)
    assert r.decode("s", "http://gone", [0, 3]) == Choice(0, sc.ROUTE_LEAST_LOADED)  # not in the pool
    r.prefill("s", [0, 5, 5])
    assert r.prefill("s", [4, 0, 4]) == Choice(1, sc.ROUTE_LEAST_LOADED)  # P is not affine here


def test_kv_aware_keeps_the_sessions_p_within_the_slack():
    r = Router(sc.ROUTING_KV_AWARE, P, D)
    assert r.prefill("s", [1, 0, 1]) == Choice(1, sc.ROUTE_LEAST_LOADED)
    assert r.prefill("s", [0, 2, 1]) == Choice(1, sc.ROUTE_LAST_PREFILL)  # 2 more in flight: kept
    assert r.prefill("s", [0, 3, 1]) == Choice(0, sc.ROUTE_LEAST_LOADED)  # 3 more: the idlest wins
    assert r.prefill("s", [5, 5, 5]) == Choice(0, sc.ROUTE_LAST_PREFILL)  # and is now the session's P
    assert r.prefill("t", [5, 5, 5]).reason == sc.ROUTE_LEAST_LOADED  # another session has none
    assert r.decode("s", "http://d1", [0, 9]) == Choice(1, sc.ROUTE_HOLDER)


def test_session_memory_is_bounded_least_recent_first():
    r = Router(sc.ROUTING_KV_AWARE, P, D, max_sessions=2)
    r.prefill("a", [0, 9, 9])
    r.prefill("b", [9, 0, 9])
    r.prefill("a", [0, 9, 9])  # a is now the most recent
    r.prefill("c", [9, 9, 0])  # evicts b
    assert r.prefill("a", [1, 0, 0]).reason == sc.ROUTE_LAST_PREFILL
    assert r.prefill("b", [1, 0, 1]) == Choice(1, sc.ROUTE_LEAST_LOADED)


@pytest.mark.parametrize(
    ("policy", "prefill", "decode", "message"),
    [
        (
            "nearest",
            P,
            D,
            "unknown routing policy 'nearest'; choose from round-robin, least-loaded, session-affine, kv-aware",
        ),
        (sc.ROUTING_ROUND_ROBIN, [], D, "need at least one prefill and one decode worker"),
        (sc.ROUTING_ROUND_ROBIN, P, [], "need at least one prefill and one decode worker"),
    ],
)
def test_bad_configuration_is_one_line(policy, prefill, decode, message):
    with pytest.raises(RoutingError) as e:
        Router(policy, prefill, decode)
    assert str(e.value) == message


def test_avoided_workers_are_passed_over_by_every_policy():
    r = Router(sc.ROUTING_ROUND_ROBIN, P, D)
    assert [r.prefill("s", [0, 0, 0], avoid={1}).index for _ in range(4)] == [0, 2, 0, 2]
    assert r.decode("s", None, [0, 0], avoid={0}) == Choice(1, sc.ROUTE_ROTATION)
    r = Router(sc.ROUTING_LEAST_LOADED, P, D)
    assert r.prefill(None, [0, 5, 3], avoid={0}) == Choice(2, sc.ROUTE_LEAST_LOADED)  # the idlest is out


def test_the_sessions_own_worker_out_is_a_failover():
    r = Router(sc.ROUTING_KV_AWARE, P, D)
    assert r.prefill("s", [1, 0, 1]) == Choice(1, sc.ROUTE_LEAST_LOADED)
    assert r.prefill("s", [0, 0, 1], avoid={1}) == Choice(0, sc.ROUTE_FAILOVER)
    assert r.prefill("s", [0, 0, 1]) == Choice(0, sc.ROUTE_LAST_PREFILL)  # the failover's P is now the session's
    for policy in (sc.ROUTING_SESSION_AFFINE, sc.ROUTING_KV_AWARE):
        r = Router(policy, P, D)
        assert r.decode("s", "http://d0", [0, 4], avoid={0}) == Choice(1, sc.ROUTE_FAILOVER)
        assert r.decode("s", "http://d1", [0, 4], avoid={0}) == Choice(1, sc.ROUTE_HOLDER)
