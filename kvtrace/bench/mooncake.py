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

import functools
import json
import random
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from kvtrace.bench.workload import _VOCAB, LazyTurnPlan, LLMAction, SessionPlan, TurnPlan, Workload

DATA = Path(__file__).parent / "data"
#: names ``--input`` accepts for the traces shipped in kvtrace/bench/data (README.md there: provenance, licence)
SHIPPED = {"mooncake-conversation": DATA / "mooncake_conversation_every20.jsonl"}
BLOCK_TOKENS = 512
MIN_MATCH_BLOCKS = 2
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
SOURCE = "mooncake"
BLOCK_CACHE = 16_384  # blocks whose words are kept (joined, ~2.8 KB each)
GROWN_CACHE = 4_096  # later turns' texts kept (a tiled copy sends each again: ``tile``)


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
    """True when the file's first non-empty line is a JSON object with one of Mooncake's four fields
    (reading it then names what a row lacks, where the file read as one JSON document would not
    parse past its first line)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    return isinstance(obj, dict) and "filetype" not in obj and any(k in obj for k in FIELDS)
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
        missing = [k for k in FIELDS if k not in obj] if isinstance(obj, dict) else FIELDS
        raise TraceError(f"line {n}: expected an object with {', '.join(FIELDS)} (missing {', '.join(missing)})")
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
    """The words of block hash ``h``: 512 words from a generator seeded with ``h``, kept joined for
    the :data:`BLOCK_CACHE` most recently used blocks (the shipped subset has about 9,000)."""

    def __init__(self) -> None:
        self._text: OrderedDict[int, str] = OrderedDict()

    def _words(self, h: int) -> list[str]:
        return random.Random(f"mooncake-block:{h}").choices(_VOCAB, k=BLOCK_TOKENS)

    def _joined(self, h: int) -> str:
        text = self._text.get(h)
        if text is None:
            text = self._text[h] = " ".join(self._words(h))
            if len(self._text) > BLOCK_CACHE:
                self._text.popitem(last=False)
        else:
            self._text.move_to_end(h)
        return text

    def text(self, hash_ids: tuple[int, ...], n: int, head: str = "") -> str:
        """``head`` (if any) and the first ``n`` words of the blocks, space-separated."""
        full, rest = divmod(n, BLOCK_TOKENS)
        parts = [head] if head else []
        parts += [self._joined(h) for h in hash_ids[:full]]
        if rest and full < len(hash_ids):  # the block's first words: its joined text up to a space
            parts += self._joined(hash_ids[full]).split(" ", rest)[:rest]
        return " ".join(parts)


_BLOCKS = _Blocks()  # one cache for every workload of this process (the arms build theirs several times)


def workload(
    rows: list[Row],
    *,
    name: str,
    seed: int = 0,
    nonce: str = "",
    max_tokens: int | None = None,
    copies: int = 1,
    period_s: float = 0.0,
) -> Workload:
    """The sessions of ``rows`` as a timed :class:`Workload` (see the module docstring); ``copies``
    > 1 tiles them (:func:`tile`).  A turn's text is made when the bench sends it."""
    t0 = rows[0].timestamp_ms if rows else 0
    plans: list[SessionPlan] = []
    for i, (start, k, group) in enumerate(tile(sessions(rows), copies, period_s)):
        head = nonce if k == 0 else f"{nonce}c{k}"
        turns: list[TurnPlan] = []
        prev: Row | None = None
        for row in group:
            if prev is None:
                pause = (row.timestamp_ms - t0) / 1000 + start
                make = functools.partial(_BLOCKS.text, row.hash_ids, row.input_length, head)
            else:
                pause = (row.timestamp_ms - prev.timestamp_ms) / 1000
                grown = max(1, row.input_length - prev.input_length - prev.output_length)
                make = functools.partial(_grown, row.line, grown)
            out = max_tokens or max(1, row.output_length)
            turns.append(LazyTurnPlan(len(turns), "user", pause, make, [LLMAction(out)]))
            prev = row
        suffix = f"-c{k}" if k else ""
        plans.append(SessionPlan(i, f"mc{i}-l{group[0].line}{suffix}", "", turns))
    return Workload(name, plans, seed, source=SOURCE, timed=True)


def tile(groups: list[list[Row]], copies: int, period_s: float) -> list[tuple[float, int, list[Row]]]:
    """``copies`` of the sessions, copy ``k`` starting ``k * period_s`` later, in order of arrival:
    ``(offset s, k, rows)``.  Copy ``k`` > 0 puts its own word before every first turn (the nonce
    and ``c<k>``), so copies share no KV, while the sessions of one copy share what the trace's do.
    The shipped subset is every 20th session of an hour: 20 copies ``period_s`` = 180 s apart hold
    about as many sessions at once as the whole trace (8,099 sessions, 12,031 requests an hour)."""
    if copies < 1 or period_s < 0:
        raise TraceError("tiling needs at least one copy and a period >= 0 s")
    tiled = [(k * period_s, k, g) for k in range(copies) for g in groups]
    return sorted(tiled, key=lambda x: (x[2][0].timestamp_ms / 1000 + x[0], x[1]))  # stable within a copy


@functools.lru_cache(maxsize=GROWN_CACHE)  # the tiled copies of a session send the same turns
def _grown(line: int, n: int) -> str:
    return " ".join(random.Random(f"mooncake-turn:{line}").choices(_VOCAB, k=n))


def load(path: str | Path, *, seed: int = 0, nonce: str = "", max_tokens: int | None = None) -> Workload:
    return workload(read_rows(path), name=Path(path).name, seed=seed, nonce=nonce, max_tokens=max_tokens)
