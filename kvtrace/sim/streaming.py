"""How a simulated worker streams a decode: which tokens reach the client at their own time, and
how the tokens of one write become SSE chunks (:meth:`kvtrace.sim.worker.SimWorker._write_tokens`).

vLLM's ``--stream-interval N`` sends the first token at once and then N tokens per chunk; the
worker's ``stream_interval`` does the same, counting from the first token whose delta has text (a
thinking answer's ``<|think|>`` tag streams as an empty delta: the client's time to first token is
its first non-empty one, which must arrive at its own time).  1 (the default) is one chunk per token;
the virtual arms use ``math.inf``: that first token, then the rest of the answer in one write with
the last token, at the last token's time, so the proxy and the client parse three chunks, not one
per token.  What the client measures does not change: the first token with text arrives at its own
time, the last at its own, ``usage`` counts the tokens, the text is the same; only when the
intermediate tokens arrive does.  Two bounds keep the writes from being too rare: a client that
stops reading early (``interrupt_after``) counts chunks, so a workload with interruptions is run
with 1 (:func:`kvtrace.bench.inproc.run_arm`); and a write goes out at least every
:data:`MAX_SILENCE_S` of model time, far inside the proxy's 600 s read timeout.
"""

from __future__ import annotations

import asyncio
import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass

from kvtrace import jsoncodec as codec
from kvtrace.sim import tokenizer, wire

MAX_SILENCE_S = 30.0  # at most this long (model s, the engine's clock) between two writes of one stream


class Pacing:
    """The :class:`~kvtrace.sim.decoding.Pacer` of one streamed request: which tokens of it are
    written at their own time."""

    def __init__(self, interval: float, req: wire.ParsedRequest, reasoning: int, timed: bool) -> None:
        self.interval, self.req, self.reasoning, self.timed = interval, req, reasoning, timed
        self.texted = False  # the first token with text has been delivered
        self.since = 0  # tokens since the last delivered one
        self.last_t = -math.inf
        self._time: Callable[[], float] | None = None  # the running loop's clock, from the first token on

    def deliver(self, i: int, piece: str) -> bool:
        if not self.timed:  # zero cost: no time passes between tokens, one write at the end
            return False
        if self.interval <= 1:
            return True
        clock = self._time
        if clock is None:  # called per token: look the loop up once
            clock = self._time = asyncio.get_running_loop().time
        now = clock()
        self.since = since = self.since + 1
        if not self.texted:
            self.texted = self._has_text(i, piece)
        elif since < self.interval and now - self.last_t < MAX_SILENCE_S:
            return False
        self.since, self.last_t = 0, now
        return True

    def first_due(self, times: list[float], skipped: int) -> int | None:
        """What :meth:`deliver` would answer, by a count and a binary search over the (increasing)
        times instead of token by token: before the first token with text every token goes out
        (whatever its text), after it only the count and the silence bound decide."""
        if not self.timed or not times:
            return None
        if self.interval <= 1 or not self.texted:
            return 0
        # deliver's "since < interval" fails at the k-th token when since + skipped + k + 1 >= interval
        by_count = len(times)
        if math.isfinite(self.interval):
            by_count = max(0, math.ceil(self.interval - self.since - skipped - 1))
        last_t = self.last_t
        by_time = bisect.bisect_left(times, True, key=lambda t: t - last_t >= MAX_SILENCE_S)
        k = min(by_count, by_time)
        return k if k < len(times) else None

    def skip(self, n: int) -> None:
        if self.timed and self.interval > 1:
            self.since += n

    def _has_text(self, i: int, piece: str) -> bool:
        req = self.req
        if req.tool_name:
            return i == 0  # the call's name
        if req.chat:
            return bool(tokenizer.delta(i, piece, self.reasoning)[1])
        return bool(piece)


@dataclass
class Run:
    """One chunk to write: a field's consecutive deltas, or a prebuilt chunk (``field`` None)."""

    field: str | None
    texts: list[str]
    chunk: dict | None = None
    finish: str | None = None
    kvp: dict | None = None
    usage: dict | None = None


def add(runs: list[Run], name: str, text: str, finish, kvp, usage, merge: bool) -> None:
    """Token's delta (``name``: content, reasoning or a completion's text) onto ``runs``: into the
    last run when ``merge`` and that run is of the same field, else as a new run."""
    last = runs[-1] if runs else None
    if merge and last is not None and last.field == name and last.finish is None:
        last.texts.append(text)
        last.finish, last.kvp, last.usage = finish, kvp, usage
    else:
        runs.append(Run(name, [text], None, finish, kvp, usage))


def encode(run: Run, chat: bool, rid: str, created: int, model: str) -> bytes:
    chunk = run.chunk
    if chunk is None:
        text = "".join(run.texts)
        if chat:
            chunk = wire.chat_chunk(rid, created, model, text, run.finish, run.kvp, run.usage, run.field)
        else:
            chunk = wire.completion_chunk(rid, created, model, text, run.finish, run.kvp, run.usage)
    return sse(chunk)


def sse(obj) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return b"data: " + codec.dumps(obj) + b"\n\n"
