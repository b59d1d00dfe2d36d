"""Workload inputs: vLLM-compatible distributions, scenarios as data, vLLM multi-turn files."""

from __future__ import annotations

import json
import random
from statistics import mean

import pytest

from kvtrace.bench import scenarios, vllm_inputs
from kvtrace.bench.distributions import (
    Constant,
    DistributionError,
    Lognormal,
    Poisson,
    Uniform,
    Zipf,
    from_dict,
)
from kvtrace.bench.workload import LLMAction, ToolAction, WorkAction, from_scenario


def rng(seed=1):
    return random.Random(seed)


# -- distributions ----------------------------------------------------------------------------
def test_distribution_parsing_matches_vllm_fields():
    assert from_dict({"distribution": "constant", "value": 500}) == Constant(500)
    assert from_dict({"distribution": "uniform", "min": 12, "max": 18}) == Uniform(12, 18)
    assert from_dict({"distribution": "zipf", "alpha": 1.2, "max": 100}) == Zipf(1.2, 100)
    assert from_dict({"distribution": "poisson", "alpha": 10, "max": 50}) == Poisson(10, 50)
    assert from_dict({"distribution": "lognormal", "average": 1000, "max": 5000}) == Lognormal(average=1000, max=5000)
    assert from_dict({"distribution": "lognormal", "mean": 3.0, "sigma": 0.5}) == Lognormal(mean=3.0, sigma=0.5)
    assert from_dict(7) == Constant(7)
    for d in (
        Constant(5),
        Uniform(1, 3),
        Zipf(1.5, 10),
        Poisson(4, 9),
        Lognormal(average=100, median_ratio=0.5, max=300),
    ):
        assert from_dict(d.to_dict()) == d


@pytest.mark.parametrize(
    "conf, message",
    [
        ({"distribution": "gauss"}, "unknown distribution 'gauss'"),
        ({"distribution": "uniform", "min": 1}, "missing field 'max'"),
        ({"distribution": "uniform", "min": 5, "max": 1}, "min <= max"),
        ({"distribution": "zipf", "alpha": 1.0}, "alpha must be > 1"),
        ({"distribution": "lognormal", "average": 10, "mean": 1, "sigma": 1}, "not both"),
        ({"distribution": "lognormal", "mean": 1}, "missing field 'sigma'"),
        ({"distribution": "constant", "value": "x"}, "'value' must be a number"),
        ("text", "expected an object"),
    ],
)
def test_distribution_errors(conf, message):
    with pytest.raises(DistributionError, match=message):
        from_dict(conf, "here")


def test_uniform_integer_bounds_inclusive_and_float():
    values = Uniform(1, 3).sample(rng(), 300)
    assert set(values) == {1, 2, 3}
    floats = Uniform(0.5, 1.5).sample(rng(), 300)
    assert all(0.5 <= v <= 1.5 for v in floats) and any(v != int(v) for v in floats)


def test_sampling_is_seeded():
    for d in (Uniform(1, 1000), Zipf(1.3, 500), Poisson(40), Lognormal(mean=4.0, sigma=1.0)):
        assert d.sample(rng(5), 50) == d.sample(rng(5), 50)
        assert d.sample(rng(5), 50) != d.sample(rng(6), 50)


def test_zipf_poisson_ranges_and_means():
    z = Zipf(1.5, 40).sample(rng(), 2000)
    assert min(z) == 1 and max(z) == 40  # capped at max
    assert z.count(1) > z.count(2) > z.count(3)  # skewed towards small integers
    for lam in (4, 60):  # Knuth and PTRS branches
        p = Poisson(lam).sample(rng(), 4000)
        assert abs(mean(p) - lam) < 0.05 * lam
    assert max(Poisson(60, 55).sample(rng(), 500)) == 55


def test_lognormal_average_rescales_each_batch_like_vllm():
    values = Lognormal(average=1000).sample(rng(), 400)
    assert abs(mean(values) - 1000) <= 0.5  # exact up to rounding
    assert len(set(values)) > 100  # spread, not constant
    capped = Lognormal(average=1000, max=1500).sample(rng(), 400)
    assert max(capped) == 1500
    assert Lognormal(average=1000).sample(rng(), 1) == [1000]  # a batch of one is the average


# -- scenarios ----------------------------------------------------------------------------------
def test_builtin_scenarios_round_trip_through_json():
    for scenario in scenarios.SCENARIOS.values():
        again = scenarios.from_dict(json.loads(json.dumps(scenario.to_dict())))
        assert again.turns == scenario.turns
        assert (again.name, again.sessions, again.system_tokens) == (
            scenario.name,
            scenario.sessions,
            scenario.system_tokens,
        )


def test_scenario_file_errors():
    with pytest.raises(DistributionError, match="filetype"):
        scenarios.from_dict({"turns": []})
    with pytest.raises(DistributionError, match=r"turns\[0\].steps\[0\]: unknown step 'sleep'"):
        scenarios.from_dict({"filetype": "kvtrace_scenario", "turns": [{"steps": [{"sleep": {}}]}]})
    with pytest.raises(DistributionError, match="unknown scenario 'nope'"):
        scenarios.get("nope")


def test_from_scenario_is_seeded_and_follows_the_spec():
    a = from_scenario(scenarios.CODING_AGENT, sessions=3, seed=4, nonce="x")
    b = from_scenario(scenarios.CODING_AGENT, sessions=3, seed=4, nonce="x")
    c = from_scenario(scenarios.CODING_AGENT, sessions=3, seed=5, nonce="x")
    assert a == b and a != c
    renonced = from_scenario(scenarios.CODING_AGENT, sessions=3, seed=4, nonce="y")
    # another nonce changes the tag word of each user message, nothing else
    for s1, s2 in zip(a.sessions, renonced.sessions, strict=True):
        for t1, t2 in zip(s1.turns, s2.turns, strict=True):
            assert t1.user_text.split()[1:] == t2.user_text.split()[1:]
            assert t1.user_text.split()[0] != t2.user_text.split()[0] and t1.actions == t2.actions
    assert len({s.system_text for s in a.sessions}) == 1  # shared system prompt
    assert len({s.turns[0].user_text for s in a.sessions}) == 3  # sessions share nothing else
    for s in a.sessions:
        assert [t.label for t in s.turns] == ["fix"] * 4
        assert s.turns[0].pause_s == 0 and all(1.0 <= t.pause_s <= 5.0 for t in s.turns[1:])
        for t in s.turns:
            assert [type(x) for x in t.actions] == [WorkAction, LLMAction, ToolAction, LLMAction]
            assert 96 <= t.actions[1].max_tokens <= 192 and 80 <= t.actions[3].max_tokens <= 160
            assert 80 <= len(t.user_text.split()) <= 200
            tool = t.actions[2].calls[0]
            assert tool.name == "run_tests" and 1.0 <= tool.wait_s <= 4.0 and 120 <= len(tool.output.split()) <= 300
    assert a.n_llm_calls == 3 * 4 * 2


def test_parallel_tools_and_interrupt_are_planned():
    wl = from_scenario(scenarios.PARALLEL_TOOLS, sessions=1, seed=0)
    tools = [a for a in wl.sessions[0].turns[0].actions if isinstance(a, ToolAction)]
    assert [c.name for c in tools[0].calls] == ["search_code", "read_file", "run_linter"]
    wl = from_scenario(scenarios.INTERRUPTED, sessions=1, seed=0)
    cuts = [a.interrupt_after for t in wl.sessions[0].turns for a in t.actions]
    assert cuts[0] is None and 4 <= cuts[1] <= 12 and cuts[2] is None


# -- vLLM multi-turn inputs ---------------------------------------------------------------------
def write(tmp_path, obj, name="in.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return p


def test_conversations_file(tmp_path):
    convs = [
        {
            "id": "c1",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": "one two three four"},
                {"role": "user", "content": "more"},
                {"role": "assistant", "content": "five six"},
            ],
        },
        {"id": "c2", "messages": [{"role": "user", "content": "q"}]},
    ]
    wl = vllm_inputs.load(write(tmp_path, convs), seed=1)
    assert wl.source == "conversations" and wl.name == "in.json"
    c1, c2 = wl.sessions
    assert (c1.name, c1.system_text) == ("c1", "be brief")
    assert [(t.user_text, t.actions) for t in c1.turns] == [("hello there", [LLMAction(4)]), ("more", [LLMAction(2)])]
    assert [(t.user_text, t.actions) for t in c2.turns] == [("q", [LLMAction(256)])]  # no answer: the default
    wl = vllm_inputs.load(write(tmp_path, convs), max_tokens=9, nonce="n1", sessions=1)
    assert len(wl.sessions) == 1
    assert [t.actions for t in wl.sessions[0].turns] == [[LLMAction(9)], [LLMAction(9)]]
    assert wl.sessions[0].turns[0].user_text == "n1 hello there"


@pytest.mark.parametrize(
    "obj, message",
    [
        ([{"id": "a", "messages": [{"role": "user", "content": "x"}]}] * 2, "appears more than once"),
        ([{"id": "a", "messages": []}], "non-empty list"),
        ([{"id": "a", "messages": [{"role": "assistant", "content": "x"}]}], "has no user message"),
        ([], "no conversations"),
        ({"filetype": "other"}, "expected a list of conversations"),
        ({"filetype": "generate_conversations", "num_conversations": 1}, "missing field 'text_files'"),
    ],
)
def test_input_errors(tmp_path, obj, message):
    with pytest.raises(vllm_inputs.InputError, match=message):
        vllm_inputs.load(write(tmp_path, obj))


def test_unreadable_input(tmp_path):
    with pytest.raises(vllm_inputs.InputError, match="cannot read"):
        vllm_inputs.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(vllm_inputs.InputError, match="not valid JSON"):
        vllm_inputs.load(bad)


GEN = {
    "filetype": "generate_conversations",
    "num_conversations": 6,
    "text_files": ["corpus.txt"],
    "prompt_input": {
        "num_turns": {"distribution": "uniform", "min": 3, "max": 6},
        "common_prefix_num_tokens": {"distribution": "constant", "value": 50},
        "prefix_num_tokens": {"distribution": "lognormal", "average": 100, "max": 300},
        "num_tokens": {"distribution": "uniform", "min": 30, "max": 40},
    },
    "prompt_output": {"num_tokens": {"distribution": "uniform", "min": 10, "max": 20}},
}


def test_generate_conversations_like_vllm(tmp_path):
    (tmp_path / "corpus.txt").write_text(" ".join(f"w{i}" for i in range(20000)))
    wl = vllm_inputs.load(write(tmp_path, GEN, "gen.json"), seed=3)
    assert wl.source == "generate_conversations" and len(wl.sessions) == 6
    assert [s.name for s in wl.sessions] == [f"CONV_ID_{i}" for i in range(6)]
    common = " ".join(f"w{i}" for i in range(48)) + ". "
    prefix_words = []
    for i, s in enumerate(wl.sessions):
        assert 2 <= len(s.turns) <= 3  # 3..6 messages, rounded up to even, halved
        first = s.turns[0].user_text
        assert first.startswith(common + f"{i} is a nice number... {i}, ")
        prefix_words.append(len(first.split()))
        for t in s.turns[1:]:
            assert t.user_text.startswith(f"{i} is a nice number... {vllm_inputs.BASE_PROMPT}")
            assert 30 <= len(t.user_text.split()) <= 40  # exactly the sampled user token count
        assert all(10 <= t.actions[0].max_tokens <= 20 for t in s.turns)
        assert all(w.startswith("w") for w in first.split()[len(common.split()) + 7 :][:5])  # text from the file
    # per-conversation prefix (lognormal, batch mean 100) on the first turn only
    prefixes = [n - len(common.split()) - 1 - 30 for n in prefix_words]
    assert all(p > 0 for p in prefixes)
    again = vllm_inputs.load(write(tmp_path, GEN, "gen.json"), seed=3)
    assert again.sessions == wl.sessions


def test_generate_without_text_files_uses_a_synthetic_corpus(tmp_path):
    wl = vllm_inputs.load(write(tmp_path, {**GEN, "text_files": ["absent.txt"]}), seed=1)
    assert len(wl.sessions) == 6 and all(len(t.user_text.split()) >= 30 for s in wl.sessions for t in s.turns)


def test_generate_short_text_file_is_an_error(tmp_path):
    (tmp_path / "corpus.txt").write_text("only a few words")
    with pytest.raises(vllm_inputs.InputError, match="text_files hold 4 words"):
        vllm_inputs.load(write(tmp_path, GEN), seed=1)


def test_scenario_file_input(tmp_path):
    conf = scenarios.SHORT_FOLLOWUPS.with_(sessions=2).to_dict()
    wl = vllm_inputs.load(write(tmp_path, conf), seed=2)
    assert wl.name == "short-followups" and len(wl.sessions) == 2 and len(wl.sessions[0].turns) == 6
