"""kvtrace.kvrules: one rule code for one request (the simulator) and for arrays (the what-if replay).

The simulator's decisions are checked against vLLM's own scheduler in tests/sim/test_decisions_match_vllm.py; here the
array form must give, element by element, what the scalar form gives, and the proxy's conversation
table must offer exactly when :func:`kvrules.entry_offered` says so.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from kvtrace import kvrules
from kvtrace import semconv as sc
from kvtrace.proxy.table import ConversationTable
from kvtrace.sim import scheduler

PROMPTS = (64, 200)
HITS = (0, 48, 192)
REMOTES = (0, 40, 100, 250)
THRESHOLDS = (0, 64, 256)


def _params(remote: int) -> dict:
    return {
        "do_remote_decode": True,
        "remote_block_ids": [[1]],
        "remote_engine_id": "d",
        "remote_request_id": "r",
        "remote_host": "h",
        "remote_port": 1,
        "remote_num_tokens": remote,
    }


def test_array_outcomes_equal_the_simulators_scalar_outcomes():
    grid = list(itertools.product((False, True), PROMPTS, HITS, REMOTES, THRESHOLDS))
    offered, prompt, hit, remote, threshold = (np.array(c) for c in zip(*grid, strict=True))
    count = kvrules.pull_count(remote, prompt, hit)
    codes = kvrules.d2p_outcome(offered, count, hit, threshold)
    want = [scheduler.outcome(_params(r) if o else None, p, h, t) for o, p, h, r, t in grid]
    assert [sc.OUTCOMES[c] for c in codes] == want
    loads = kvrules.loads(count, threshold)
    assert list(loads & offered) == [
        scheduler.matched_tokens(_params(r) if o else None, p, h, t)[1] for o, p, h, r, t in grid
    ]
    # every outcome the rule can give before a load starts occurs in the grid
    assert set(want) == {sc.OUTCOME_PULLED, sc.OUTCOME_BELOW_THRESHOLD, sc.OUTCOME_LOCAL_HIT, sc.OUTCOME_NO_REMOTE}


def test_read_declined_within_vllms_five_second_margin():
    remaining = np.array([100.0, 5.01, 5.0, 4.9, 0.0, -3.0, math.nan])
    assert list(kvrules.read_declined(remaining)) == [False, False, True, True, True, True, False]
    assert [scheduler.read_expired(1000.0, 1000.0 + r) for r in remaining[:-1]] == [
        False,
        False,
        True,
        True,
        True,
        True,
    ]
    assert scheduler.read_expired(1000.0, None) is False


def test_the_proxy_offers_exactly_when_the_rule_says():
    ttl = 10.0
    ages = [0.0, 9.999, 10.0, 10.001, 30.0]
    got = []
    for age in ages:
        now = [100.0]
        table = ConversationTable(ttl, clock=lambda now=now: now[0])
        table.store("c", 0, {"do_remote_decode": True}, "http://d")
        now[0] += age
        got.append(table.begin("c").offered)
    assert got == list(kvrules.entry_offered(np.array(ages), ttl)) == [True, True, True, False, False]
