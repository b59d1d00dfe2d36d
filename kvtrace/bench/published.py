"""The published workloads, built in: ``kvtrace bench --workload NAME [--sweep prefix=...]``.

Both are vLLM ``generate_conversations`` configs (:func:`kvtrace.bench.vllm_inputs.generate` builds
them, words as tokens, a seeded synthetic corpus standing in for the Project Gutenberg text), as
vLLM's ``benchmarks/multi_turn/benchmark_serving_multi_turn.py`` reads them.  ``num_turns`` counts
messages, as there: 10 turns are 5 user requests.

- ``published-sweep``: the bidirectional benchmark's sweep (vLLM blog 2026-10-12, its
  ``run_multiturn_sweep.sh``): vLLM's ``generate_multi_turn.json`` with 10 conversations x 10
  turns, 150-token user and 300-token assistant turns (constant), the first turn's prefix a
  constant swept 2k...24k (:data:`SWEEP_PREFIXES`; one run: :attr:`Published.prefix`), the base
  config's 500-token common prefix kept; run with 2 clients, 10 active conversations, no pacing.
- ``vllm-pr-multiturn``: the merged vLLM PR that introduced multi-turn P/D reuse (Llama-3.3-70B on
  p5en, P's prefix cache off): 24 conversations of 12-18 turns (uniform), 500 shared tokens,
  per-conversation prefixes lognormal averaging 4,000 (at most 10,000), 120-160 tokens in and
  800-1,200 out per turn (uniform).  Clients are not stated: 2, as the sweep.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

SWEEP_PREFIXES = (2000, 4000, 8000, 12000, 16000, 20000, 24000)


@dataclass(frozen=True)
class Published:
    name: str
    config: dict  # the generate_conversations config
    clients: int
    max_active_conversations: int
    prefix: int | None = None  # the swept first-turn prefix of one run (None: the config's own)


def _const(v: int) -> dict:
    return {"distribution": "constant", "value": v}


def _uniform(lo: int, hi: int) -> dict:
    return {"distribution": "uniform", "min": lo, "max": hi}


def _config(n_conv: int, turns: dict, prefix: dict, user: dict, answer: dict) -> dict:
    return {
        "filetype": "generate_conversations",
        "num_conversations": n_conv,
        "text_files": ["pg1184.txt"],  # absent here: the seeded synthetic corpus stands in
        "prompt_input": {
            "num_turns": turns,
            "common_prefix_num_tokens": _const(500),
            "prefix_num_tokens": prefix,
            "num_tokens": user,
        },
        "prompt_output": {"num_tokens": answer},
    }


WORKLOADS: dict[str, Published] = {
    "published-sweep": Published(
        "published-sweep",
        _config(10, _uniform(10, 10), _const(24000), _const(150), _const(300)),
        clients=2,
        max_active_conversations=10,
        prefix=24000,
    ),
    "vllm-pr-multiturn": Published(
        "vllm-pr-multiturn",
        _config(
            24,
            _uniform(12, 18),
            {"distribution": "lognormal", "average": 4000, "max": 10000},
            _uniform(120, 160),
            _uniform(800, 1200),
        ),
        clients=2,
        max_active_conversations=24,
    ),
}


def get(name: str) -> Published:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def with_prefix(config: dict, prefix: int) -> dict:
    """``config`` (a generate_conversations config) with every first turn's prefix ``prefix``
    tokens, as the sweep script sets it (a constant)."""
    if not isinstance(prefix, int) or prefix < 0:
        raise ValueError("prefix must be a non-negative integer")
    out = copy.deepcopy(config)
    out["prompt_input"]["prefix_num_tokens"] = _const(prefix)
    return out


def parse_sweep(spec: str) -> tuple[str, tuple[int, ...]]:
    """``prefix=2000,4000`` -> ("prefix", (2000, 4000)); ValueError (one line) otherwise."""
    name, sep, values = spec.partition("=")
    if name.strip() != "prefix" or not sep:
        raise ValueError(f"--sweep {spec!r}: expected prefix=N,N,... (the first turn's prefix tokens)")
    try:
        points = tuple(int(v) for v in values.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--sweep {spec!r}: prefix values must be integers") from None
    if not points or any(p < 0 for p in points) or len(set(points)) != len(points):
        raise ValueError(f"--sweep {spec!r}: give distinct non-negative prefix lengths")
    return "prefix", points
