"""The published workloads built in (``kvtrace bench --workload``): the bidirectional benchmark's
sweep and vLLM's multi-turn P/D PR benchmark, with the shape their scripts give vLLM's generator,
and the sweep's prefix override."""

from __future__ import annotations

import json
import statistics

import pytest

from kvtrace.bench import published, vllm_inputs
from kvtrace.bench.api import BenchConfig, BenchError
from kvtrace.cli import main

# words of a first turn besides its prefix: the 500-token common prefix (498 words + "."), the
# "N is a nice number..." tag (5), "N," (1) and vLLM's base prompt (9)
FIRST_TURN_EXTRA = 498 + 5 + 1 + 9


def _words(text: str) -> int:
    return vllm_inputs.count_tokens(text)


def test_published_sweep_is_ten_conversations_of_five_requests_with_the_swept_prefix():
    wl = BenchConfig(published="published-sweep", prefix=8000).build(0, "")
    assert wl.name == "published-sweep prefix=8000"
    assert [len(s.turns) for s in wl.sessions] == [5] * 10  # 10 turns = 5 user + 5 assistant messages
    for s in wl.sessions:
        assert _words(s.turns[0].user_text) == 8000 + FIRST_TURN_EXTRA
        assert [_words(t.user_text) for t in s.turns[1:]] == [150] * 4
        assert [t.actions[0].max_tokens for t in s.turns] == [300] * 5
    # the common prefix is the same text in every conversation; the per-conversation prefixes differ
    heads = {s.turns[0].user_text.split()[497] for s in wl.sessions}
    assert len(heads) == 1
    assert len({s.turns[0].user_text for s in wl.sessions}) == 10
    default = BenchConfig(published="published-sweep").build(0, "")
    assert _words(default.sessions[0].turns[0].user_text) == 24000 + FIRST_TURN_EXTRA
    spec = published.get("published-sweep")
    assert (spec.clients, spec.max_active_conversations) == (2, 10)


def test_vllm_pr_workload_has_its_counts_and_ranges():
    wl = BenchConfig(published="vllm-pr-multiturn").build(0, "")
    assert len(wl.sessions) == 24
    assert all(6 <= len(s.turns) <= 9 for s in wl.sessions)  # 12-18 messages
    prefixes = [_words(s.turns[0].user_text) - FIRST_TURN_EXTRA for s in wl.sessions]
    assert max(prefixes) <= 10_000 and min(prefixes) > 0
    assert statistics.mean(prefixes) == pytest.approx(4000, rel=0.05)  # lognormal, batch mean 4,000, clipped
    later = [t for s in wl.sessions for t in s.turns[1:]]
    assert all(120 <= _words(t.user_text) <= 160 for t in later)
    assert all(800 <= t.actions[0].max_tokens <= 1200 for s in wl.sessions for t in s.turns)


def test_the_prefix_override_also_applies_to_a_generate_conversations_input(tmp_path):
    conf = published.get("published-sweep").config
    path = tmp_path / "gen.json"
    path.write_text(json.dumps(conf))
    wl = BenchConfig(input=str(path), prefix=1000, sessions=2).build(0, "")
    assert [_words(s.turns[0].user_text) for s in wl.sessions] == [1000 + FIRST_TURN_EXTRA] * 2
    scenario = tmp_path / "conv.json"
    scenario.write_text(json.dumps([{"id": "a", "messages": [{"role": "user", "content": "hi"}]}]))
    with pytest.raises(BenchError, match="a prefix length goes only with a 'generate_conversations' config"):
        BenchConfig(input=str(scenario), prefix=1000).build(0, "")
    with pytest.raises(BenchError, match="prefix"):
        BenchConfig(scenario="coding-agent", prefix=1000).validate()
    with pytest.raises(BenchError, match="unknown workload 'nope'"):
        BenchConfig(published="nope").validate()


@pytest.mark.parametrize(
    "spec, points, message",
    [
        ("prefix=2000,4000", ("prefix", (2000, 4000)), None),
        ("prefix=24000", ("prefix", (24000,)), None),
        ("turns=3", None, "expected prefix=N,N,..."),
        ("prefix=2k", None, "prefix values must be integers"),
        ("prefix=", None, "give distinct non-negative prefix lengths"),
        ("prefix=10,10", None, "give distinct non-negative prefix lengths"),
    ],
)
def test_sweep_specs(spec, points, message):
    if message is None:
        assert published.parse_sweep(spec) == points
    else:
        with pytest.raises(ValueError, match=message):
            published.parse_sweep(spec)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--workload", "published-sweep", "--sweep", "prefix=10", "--url", "http://x:9"],
            "--sweep goes only with --arms",
        ),
        (["--scenario", "coding-agent", "--arms", "--sweep", "prefix=10", "--traces", "{d}"], "needs --workload"),
        (["--workload", "published-sweep", "--arms", "--sweep", "prefix=x", "--traces", "{d}"], "must be integers"),
        (["--workload", "no-such"], "unknown workload 'no-such'; choose from published-sweep, vllm-pr-multiturn"),
    ],
)
def test_workload_and_sweep_errors_are_one_line(tmp_path, capsys, argv, message):
    argv = [a.replace("{d}", str(tmp_path / "runs")) for a in argv]
    assert main(["bench", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvtrace bench: error: ") and message in err, err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
