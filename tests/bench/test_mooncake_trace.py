"""Mooncake's FAST'25 traces as bench input: sessions rebuilt from shared block-hash prefixes,
replayed with the trace's timing (against the zero-cost simulator behind the proxy on an injected
clock, so every gap is exact), clear errors for bad rows, and the shipped subset's numbers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random

import numpy as np
import pytest

from kvtrace import semconv as sc
from kvtrace.bench import api as bench
from kvtrace.bench import mooncake, vllm_inputs
from kvtrace.bench.workload import _VOCAB
from kvtrace.proxy import server
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.sim.cluster import SimCluster

pytestmark = pytest.mark.timeout(120)

# line: (timestamp ms, input, output, hash_ids)
TRACE = [
    (0, 1300, 100, [0, 1, 2]),  # 1: session A, turn 0 (full blocks [0, 1])
    (2000, 1100, 50, [0, 9, 10]),  # 2: shares only the one-block system prompt: a session of its own
    (100_000, 1600, 100, [0, 1, 5, 8]),  # 3: extends line 1: A, turn 1, 100 s later
    (700_000, 1800, 60, [0, 1, 5, 6]),  # 4: extends line 3: A, turn 2, 600 s later (past D's 480 s TTL)
    (150_000, 1300, 40, [0, 1, 7]),  # 5: extends line 1 too, but A moved on: a branch, a new session
    (3000, 400, 10, [0]),  # 6: no full block: nothing can continue it
    (4000, 900, 10, [0, 11]),  # 7: a new session
]


def write(path, rows) -> str:
    with open(path, "w") as f:
        for ts, n_in, n_out, ids in rows:
            f.write(json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}) + "\n")
    return str(path)


def test_sessions_are_rebuilt_from_whole_previous_prompts(tmp_path):
    rows = mooncake.read_rows(write(tmp_path / "t.jsonl", TRACE))
    assert [[r.line for r in g] for g in mooncake.sessions(rows)] == [[1, 3, 4], [2], [6], [7], [5]]


def test_the_longest_match_wins_then_the_most_recent():
    def row(line, ts, n_in, ids):
        return mooncake.Row(line, ts, n_in, 10, tuple(ids))

    rows = [
        row(1, 0, 1100, [0, 1, 2]),  # key [0, 1]
        row(2, 1, 1600, [0, 1, 3, 4]),  # extends 1 -> key [0, 1, 3]
        row(3, 2, 1100, [0, 1, 9]),  # a new session (1's key is taken): key [0, 1]
        row(4, 3, 2100, [0, 1, 3, 9, 10]),  # matches [0, 1] and [0, 1, 3]: the longer one
        row(5, 4, 1600, [0, 1, 12, 13]),  # matches [0, 1] (line 3's): line 3's session
    ]
    assert [[r.line for r in g] for g in mooncake.sessions(rows)] == [[1, 2, 4], [3, 5]]


def test_the_workload_replays_the_trace_timing_and_lengths(tmp_path):
    wl = vllm_inputs.load(write(tmp_path / "t.jsonl", TRACE))
    assert (wl.source, wl.timed, [s.name for s in wl.sessions]) == (
        mooncake.SOURCE,
        True,
        ["mc0-l1", "mc1-l2", "mc2-l6", "mc3-l7", "mc4-l5"],
    )
    a = wl.sessions[0]
    assert [(t.pause_s, t.actions[0].max_tokens) for t in a.turns] == [(0.0, 100), (100.0, 100), (600.0, 60)]
    # a first turn is its blocks' words cut to input_length; a later one adds what the context grew by
    assert [len(t.user_text.split()) for t in a.turns] == [1300, 1600 - 1300 - 100, 1800 - 1600 - 100]
    branch = wl.sessions[4]
    assert branch.turns[0].pause_s == 150.0
    # the same block ids give the same words in every session: the branch repeats A's first 1024
    assert branch.turns[0].user_text.split()[:1024] == a.turns[0].user_text.split()[:1024]
    assert branch.turns[0].user_text.split()[1024:] != a.turns[0].user_text.split()[1024:1300]
    assert wl.sessions[1].turns[0].user_text.split()[:512] == a.turns[0].user_text.split()[:512]


def _seeded_words(seed: str, n: int) -> list[str]:
    return random.Random(seed).choices(_VOCAB, k=n)


def test_the_text_is_the_seeded_words_of_the_blocks_and_of_the_growth(tmp_path):
    # the module doc's rule, drawn here without the workload's caches; each text is read twice
    # (the second time from the caches, as a tiled copy reads it)
    wl = vllm_inputs.load(write(tmp_path / "t.jsonl", TRACE))
    first = _seeded_words("mooncake-block:0", 512) + _seeded_words("mooncake-block:1", 512)
    first += _seeded_words("mooncake-block:2", 512)[: 1300 - 1024]
    grown = _seeded_words("mooncake-turn:3", 1600 - 1300 - 100)
    for _ in range(2):
        turns = vllm_inputs.load(write(tmp_path / "t.jsonl", TRACE)).sessions[0].turns
        assert [t.user_text for t in turns[:2]] == [" ".join(first), " ".join(grown)]
    assert wl.sessions[0].turns[0].user_text == " ".join(first)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}', "line 2: 1 hash_ids for 600"),
        ('{"timestamp": -1, "input_length": 6, "output_length": 1, "hash_ids": [1]}', "line 2: timestamp, input"),
        ('{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": ["a"]}', "line 2: hash_ids must be"),
        ("{not json", "line 2: not JSON"),
        ('{"timestamp": 0}', "line 2: expected an object with timestamp"),
        ("[1, 2]", r"line 2: expected an object with .* \(missing timestamp, input_length, output_length, hash_ids\)"),
    ],
)
def test_a_bad_row_is_named_by_its_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 6, "output_length": 1, "hash_ids": [1]}\n' + line + "\n")
    with pytest.raises(vllm_inputs.InputError, match="^bad.jsonl: " + message):
        vllm_inputs.load(path)


def test_a_first_row_short_of_fields_is_named_not_read_as_one_json_document(tmp_path):
    path = tmp_path / "short.jsonl"
    path.write_text('{"timestamp": 5, "input_length": 10}\n{"timestamp": 6, "input_length": 10}\n')
    message = "short.jsonl: line 1: expected an object with timestamp, input_length, output_length, hash_ids "
    with pytest.raises(vllm_inputs.InputError) as err:
        vllm_inputs.load(path)
    assert str(err.value) == message + "(missing output_length, hash_ids)"


def test_the_shipped_subset_has_the_documented_numbers():
    wl = vllm_inputs.load("mooncake-conversation")
    groups = mooncake.sessions(mooncake.read_rows(mooncake.SHIPPED["mooncake-conversation"]))
    gaps = np.array(mooncake.gaps_s(groups))
    assert (len(wl.sessions), sum(len(s.turns) for s in wl.sessions), len(gaps)) == (405, 602, 197)
    assert np.percentile(gaps, [50, 90, 99]).round(1).tolist() == [117.0, 439.8, 1289.6]
    assert round(float((gaps > 480).mean()), 3) == 0.081
    assert len(vllm_inputs.load("mooncake-conversation", sessions=10).sessions) == 10


def test_a_prefix_length_with_a_mooncake_trace_is_refused_not_dropped():
    with pytest.raises(vllm_inputs.InputError, match="a prefix length goes only with a 'generate_conversations'"):
        vllm_inputs.load("mooncake-conversation", prefix=1000)


class FakeTime:
    """Simulated seconds; ``sleep`` advances them (and records the pause) and yields to the loop."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def stack(provider, clock: FakeTime):
    async with SimCluster(cost=False, tracer_provider=provider, clock=clock) as c:
        cfg = ProxyConfig(
            prefill=[Worker("127.0.0.1", c.prefill[0].port)], decode=[Worker("127.0.0.1", c.decode[0].port)]
        )
        running = await server.start(cfg, tracer_provider=provider, clock=clock)
        try:
            yield running.url
        finally:
            await running.close()


async def test_replayed_gaps_decide_reuse_as_in_the_trace(tmp_path, tracer_provider, span_exporter):
    """Every session starts at its first timestamp and pauses the trace's gaps: A's turn 1 comes
    100 s after turn 0 and pulls D's blocks; its turn 2 comes 600 s later, past the proxy's 450 s
    conversation TTL, and is recomputed."""
    clock = FakeTime()
    path = write(tmp_path / "t.jsonl", TRACE)
    async with stack(tracer_provider, clock) as url:
        result = await bench.arun_bench(url, input=path, tracer_provider=tracer_provider, sleep=clock.sleep, nonce="n")
    assert [s.error for s in result.sessions] == [None] * 5 and len(result.requests) == 7
    assert sorted(clock.pauses) == [2.0, 3.0, 4.0, 100.0, 150.0, 600.0]  # all five sessions began at once
    spans = span_exporter.get_finished_spans()
    a = sorted(
        (s for s in spans if s.name == sc.SPAN_PROXY_REQUEST and s.attributes[sc.SESSION_ID].endswith("-mc0-l1")),
        key=lambda s: s.attributes[sc.TURN_INDEX],
    )
    assert [(s.attributes[sc.PROXY_OFFER_REASON], s.attributes[sc.KV_OUTCOME]) for s in a] == [
        (sc.OFFER_NO_ENTRY, sc.OUTCOME_NO_REMOTE),
        (sc.OFFER_OFFERED, sc.OUTCOME_PULLED),
        (sc.OFFER_ENTRY_TOO_OLD, sc.OUTCOME_NO_REMOTE),
    ]


def test_tiled_copies_start_a_period_apart_and_share_no_prefix(tmp_path):
    rows = mooncake.read_rows(write(tmp_path / "t.jsonl", TRACE))
    one = mooncake.workload(rows, name="t", nonce="n")
    wl = mooncake.workload(rows, name="t", nonce="n", copies=3, period_s=1000.0)
    assert len(wl.sessions) == 3 * len(one.sessions) == 15
    starts = [s.turns[0].pause_s for s in wl.sessions]
    assert starts == sorted(starts) and starts[-1] == 2000.0 + one.sessions[-1].turns[0].pause_s  # in arrival order
    by_name = {s.name: s for s in wl.sessions}
    for s in one.sessions:  # copy 0 is the trace itself; copy k the same sessions, k periods later
        for k, suffix in enumerate(("", "-c1", "-c2")):
            copy = by_name[f"mc{_index(wl, s.name, suffix)}-l{s.name.split('-l')[1]}{suffix}"]
            assert copy.turns[0].pause_s == s.turns[0].pause_s + 1000.0 * k
            assert [(t.pause_s, t.actions) for t in copy.turns[1:]] == [(t.pause_s, t.actions) for t in s.turns[1:]]
            first = copy.turns[0].user_text.split()
            assert first[0] == ("n" if k == 0 else f"nc{k}") and first[1:] == s.turns[0].user_text.split()[1:]
            assert [t.user_text for t in copy.turns[1:]] == [t.user_text for t in s.turns[1:]]
    assert [s.index for s in wl.sessions] == list(range(15))


def _index(wl, name: str, suffix: str) -> int:
    line = name.split("-l")[1]
    return next(s.index for s in wl.sessions if s.name.endswith(f"-l{line}{suffix}"))


def test_a_turns_text_is_made_when_it_is_read(tmp_path):
    wl = vllm_inputs.load(write(tmp_path / "t.jsonl", TRACE), nonce="n")
    turn = wl.sessions[0].turns[0]
    assert turn.__dict__.get("user_text") is None  # nothing held until the bench sends it
    assert turn.user_text == turn.user_text and len(turn.user_text.split()) == 1301
