"""Blocks a worker keeps after a request finished: P's lease and D's retention.

vLLM (``pull_scheduler.request_finished``) delays freeing a finished request's blocks when a
peer will read them: on P for ``kv_lease_duration`` (until D has pulled the prompt), on D with
``bidirectional_kv_xfer`` for ``decoder_kv_blocks_ttl`` (until the next turn's P pulls them).
The reader's notification frees them early.  :class:`Holds` keeps one entry per request with
its own ``loop.call_later`` timer, so blocks are released on time even with no traffic.

P's lease is renewed by D's heartbeats (``base_scheduler.on_new_request`` tracks a request with
``do_remote_prefill`` from its arrival on D until its load finished; the worker extends the lease
to now + 2/3 of ``kv_lease_duration`` on each, every ``kv_lease_duration // 6`` s): while a reader
heartbeats (:meth:`Holds.start_renewal` .. :meth:`Holds.stop_renewal`) the hold does not expire, and
it expires 2/3 of the lease after the last one.  D's retention is not renewed (a plain TTL).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from kvtrace import semconv as sc


@dataclass
class Hold:
    internal_id: str  # vLLM request id sent as remote_request_id
    record_id: str  # KVRecorder request id (retention spans on D)
    block_ids: list[int]
    num_tokens: int
    deadline: float  # simulated clock
    retained: bool  # True: D retention (spans), False: P lease
    timer: asyncio.TimerHandle | None = None
    renewing: int = 0  # readers heartbeating it (the hold cannot expire meanwhile)


class Holds:
    """internal request id -> :class:`Hold`; ``on_release(hold, reason)`` frees the blocks."""

    def __init__(self, clock: Callable[[], float], time_scale: float, on_release: Callable[[Hold, str], None]) -> None:
        self._clock = clock
        self._scale = time_scale
        self._on_release = on_release
        self._holds: dict[str, Hold] = {}
        self.changes = 0  # holds added and released

    def __len__(self) -> int:
        return len(self._holds)

    def __contains__(self, internal_id: str) -> bool:
        return internal_id in self._holds

    def get(self, internal_id: str) -> Hold | None:
        return self._holds.get(internal_id)

    def values(self) -> list[Hold]:
        return list(self._holds.values())

    def add(self, hold: Hold) -> None:
        old = self._holds.pop(hold.internal_id, None)
        if old is not None:
            self._release(old, sc.RETENTION_RELEASED)
        self._holds[hold.internal_id] = hold
        self.changes += 1
        self._arm(hold)

    def pop(self, internal_id: str, reason: str) -> Hold | None:
        """Release ``internal_id`` now (``read``, ``released``); None if not held."""
        hold = self._holds.pop(internal_id, None)
        if hold is not None:
            self._release(hold, reason)
        return hold

    def start_renewal(self, internal_id: str) -> None:
        """A reader starts heartbeating the hold (no-op when it is not held)."""
        hold = self._holds.get(internal_id)
        if hold is not None:
            hold.renewing += 1

    def stop_renewal(self, internal_id: str, extension_s: float) -> None:
        """The reader's heartbeats stop: the last one leaves ``extension_s`` before expiry."""
        hold = self._holds.get(internal_id)
        if hold is None or hold.renewing == 0:
            return
        hold.renewing -= 1
        hold.deadline = max(hold.deadline, self._clock() + extension_s)
        if hold.renewing == 0:
            if hold.timer is not None:
                hold.timer.cancel()
            self._arm(hold)

    def sweep(self) -> int:
        """Release every hold whose deadline has passed on the simulated clock (``expired``)."""
        now = self._clock()
        due = [h for h in self._holds.values() if h.deadline <= now and not h.renewing]
        for hold in due:
            self.pop(hold.internal_id, sc.RETENTION_EXPIRED)
        return len(due)

    def release_all(self, reason: str = sc.RETENTION_RELEASED) -> None:
        for internal_id in list(self._holds):
            self.pop(internal_id, reason)

    def _arm(self, hold: Hold) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (unit tests drive sweep() by hand)
        delay = max(0.0, (hold.deadline - self._clock()) / self._scale)
        hold.timer = loop.call_later(delay, self._fire, hold.internal_id)

    def _fire(self, internal_id: str) -> None:
        hold = self._holds.get(internal_id)
        if hold is None or hold.renewing:
            return  # heartbeats keep it; stop_renewal arms the timer again
        if hold.deadline <= self._clock():
            self.pop(internal_id, sc.RETENTION_EXPIRED)
        else:  # injected clock not there yet: look again when it could be
            self._arm(hold)

    def _release(self, hold: Hold, reason: str) -> None:
        self.changes += 1
        if hold.timer is not None:
            hold.timer.cancel()
            hold.timer = None
        self._on_release(hold, reason)
