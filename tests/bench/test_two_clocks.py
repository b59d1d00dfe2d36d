"""One model, two clocks: the same arm (simulated 1P+1D cluster, proxy, bench client in one
process, :mod:`kvtrace.bench.inproc`) run on the virtual-time loop and on asyncio's own loop in wall
time gives the same decisions and, per request, a TTFT within the wall run's event-loop lateness."""

from __future__ import annotations

import asyncio

import pytest

from kvtrace.sim import virtual

pytest.importorskip("aiohttp")
pytest.importorskip("openai")

# an 8k-token system prompt: turn 0's prefill is ~0.2 s of model time on qwen3-32b, so a clock that
# skipped the cost model's durations would show; answers of 120 tokens (> the 64-token threshold)
SCENARIO = {
    "filetype": "kvtrace_scenario",
    "name": "two-clocks",
    "sessions": 2,
    "system_tokens": 8000,
    "turns": [{"label": "ask", "repeat": 3, "user_tokens": 40, "steps": [{"llm": {"output_tokens": 120}}]}],
}
# lateness of a wall-clock run on a busy 2-core machine: a few ms per sleep, a handful of sleeps per
# TTFT (measured beside the test suite: wall 14-21 ms above virtual); wall is never faster than the
# model, its sleeps last at least their duration (1 ms for the timer's rounding)
SLACK_MS, SLACK_FRACTION, EARLY_MS = 40.0, 0.10, 1.0


async def _arm(run_dir: str, scenario: str):
    from kvtrace.bench import inproc

    cfg = dict(input=scenario, seed=5, nonce="two-clocks", clients=1)
    return await inproc.run_arm(run_dir, "qwen3-32b", False, True, "efa-3200", cfg, "A", 450.0)


def _rows(result) -> dict:
    return {(r.session, r.turn): (r.ttft_ms, r.outcome, r.pulled_tokens) for r in result.requests}


def test_virtual_and_wall_clocks_agree_per_request(tmp_path):
    import json

    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps(SCENARIO))
    v = _rows(virtual.run(_arm(str(tmp_path / "v"), str(scenario)), seed=5))
    w = _rows(asyncio.run(_arm(str(tmp_path / "w"), str(scenario))))
    assert v.keys() == w.keys() and len(v) == 6
    assert {k: o[1:] for k, o in v.items()} == {k: o[1:] for k, o in w.items()}  # outcome, pulled tokens
    assert min(t for (_, turn), (t, *_) in v.items() if turn == 0) > 150  # the 8k prefill took model time
    for key, (tv, *_) in v.items():
        tw = w[key][0]
        assert tv - EARLY_MS <= tw <= tv + SLACK_MS + SLACK_FRACTION * tv, (key, tv, tw)
