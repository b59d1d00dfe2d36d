"""Mooncake's FAST'25 production traces (kvcache-ai/Mooncake, ``FAST25-release/traces/*.jsonl``) as
bench workloads, replayed with their timing.

Each line is one request: ``{"timestamp": ms since the trace start, "input_length": tokens,
"output_length": tokens, "hash_ids": [...]}``, ``hash_ids`` being remapped hashes of the prompt's
512-token blocks (equal ids: reusable prefix KV).  There are no session ids; :func:`sessions`
rebuilds them from shared prefixes with one rule:

- rows are taken in timestamp order (file order among equal timestamps);
- a row *continues* a session when the session's last request's full blocks
  (``input_length // 512`` ids, at least 2, so that a shared one-block system prompt does not glue
  unrelated requests together) are a prefix of the row's ``hash_ids`` and the row has more blocks;
  among several such sessions the longest match wins, then the most recent;
- a session is continued by one row only (the first in time): a second row extending the same
  request is a branch and starts a new session (its first turn still shares the prefix text, so
  P's prefix cache sees the reuse the trace has);
- any other row starts a new session.

The workload (:func:`workload`): a session's first turn is sent after a pause of its first
timestamp (sessions start as the trace has them: the bench runs every session at once, so
``--max-active-conversations`` would delay them); each later turn after the gap to the previous
row's timestamp.  The runner pauses *after* the previous answer, so a turn arrives later than in
the trace by that answer's latency.  Time compression: ``--time-scale F`` multiplies every pause;
with ``--arms``, ``--sim-time-scale S`` runs the simulator S times faster and divides the pauses
by S too, so the trace's gaps stay the same in model time (what D's TTL and the what-if see).
Text: block ``h`` is 512 words drawn from a generator seeded with ``h`` (the same ids give the same
words in every session), a first turn is its blocks' words cut to ``input_length``, and a later
turn adds ``input_length - previous input_length - previous output_length`` words (at least 1): the
trace's context growth beyond the previous prompt and answer; ``max_tokens`` is ``output_length``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from kvtrace.bench.workload import _VOCAB, LLMAction, SessionPlan, TurnPlan, Workload

DATA = Path(__file__).parent / "data"
#: names ``--input`` accepts for the traces shipped in kvtrace/bench/data (README.md there: provenance, licence)
SHIPPED = {"mooncake-conversation": DATA / "mooncake_conversation_every20.jsonl"}
BLOCK_TOKENS = 512
MIN_MATCH_BLOCKS = 2
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
SOURCE = "mooncake"


class TraceError(ValueError):
    """A Mooncake trace line that cannot be used (one line, with its line number)."""


@dataclass(frozen=True)
class Row:
    line: int  # 1-based line in the file
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @property
    def full_blocks(self) -> tuple[int, ...]:
        return self.hash_ids[: self.input_length // BLOCK_TOKENS]


def shipped(path: str | Path) -> Path:
    """``path``, or the shipped trace it names when no such file exists."""
    p = Path(path)
    return SHIPPED[str(path)] if not p.exists() and str(path) in SHIPPED else p


def looks_like(path: str | Path) -> bool:
    """True when the file's first non-empty line is a JSON object with Mooncake's four fields."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    return isinstance(obj, dict) and all(k in obj for k in FIELDS)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return False


def read_rows(path: str | Path) -> list[Row]:
    """Every row of the trace, validated, in timestamp order."""
    rows: list[Row] = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    rows.append(_row(n, line))
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path} is not UTF-8 text") from None
    if not rows:
        raise TraceError(f"{path}: no requests")
    return sorted(rows, key=lambda r: r.timestamp_ms)  # stable: file order among equal timestamps


def _row(n: int, line: str) -> Row:
    try:
        obj = json.loads(line)
    except ValueError:
        raise TraceError(f"line {n}: not JSON") from None
    if not isinstance(obj, dict) or any(k not in obj for k in FIELDS):
        raise TraceError(f"line {n}: expected an object with {', '.join(FIELDS)}")
    ints = [obj[k] for k in FIELDS[:3]]
    ids = obj["hash_ids"]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in ints):
        raise TraceError(f"line {n}: timestamp, input_length and output_length must be non-negative integers")
    if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in ids):
        raise TraceError(f"line {n}: hash_ids must be a list of integers")
    if ints[1] < 1 or len(ids) != -(-ints[1] // BLOCK_TOKENS):
        raise TraceError(f"line {n}: {len(ids)} hash_ids for {ints[1]} input tokens (512 tokens a block)")
    return Row(n, ints[0], ints[1], ints[2], tuple(ids))


def sessions(rows: list[Row]) -> list[list[Row]]:
    """Rows grouped into sessions by the rule of the module docstring (rows in timestamp order)."""
    out: list[list[Row]] = []
    open_keys: dict[tuple[int, ...], list[int]] = {}  # a session's last full blocks -> session indices
    for row in rows:
        target = _continued(row, open_keys)
        if target is None:
            target = len(out)
            out.append([])
        out[target].append(row)
        key = row.full_blocks
        if len(key) >= MIN_MATCH_BLOCKS:
            open_keys.setdefault(key, []).append(target)
    return out


def gaps_s(groups: list[list[Row]]) -> list[float]:
    """Seconds between consecutive requests of each session."""
    return [(b.timestamp_ms - a.timestamp_ms) / 1000 for g in groups for a, b in zip(g, g[1:], strict=False)]


def _continued(row: Row, open_keys: dict[tuple[int, ...], list[int]]) -> int | None:
    for k in range(len(row.hash_ids) - 1, MIN_MATCH_BLOCKS - 1, -1):  # longest match first
        found = open_keys.get(row.hash_ids[:k])
        if found:
            target = found.pop()  # the most recent
            if not found:
                del open_keys[row.hash_ids[:k]]
            return target
    return None


class _Blocks:
    """The words of block hash ``h``: 512 words from a generator seeded with ``h`` (cached)."""

    def __init__(self) -> None:
        self._words: dict[int, list[str]] = {}

    def words(self, hash_ids: tuple[int, ...], n: int) -> list[str]:
        out: list[str] = []
        for h in hash_ids:
            if len(out) >= n:
                break
            if h not in self._words:
                self._words[h] = random.Random(f"mooncake-block:{h}").choices(_VOCAB, k=BLOCK_TOKENS)
            out += self._words[h]
        return out[:n]


def workload(rows: list[Row], *, name: str, seed: int = 0, nonce: str = "", max_tokens: int | None = None) -> Workload:
    """The sessions of ``rows`` as a timed :class:`Workload` (see the module docstring)."""
    blocks = _Blocks()
    t0 = rows[0].timestamp_ms if rows else 0
    plans: list[SessionPlan] = []
    for i, group in enumerate(sessions(rows)):
        turns: list[TurnPlan] = []
        prev: Row | None = None
        for row in group:
            if prev is None:
                pause = (row.timestamp_ms - t0) / 1000
                text = blocks.words(row.hash_ids, row.input_length)
                if nonce:
                    text = [nonce, *text]
            else:
                pause = (row.timestamp_ms - prev.timestamp_ms) / 1000
                grown = max(1, row.input_length - prev.input_length - prev.output_length)
                text = random.Random(f"mooncake-turn:{row.line}").choices(_VOCAB, k=grown)
            out = max_tokens or max(1, row.output_length)
            turns.append(TurnPlan(len(turns), "user", pause, " ".join(text), [LLMAction(out)]))
            prev = row
        plans.append(SessionPlan(i, f"mc{i}-l{group[0].line}", "", turns))
    return Workload(name, plans, seed, source=SOURCE, timed=True)


def load(path: str | Path, *, seed: int = 0, nonce: str = "", max_tokens: int | None = None) -> Workload:
    return workload(read_rows(path), name=Path(path).name, seed=seed, nonce=nonce, max_tokens=max_tokens)
