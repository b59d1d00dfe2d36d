"""Workloads from ``kvtrace bench --input FILE``: vLLM's multi-turn benchmark formats and
kvtrace scenario files.

- A JSON **list** of conversations ``[{"id": ..., "messages": [{"role", "content"}, ...]}]`` (the
  ShareGPT-derived format of vLLM's ``benchmarks/multi_turn``): every user message is a turn; the
  assistant message after it sets ``max_tokens`` (its word count, or ``max_tokens`` if given), and,
  as in vLLM's benchmark, the endpoint's *actual* answer becomes the history for the next turn.
- A ``{"filetype": "generate_conversations", ...}`` config: synthetic conversations generated
  as vLLM's ``bench_dataset.generate_conversations`` does (num_turns rounded up to even, common
  prefix, per-conversation prefix on the first turn, per-turn user/assistant token counts from
  the distributions), counting words as tokens.  ``text_files`` are read relative to the config
  when present; otherwise a seeded synthetic corpus stands in.
- A ``{"filetype": "kvtrace_scenario", ...}`` file (:func:`kvtrace.bench.scenarios.from_dict`).
- A Mooncake FAST'25 trace (JSONL rows with ``timestamp``, ``input_length``, ``output_length``,
  ``hash_ids``): sessions rebuilt from shared block-hash prefixes and replayed with the trace's
  arrival times (:mod:`kvtrace.bench.mooncake`).  ``mooncake-conversation`` names the subset of
  its conversation trace shipped with kvtrace.

Errors are :class:`InputError` (one line; the CLI turns it into ``CLIError``).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from kvtrace.bench import mooncake, scenarios
from kvtrace.bench.distributions import Constant, DistributionError
from kvtrace.bench.distributions import from_dict as dist_from_dict
from kvtrace.bench.workload import LLMAction, SessionPlan, TurnPlan, Workload, from_scenario, words

GENERATE = "generate_conversations"
BASE_PROMPT = "Please rewrite the following text and add more content: "
_WORD = re.compile(r"\S+")


class InputError(ValueError):
    """An input file that cannot be used."""


def count_tokens(text: str) -> int:
    """Word count, kvtrace's stand-in for a tokenizer (exact for the simulator)."""
    return len(_WORD.findall(text or ""))


def load(
    path: str | Path,
    *,
    seed: int = 0,
    nonce: str = "",
    sessions: int | None = None,
    max_tokens: int | None = None,
    default_max_tokens: int = 256,
    prefix: int | None = None,
) -> Workload:
    """The workload described by ``path`` (see the module docstring); ``prefix``: every first
    turn's prefix tokens (generate_conversations configs only, as vLLM's sweep script sets it)."""
    path = mooncake.shipped(path)
    if mooncake.looks_like(path):
        if prefix is not None:
            raise InputError(f"{path.name}: a prefix length goes only with a '{GENERATE}' config")
        try:
            wl = mooncake.load(path, seed=seed, nonce=nonce, max_tokens=max_tokens)
        except mooncake.TraceError as exc:
            raise InputError(f"{path.name}: {exc}") from None
        wl.sessions = wl.sessions[:sessions] if sessions is not None else wl.sessions
        return wl
    try:
        conf = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from None
    try:
        if prefix is not None and not (isinstance(conf, dict) and conf.get("filetype") == GENERATE):
            raise InputError(f"{path}: a prefix length goes only with a '{GENERATE}' config")
        if isinstance(conf, list):
            wl = conversations(
                conf, max_tokens=max_tokens, default_max_tokens=default_max_tokens, seed=seed, nonce=nonce
            )
        elif isinstance(conf, dict) and conf.get("filetype") == GENERATE:
            if prefix is not None:
                conf = _with_prefix(conf, prefix)
            wl = generate(conf, seed=seed, nonce=nonce, base_dir=path.parent, max_tokens=max_tokens)
        elif isinstance(conf, dict) and conf.get("filetype") == scenarios.FILETYPE:
            wl = from_scenario(scenarios.from_dict(conf), sessions, seed, nonce)
        else:
            raise InputError(
                f"{path}: expected a list of conversations or an object with filetype "
                f"'{GENERATE}' or '{scenarios.FILETYPE}'"
            )
    except DistributionError as exc:
        raise InputError(f"{path}: {exc}") from None
    wl.name = path.name if wl.source != "scenario" else wl.name
    if sessions is not None and wl.source != "scenario":
        wl.sessions = wl.sessions[:sessions]
    return wl


def _with_prefix(conf: dict, prefix: int) -> dict:
    from kvtrace.bench.published import with_prefix

    if not isinstance(conf.get("prompt_input"), dict):
        raise InputError("prompt_input must be an object")
    return with_prefix(conf, prefix)


def conversations(
    items: list, *, max_tokens: int | None = None, default_max_tokens: int = 256, seed: int = 0, nonce: str = ""
) -> Workload:
    """Plans from a ShareGPT-like conversation list (ids must be unique).  A non-empty ``nonce``
    is put before the first user message of each conversation (one word) so that a repeat does not
    hit P's prefix cache filled by an earlier run of the same file."""
    seen: set[str] = set()
    plans: list[SessionPlan] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("messages"), list) or not item["messages"]:
            raise InputError(f'conversation [{i}]: expected {{"id": ..., "messages": [non-empty list]}}')
        conv_id = str(item.get("id", i))
        if conv_id in seen:
            raise InputError(f"conversation id {conv_id!r} appears more than once")
        seen.add(conv_id)
        plan = _conversation(len(plans), conv_id, item["messages"], max_tokens, default_max_tokens)
        if nonce:
            plan.turns[0].user_text = f"{nonce} {plan.turns[0].user_text}"
        plans.append(plan)
    if not plans:
        raise InputError("no conversations in the input")
    return Workload("conversations", plans, seed, source="conversations")


def _conversation(index: int, conv_id: str, messages: list, max_tokens, default_max_tokens) -> SessionPlan:
    system, turns, pending = "", [], []
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content", ""), str):
            raise InputError(f'conversation {conv_id!r} message [{j}]: expected {{"role", "content": str}}')
        role, content = m.get("role"), m.get("content") or ""
        if role == "system" and not turns and not pending:
            system += content
        elif role == "assistant":
            if not pending:
                continue  # an answer with no question before it: nothing to send
            n = max_tokens or max(1, count_tokens(content))
            turns.append(TurnPlan(len(turns), "user", 0.0, "\n".join(pending), [LLMAction(n)]))
            pending = []
        else:
            pending.append(content)
    if pending:
        turns.append(
            TurnPlan(len(turns), "user", 0.0, "\n".join(pending), [LLMAction(max_tokens or default_max_tokens)])
        )
    if not turns:
        raise InputError(f"conversation {conv_id!r} has no user message")
    return SessionPlan(index, conv_id, system, turns)


class _Corpus:
    """Words of ``text_files`` (when readable) or a seeded synthetic stream, by position."""

    def __init__(self, files: list, base_dir: Path, rng: random.Random) -> None:
        self.words: list[str] = []
        for name in files:
            p = Path(name) if Path(name).is_absolute() else base_dir / name
            if p.is_file():
                self.words += _WORD.findall(p.read_text(errors="replace"))
        self.synthetic = not self.words
        self.rng = rng

    def text(self, start: int, end: int) -> str:
        if self.synthetic and end > len(self.words):
            self.words += words(self.rng, end - len(self.words)).split()
        if end > len(self.words):
            raise InputError(f"text_files hold {len(self.words)} words; {end} needed")
        return " ".join(self.words[start:end])


def generate(
    conf: dict, *, seed: int = 0, nonce: str = "", base_dir: Path = Path("."), max_tokens: int | None = None
) -> Workload:
    """Synthetic conversations per vLLM's ``generate_conversations`` (words as tokens)."""
    for name in ("num_conversations", "text_files", "prompt_input", "prompt_output"):
        if name not in conf:
            raise InputError(f"missing field '{name}'")
    n_conv = conf["num_conversations"]
    if not isinstance(n_conv, int) or n_conv < 1:
        raise InputError("num_conversations must be a positive integer")
    if not isinstance(conf["text_files"], list) or not conf["text_files"]:
        raise InputError("text_files must be a non-empty list")
    pin, pout = conf["prompt_input"], conf["prompt_output"]
    if not isinstance(pin, dict) or not isinstance(pout, dict):
        raise InputError("prompt_input and prompt_output must be objects")
    for section, key in ((pin, "num_turns"), (pin, "num_tokens"), (pin, "prefix_num_tokens"), (pout, "num_tokens")):
        if key not in section:
            raise InputError(f"missing subsection '{key}'")
    d_turns = dist_from_dict(pin["num_turns"], "prompt_input.num_turns")
    d_in = dist_from_dict(pin["num_tokens"], "prompt_input.num_tokens")
    d_prefix = dist_from_dict(pin["prefix_num_tokens"], "prompt_input.prefix_num_tokens")
    d_common = dist_from_dict(
        pin.get("common_prefix_num_tokens", Constant(0).to_dict()), "prompt_input.common_prefix_num_tokens"
    )
    d_out = dist_from_dict(pout["num_tokens"], "prompt_output.num_tokens")

    rng = random.Random(f"kvtrace-bench:generate:{seed}")
    corpus = _Corpus(conf["text_files"], base_dir, random.Random(rng.getrandbits(64)))
    base_count = count_tokens(BASE_PROMPT)
    turn_counts = [max(int(t), 2) for t in d_turns.sample(rng, n_conv)]
    turn_counts = [t + t % 2 for t in turn_counts]
    prefixes = [int(p) for p in d_prefix.sample(rng, n_conv)]
    base_offset = 0
    common_text = ""
    common = int(d_common.sample(rng, 1)[0])
    if common > 0:
        common_text = corpus.text(0, max(0, common - 2)) + ". "
        base_offset += common
    plans = []
    for conv in range(n_conv):
        nturns = turn_counts[conv]
        n_in = [max(int(v), base_count) for v in d_in.sample(rng, nturns)]
        n_out = [max(int(v), 1) for v in d_out.sample(rng, nturns)]
        turns: list[TurnPlan] = []
        for turn_id in range(0, nturns, 2):
            content = f"{nonce}{conv} is a nice number... "
            if common_text and turn_id == 0:
                content = common_text + content
            left = n_in[turn_id] - count_tokens(content)
            if turn_id == 0 and prefixes[conv] > 0:
                content += f"{conv}, " + corpus.text(base_offset, base_offset + prefixes[conv]) + " "
                base_offset += prefixes[conv]
            content += BASE_PROMPT
            left -= base_count
            if left > 0:
                start = base_offset + turn_id * max(n_in)
                content += corpus.text(start, start + left)
            out = max_tokens or n_out[turn_id + 1]
            turns.append(TurnPlan(len(turns), "user", 0.0, content, [LLMAction(out)]))
        plans.append(SessionPlan(conv, f"CONV_ID_{conv}", "", turns))
        base_offset += nturns
    return Workload(GENERATE, plans, seed, source=GENERATE)
