"""An engine's decode steps as the virtual loop's fast events (:meth:`kvtrace.sim.virtual.VirtualLoop.call_fast`).

The served engine decodes each request in a loop of ``asyncio.sleep(step)`` and one yielded token
per step (:meth:`kvtrace.sim.engine.Engine._decode`): the step lasts ``decode_step_s`` of the
engine's running context at the moment it starts, and each token adds one to that context.  On the
virtual loop that costs a timer, a future and a task wake-up per token of every request, most of
the CPU of a long replay.  :class:`Steps` makes the same tokens at the same times with one fast
event per token (a plain function call), and wakes the consumer only for the tokens it asks to see
at their own time (``deliver``): the worker's stream writes (the first token with text, then every
``stream_interval`` tokens) and the last token.  The tokens in between are handed over with the next
delivered one.

What is the same: the step's duration (the engine's own ``_step_s``, on the context as it is when
the step starts: the decode's prompt added when it starts, one token per token made, the whole
context removed with its last token or when it is abandoned), the token ids and pieces, the output
list, ``on_first_token``.  What differs: events at exactly equal virtual times may run in another
order (asyncio orders equal timers by its heap).  ``tests/sim/test_fast_decode.py`` pins the spans.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from kvtrace.sim import tokenizer

if TYPE_CHECKING:
    from kvtrace.sim.engine import Engine, Generation

Token = tuple[int, str]
#: ``deliver(i, piece)``: must token ``i`` reach the consumer at its own time?  None: only the last
Deliver = Callable[[int, str], bool] | None


class _Run:
    __slots__ = ("loop", "gen", "ids", "pieces", "i", "ctx", "deliver", "batch", "out", "waiter", "finished", "dead")

    def __init__(self, loop: Any, gen: Generation, deliver: Deliver) -> None:
        self.loop, self.gen = loop, gen
        self.ids, self.pieces = tokenizer.generate(gen.seed, gen.max_tokens, gen.thinking)
        self.i = 0
        self.ctx = len(gen.prompt)
        self.deliver = deliver
        self.batch: list[Token] = []
        self.out: deque[list[Token]] = deque()
        self.waiter: asyncio.Future | None = None
        self.finished = self.dead = False


def fast_loop(engine: Engine) -> Any:
    """The running loop where the fast path applies (costs on, and a loop with fast events: the
    virtual one), else None.  Looked up once per request: on Python 3.11 a loop lookup is a
    ``getpid`` system call."""
    if not engine.cost.enabled:
        return None
    loop = asyncio.get_running_loop()
    return loop if hasattr(loop, "call_fast") else None


async def batches(engine: Engine, gen: Generation, deliver: Deliver, loop: Any) -> AsyncIterator[list[Token]]:
    """Yield ``gen``'s tokens in lists, each ending with a delivered token, at its time, on ``loop``
    (:func:`fast_loop`'s)."""
    run = _Run(loop, gen, deliver)
    if not run.ids:
        return
    engine._decode_ctx += run.ctx
    loop.call_fast(loop.time() + engine._step_s(), _tick, run)
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
            run.dead = True
            engine._decode_ctx -= run.ctx


def _tick(run: _Run) -> None:
    """One decode step of ``run`` ends now: its token, then the next step or the end."""
    if run.dead:
        return
    gen = run.gen
    engine = gen.engine
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
        run.finished = True
        engine._decode_ctx -= run.ctx
    else:
        run.loop.call_fast(run.loop._now + engine._step_s(), _tick, run)
    if run.finished or (run.deliver is not None and run.deliver(i - 1, piece)):
        run.out.append(run.batch)
        run.batch = []
        if run.waiter is not None and not run.waiter.done():
            run.waiter.set_result(None)
