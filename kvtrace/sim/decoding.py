"""An engine's decode steps as the virtual loop's fast events (:meth:`kvtrace.sim.virtual.VirtualLoop.call_fast`).

The served engine decodes each request in a loop of ``asyncio.sleep(step)`` and one yielded token
per step (:meth:`kvtrace.sim.engine.Engine._decode`): the step lasts ``decode_step_s`` of the
engine's running context at the moment it starts, and each token adds one to that context.  On the
virtual loop that costs a timer, a future and a task wake-up per token of every request, most of
the CPU of a long replay.  :func:`batches` makes the same tokens at the same times with one fast
event per token (a plain function call), and wakes the consumer only for the tokens it asks to see
at their own time (the :class:`Pacer`'s ``deliver``): the worker's stream writes (the first token
with text, then every ``stream_interval`` tokens) and the last token.  The tokens in between are
handed over with the next delivered one.

A request decoding alone on its engine (nearly always, on a fleet: docs/benchmarks.md) needs no
event per token either: nothing else reads or moves that engine's context until another decode
joins it, it is abandoned or aborted, or its next delivered token is due.  So its step times are
computed ahead, by the same sums, up to that token, and one event is scheduled there; the tokens
before it are committed (context, output, batch, the pacer's count) when it fires, or, up to the
moment, when another request's decode touches the engine (:func:`settle`), after which every
request on the engine goes on token by token.

What is the same: the step's duration (the engine's own ``_step_at``, on the context as it is when
the step starts: the decode's prompt added when it starts, one token per token made, the whole
context removed with its last token or when it is abandoned), the token ids and pieces, the output
list, ``on_first_token``.  What differs: events at exactly equal virtual times may run in another
order (asyncio orders equal timers by its heap).  ``tests/sim/test_fast_decode.py`` pins the spans.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Protocol

from kvtrace.sim import tokenizer

if TYPE_CHECKING:
    from kvtrace.sim.engine import Engine, Generation

Token = tuple[int, str]


class Pacer(Protocol):
    """Which tokens of a decode reach the consumer at their own time (None: only the last)."""

    def deliver(self, i: int, piece: str) -> bool:
        """Token ``i`` is made now: hand it over now?  (Counts it.)"""
        ...

    def first_due(self, times: list[float], skipped: int) -> int | None:
        """The first ``k`` for which :meth:`deliver` would say yes to the ``k``-th next token, made at
        ``times[k]``, after it said no to the ``skipped`` tokens since it last counted and to the
        ``k`` before; None: to none of them.  Changes nothing."""
        ...

    def skip(self, n: int) -> None:
        """``n`` tokens were made that :meth:`deliver` would have refused: count them as it would."""
        ...


class _Run:
    __slots__ = (
        "loop", "gen", "ids", "pieces", "i", "ctx", "pacer", "batch", "out", "waiter", "finished", "dead",
        "ahead", "epoch",
    )  # fmt: skip

    def __init__(self, loop: Any, gen: Generation, pacer: Pacer | None) -> None:
        self.loop, self.gen = loop, gen
        self.ids, self.pieces = tokenizer.generate(gen.seed, gen.max_tokens, gen.thinking)
        self.i = 0
        self.ctx = len(gen.prompt)
        self.pacer = pacer
        self.batch: list[Token] = []
        self.out: deque[list[Token]] = deque()
        self.waiter: asyncio.Future | None = None
        self.finished = self.dead = False
        self.ahead: list[float] | None = None  # computed ahead: the times of tokens i, i+1, ...
        self.epoch = 0  # bumped when a scheduled wake-up no longer stands


def fast_loop(engine: Engine) -> Any:
    """The running loop where the fast path applies (costs on, and a loop with fast events: the
    virtual one), else None.  Looked up once per request: on Python 3.11 a loop lookup is a
    ``getpid`` system call."""
    if not engine.cost.enabled:
        return None
    loop = asyncio.get_running_loop()
    return loop if hasattr(loop, "call_fast") else None


async def batches(engine: Engine, gen: Generation, pacer: Pacer | None, loop: Any) -> AsyncIterator[list[Token]]:
    """Yield ``gen``'s tokens in lists, each ending with a delivered token, at its time, on ``loop``
    (:func:`fast_loop`'s)."""
    run = _Run(loop, gen, pacer)
    if not run.ids:
        return
    settle(engine)
    engine._decode_ctx += run.ctx
    loop.call_fast(loop.time() + engine._step_at(engine._decode_ctx), _tick, run)
    try:
        while True:
            while not run.out:
                run.waiter = loop.create_future()
                await run.waiter
            yield run.out.popleft()
            if run.finished and not run.out:
                return
    finally:
        if not run.finished:  # abandoned (the client left, an error): its context leaves the batch now
            settle(engine, reschedule=False)
            run.dead = True
            engine._decode_ctx -= run.ctx


def settle(engine: Engine, reschedule: bool = True) -> None:
    """Commit the tokens of ``engine``'s decode computed ahead, those made before now, and put it
    back to an event per token (``reschedule``) before anything else reads or moves the engine's
    context or that decode's output."""
    run = engine._ahead
    if run is None:
        return
    engine._ahead = None
    times, run.ahead = run.ahead, None
    run.epoch += 1
    now = run.loop._now
    made, last = 0, len(times) - 1
    while made < last and times[made] < now:  # the last is the delivered token's: its event is to come
        made += 1
    _commit(run, made)
    if reschedule:
        run.loop.call_fast(times[made], _tick, run)


def _commit(run: _Run, n: int) -> None:
    """``n`` tokens made, none of them delivered (their pacer said no; not the first, not the last)."""
    if n <= 0:
        return
    i, gen = run.i, run.gen
    ids, pieces = run.ids[i : i + n], run.pieces[i : i + n]
    gen.engine._decode_ctx += n
    run.ctx += n
    gen.output += ids
    run.batch += zip(ids, pieces, strict=True)
    run.i = i + n
    if run.pacer is not None:
        run.pacer.skip(n)


def _wake(arg: tuple[_Run, int]) -> None:
    """The delivered token a decode's times were computed ahead to is made now."""
    run, epoch = arg
    if run.dead or epoch != run.epoch:
        return
    engine = run.gen.engine
    engine._ahead = None
    n, run.ahead = len(run.ahead) - 1, None  # type: ignore[arg-type]
    _commit(run, n)
    _tick(run)


def _tick(run: _Run) -> None:
    """One decode step of ``run`` ends now: its token, then the next step or the end."""
    if run.dead:
        return
    gen = run.gen
    engine = gen.engine
    if engine._ahead is not None and engine._ahead is not run:
        settle(engine)  # another decode's tokens computed ahead: committed before this one moves the context
    engine._decode_ctx += 1
    run.ctx += 1
    i = run.i
    tid, piece = run.ids[i], run.pieces[i]
    gen.output.append(tid)
    if i == 0 and engine.on_first_token is not None:
        engine.on_first_token(time.perf_counter() - gen.arrival)
    run.batch.append((tid, piece))
    run.i = i = i + 1
    if i == len(run.ids):
        run.finished = hand = True
        engine._decode_ctx -= run.ctx
    else:
        hand = run.pacer is not None and run.pacer.deliver(i - 1, piece)
        if engine._decode_ctx == run.ctx:  # alone on the engine: its next steps are computed ahead
            _go_ahead(run, engine)
        else:
            run.loop.call_fast(run.loop._now + engine._step_at(engine._decode_ctx), _tick, run)
    if hand:
        run.out.append(run.batch)
        run.batch = []
        if run.waiter is not None and not run.waiter.done():
            run.waiter.set_result(None)


def _go_ahead(run: _Run, engine: Engine) -> None:
    """The times of ``run``'s next tokens, up to the next its pacer delivers or the last (in
    growing slices: a pacer may want the very next one), and one event at that token's time."""
    pacer, n = run.pacer, len(run.ids) - run.i
    times: list[float] = []
    t, size = run.loop._now, 1
    while True:
        part = list(accumulate(engine.cost.decode_steps_wall(run.ctx + len(times), size), initial=t))
        del part[0]  # t itself: the times are t + the first step, + the second, ...
        due = pacer.first_due(part, len(times)) if pacer is not None else None
        if due is not None:
            times += part[: due + 1]
            break
        times += part
        if len(times) == n:
            break
        t, size = part[-1], min(n - len(times), 4 * size if size > 1 else 64)
    if len(times) == 1:
        run.loop.call_fast(times[0], _tick, run)
        return
    run.ahead = times
    engine._ahead = run
    run.loop.call_fast(times[-1], _wake, (run, run.epoch))
