"""Virtual time: run the simulated cluster, the proxy and the bench client in one process on an
asyncio loop whose clock is simulated, so the answer does not move with the host's load.

    from kvtrace.sim import virtual
    result = virtual.run(main(), seed=0)   # main() is any coroutine: SimCluster, proxy, bench

:class:`VirtualLoop` is asyncio's selector loop with two changes: ``time()`` is a number the loop
owns, and when no callback is ready it jumps that number to the earliest timer instead of
blocking (a discrete-event loop: every ``asyncio.sleep`` of the engine, the connector, the bench's
pauses and the TTLs is an event).  Work on the CPU takes no virtual time.  Sockets are replaced by
:mod:`kvtrace.sim.memnet`; executor work (``run_in_executor``, ``getaddrinfo``) runs inline on the
loop's thread, so time never jumps past a thread's work.  OTel's span processors still export from
their threads: the timestamps are taken when spans start and end, on the loop's thread.

Two things keep a long run cheap.  The selector is polled only when the loop would otherwise wait
(nothing ready): with no sockets, polling between ready callbacks finds nothing and costs a system
call per iteration.  And :meth:`VirtualLoop.call_fast` schedules a plain function at a virtual time
outside asyncio's timers (no handle, no task, no future): the simulated engines' decode steps
(:mod:`kvtrace.sim.decoding`), one per token of every running request, are such events.  They run
in time order with asyncio's timers: before advancing to the next timer the loop runs every fast
event due strictly earlier, each at its own time, and stops as soon as one of them makes a callback
ready (that callback runs at the fast event's time).

:func:`run` routes every clock the code reads through the loop for the run's duration:
``time.time``/``time_ns``/``perf_counter``/``monotonic`` (and their ``_ns``), the SDK's and the fast
spans' ``time_ns``, aiohttp's client pools' ``monotonic``; wall time starts at :data:`EPOCH`.  It
seeds the span-id generator and ``uuid.uuid4`` from ``seed``: one seed, the same spans, ids
included.  It collects cyclic garbage less often (:func:`collector`).  Everything is restored on exit.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import random
import selectors
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from contextlib import contextmanager
from typing import Any

from kvtrace.sim.memnet import MemNet

EPOCH = 1_767_225_600  # 2026-01-01T00:00:00Z: the wall time a virtual run starts at
IDLE_LIMIT_S = 30.0  # real seconds to wait for another thread when nothing is scheduled
GC_THRESHOLDS = (200_000, 20, 100)  # the collector's during a run (:func:`collector`)


class VirtualDeadlock(RuntimeError):
    """Nothing ready, nothing scheduled, nothing from another thread: the run can never finish."""


class _Selector(selectors.DefaultSelector):
    loop: VirtualLoop

    def select(self, timeout=None):
        if timeout == 0:  # callbacks are ready: no socket can have anything, skip the system call
            return []
        loop = self.loop
        if loop._run_fast():  # a fast event readied a callback, at its own time
            return []
        events = super().select(0)
        if events:
            return events
        if loop._scheduled:  # asyncio already dropped cancelled timers from the head
            loop._now = max(loop._now, loop._scheduled[0]._when)
            return events
        events = super().select(IDLE_LIMIT_S)  # only a thread's call_soon_threadsafe can wake us
        if not events:
            raise VirtualDeadlock("virtual clock: no task can ever run again (a deadlock)")
        return events


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0
        self.net = MemNet(self)
        self._fast: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self._fast_seq = itertools.count()  # equal times run in the order they were scheduled

    def call_fast(self, when: float, fn: Callable[[Any], None], arg: Any) -> None:
        """Run ``fn(arg)`` at virtual time ``when`` (not before the loop's time); it must not block
        and may schedule asyncio work (``call_soon``, a future's result), which then runs at ``when``."""
        heapq.heappush(self._fast, (when, next(self._fast_seq), fn, arg))

    def _run_fast(self) -> bool:
        """Run the fast events due before the next asyncio timer, in time order; True when one made
        a callback ready (the loop's time is then that event's)."""
        fast = self._fast
        if not fast:
            return False
        ready, timers, pop = self._ready, self._scheduled, heapq.heappop
        while fast and (not timers or fast[0][0] < timers[0]._when):
            when, _, fn, arg = pop(fast)
            if when > self._now:
                self._now = when
            fn(arg)
            if ready:
                return True
        return False

    def time(self) -> float:
        return self._now

    def _write_to_self(self) -> None:
        # call_soon_threadsafe's wake-up (a byte on the self-pipe, a system call): the loop's own thread
        # (asyncio's async-generator finalizer, once per abandoned generator) needs none, it is not waiting
        if threading.get_ident() != self._thread_id:
            super()._write_to_self()

    def run_in_executor(self, executor, func, *args):
        fut = self.create_future()
        try:
            fut.set_result(func(*args))
        except Exception as exc:
            fut.set_exception(exc)
        return fut

    async def create_server(self, protocol_factory, host=None, port=None, **kwargs):
        return self.net.listen(protocol_factory, host, port)

    async def create_connection(self, protocol_factory, host=None, port=None, *, sock=None, **kwargs):
        return self.net.connect(protocol_factory, host, port, sock)

    async def sock_connect(self, sock, address) -> None:
        self.net.remember(sock, address)


def _seeded_uuid4(rng: random.Random):
    def uuid4() -> uuid.UUID:
        return uuid.UUID(int=rng.getrandbits(128), version=4)

    return uuid4


@contextmanager
def clocks(loop: VirtualLoop, seed: int = 0):
    """Every clock the code reads on this thread follows ``loop``; ids are drawn from ``seed``.
    Other threads (the span processors' exporters) keep the real clocks and ids: their timers and
    file names are real, and their draws do not move this thread's seeded ones."""
    import aiohttp.connector
    import opentelemetry.sdk.trace as sdk_trace

    from kvtrace.telemetry import fastspans, ids

    here = threading.get_ident()

    def now() -> float:
        return loop._now

    def ns() -> int:
        return round(loop._now * 1e9)

    def wall_ns() -> int:
        return EPOCH * 1_000_000_000 + ns()

    def here_only(virtual: Callable, real: Callable) -> Callable:
        def clock():
            return virtual() if threading.get_ident() == here else real()

        return clock

    virtual = [
        (time, "time", lambda: EPOCH + loop._now),
        (time, "time_ns", wall_ns),
        (time, "perf_counter", now),
        (time, "perf_counter_ns", ns),
        (time, "monotonic", now),
        (time, "monotonic_ns", ns),
        (sdk_trace, "time_ns", wall_ns),
        (fastspans, "time_ns", wall_ns),
        # the client pools' keep-alive expiry: on the real clock they reused connections idle for
        # virtual minutes, which servers on the loop's clock were closing at that instant
        (aiohttp.connector, "monotonic", now),
        (uuid, "uuid4", _seeded_uuid4(random.Random(f"kvtrace-virtual:uuid:{seed}"))),
    ]
    patches = [(obj, name, here_only(value, getattr(obj, name))) for obj, name, value in virtual]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    ids._rng.seed(f"kvtrace-virtual:ids:{seed}")
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        ids._reseed()


@contextmanager
def collector(thresholds: tuple[int, int, int] = GC_THRESHOLDS):
    """The cyclic garbage collector's thresholds set to ``thresholds`` for the block, then restored.

    A long run keeps a large heap (the tokenizer's memo, every request in flight, the spans waiting
    for export) while it allocates a container per chunk, event and span: at the default (700, 10,
    10) the collector walked that heap in about 1,700 collections per 3,000 sessions, a tenth of the
    run's CPU (docs/benchmarks.md).  The cycles it frees are few: the run's peak memory moved by
    less than 2 %, and its spans not at all."""
    saved = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def run(main: Coroutine[Any, Any, Any], *, seed: int = 0) -> Any:
    """Run ``main`` to completion on a fresh :class:`VirtualLoop` with :func:`clocks` and
    :func:`collector` on."""
    loop = VirtualLoop()
    with clocks(loop, seed), collector():
        with asyncio.Runner(loop_factory=lambda: loop) as runner:
            return runner.run(main)
