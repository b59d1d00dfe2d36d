"""The conversation table: conversation id -> where D's blocks from the last turn live.

The request handler (:mod:`kvtrace.proxy.app`) calls :meth:`ConversationTable.begin` when a turn
arrives, which assigns the turn index and takes (removes) the cached entry, and then exactly one
of :meth:`Turn.consumed` (P answered: it used or declined the blocks) or :meth:`Turn.restore`
(P never got to use them: unreachable, 5xx, 4xx) — so a failed turn does not forget the location.
When D's leg finishes, :meth:`ConversationTable.store` records D's new ``kv_transfer_params``.

Concurrency: everything runs on the proxy's event loop and no method awaits, so each call is
atomic.  Turns of one conversation are ordered by their turn index: a slow older turn never
overwrites the entry stored by a newer one, a restore never overwrites a newer entry, and only
one of two concurrent turns is offered the same blocks (D's blocks are single use).

Bounds: at most ``max_entries`` conversations (least recently used evicted) and entries older than
``ttl_s`` (``decoder_kv_blocks_ttl`` minus a margin) are not offered.  Each entry remembers which
D worker holds the blocks, so the table stays correct with many P and D workers.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from kvtrace import semconv as sc


@dataclass
class Entry:
    params: dict  # D's kv_transfer_params (remote_host already set to D's host)
    decode_endpoint: str
    stored_at: float
    turn: int  # turn index that produced it


@dataclass
class _Conversation:
    next_turn: int = 0
    entry: Entry | None = None


@dataclass
class Turn:
    """One turn's view of the table: its index and the offer decision."""

    table: "ConversationTable"
    key: str | None
    index: int | None
    offered: bool
    reason: str
    entry: Entry | None = None
    entry_age_s: float | None = None
    _settled: bool = False

    def consumed(self) -> None:
        """P answered: the taken entry is spent (P pulled it or declined it)."""
        self._settled = True

    def restore(self) -> None:
        """P never used the entry: put it back unless something newer arrived meanwhile."""
        if self._settled or self.entry is None or self.key is None:
            return
        self._settled = True
        self.table._put_back(self.key, self.entry)


class ConversationTable:
    def __init__(
        self, ttl_s: float, max_entries: int = 100_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = float(ttl_s)
        self.max_entries = int(max_entries)
        self.clock = clock
        self._convs: OrderedDict[str, _Conversation] = OrderedDict()

    def __len__(self) -> int:
        return sum(1 for c in self._convs.values() if c.entry is not None)

    def begin(self, key: str | None) -> Turn:
        """A turn of conversation ``key`` arrived: assign its index, take the entry if usable."""
        if not key:
            return Turn(self, None, None, False, sc.OFFER_NO_CONVERSATION_ID)
        conv = self._touch(key)
        index = conv.next_turn
        conv.next_turn += 1
        entry, conv.entry = conv.entry, None
        if entry is None:
            return Turn(self, key, index, False, sc.OFFER_NO_ENTRY)
        age = self.clock() - entry.stored_at
        if age > self.ttl_s:
            return Turn(self, key, index, False, sc.OFFER_ENTRY_TOO_OLD, entry_age_s=age)
        return Turn(self, key, index, True, sc.OFFER_OFFERED, entry=entry, entry_age_s=age)

    def store(self, key: str | None, turn: int | None, params: dict, decode_endpoint: str) -> bool:
        """D finished turn ``turn`` and returned ``params``; keep them unless a newer turn did."""
        if not key or turn is None:
            return False
        conv = self._touch(key)
        if conv.entry is not None and conv.entry.turn > turn:
            return False
        conv.entry = Entry(dict(params), decode_endpoint, self.clock(), turn)
        return True

    def peek(self, key: str) -> Entry | None:
        conv = self._convs.get(key)
        return conv.entry if conv else None

    def evict_stale(self) -> int:
        """Drop entries past the age limit (``/health`` calls this, as upstream). Returns the count."""
        now, n = self.clock(), 0
        for conv in self._convs.values():
            if conv.entry is not None and now - conv.entry.stored_at > self.ttl_s:
                conv.entry, n = None, n + 1
        return n

    def _put_back(self, key: str, entry: Entry) -> None:
        conv = self._touch(key)
        if conv.entry is None or conv.entry.turn < entry.turn:
            conv.entry = entry

    def _touch(self, key: str) -> _Conversation:
        conv = self._convs.get(key)
        if conv is None:
            conv = self._convs[key] = _Conversation()
            while len(self._convs) > self.max_entries:
                self._convs.popitem(last=False)
        else:
            self._convs.move_to_end(key)
        return conv
