"""How late an event loop ran: what ``kvtrace bench --arms --clock wall`` prints beside its tables.

On the wall clock the simulated workers sleep their model durations and the bench's client awaits
them; when the machine is busy every wake-up comes late and that lateness lands in every TTFT it
reports.  :class:`Lateness` is a task that sleeps :data:`TICK_S` in a loop on the bench's own loop
and records how late each wake-up is; the workers' loops share the machine, so the same load delays
them alike.  On the virtual clock there is nothing to measure (time jumps to the next event).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

TICK_S = 0.01


@dataclass(frozen=True)
class Summary:
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    def format(self) -> str:
        return (
            f"wall clock: this machine's event loops ran late by p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms, "
            f"max {self.max_ms:.1f} ms ({self.samples} wake-ups of the bench's loop); every simulated time above "
            "includes lateness of this order (--clock virtual has none)"
        )

    def to_dict(self) -> dict:
        return {"samples": self.samples, "p50_ms": self.p50_ms, "p99_ms": self.p99_ms, "max_ms": self.max_ms}


class Lateness:
    """``async with Lateness() as probe: ...`` then ``probe.summary()``."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        self.tick_s = tick_s
        self.late_s: list[float] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.tick_s)
            self.late_s.append(max(0.0, time.perf_counter() - t0 - self.tick_s))

    async def __aenter__(self) -> Lateness:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def summary(self) -> Summary | None:
        return summarise(self.late_s)


def summarise(late_s: list[float]) -> Summary | None:
    """Percentiles (nearest rank) of lateness samples in seconds; None without samples."""
    if not late_s:
        return None
    xs = sorted(late_s)

    def at(q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e3

    return Summary(len(xs), at(0.5), at(0.99), xs[-1] * 1e3)
