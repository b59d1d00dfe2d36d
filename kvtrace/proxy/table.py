"""The conversation table: conversation id -> where D's blocks from the last turn live.

The request handler (:mod:`kvtrace.proxy.app`) calls :meth:`ConversationTable.begin` when a turn
arrives, which assigns the turn index and takes (removes) the cached entry (a turn whose prompt
does not extend what D holds, or whose entry is of another turn than the one the prefix table
checked it against, is not offered it and the entry is dropped: :mod:`.prefix_table`), and then exactly one
of :meth:`Turn.consumed` (P answered: it used or declined the blocks) or :meth:`Turn.restore`
(P never got to use them: unreachable, 5xx, 4xx, the client left) — so a failed turn does not
forget the location.  When D's leg finishes, :meth:`ConversationTable.store` records D's new
``kv_transfer_params``.

Concurrency: everything runs on the proxy's event loop and no method awaits, so each call is
atomic.  Turns of one conversation are ordered by their turn index: a slow older turn never
stores its entry once a newer one stored (even after that newer entry was taken), a restore
never overwrites a newer entry, and only one of two concurrent turns is offered the same blocks
(D's blocks are single use).  The prefix table orders its records by the same index.

Bounds: at most ``max_entries`` conversations and about ``max_bytes`` bytes (the least recently
used conversations go first; both counted in :attr:`evicted_lru`; ``on_evict(key)`` tells the
prefix table, which forgets the session with it).  An entry keeps D's params as
their JSON bytes (what they cost is what is counted, and they take a fraction of a dict's memory);
a conversation costs :data:`CONV_OVERHEAD` plus its key, an entry :data:`ENTRY_OVERHEAD` plus its
JSON.  Entries older than ``ttl_s`` (``decoder_kv_blocks_ttl`` minus a margin) are not offered and
are dropped a few at a time, oldest first, by each :meth:`store` and :meth:`health`
(:attr:`evicted_stale`), so no call scans the table: :meth:`health` is O(1).  Each entry remembers
which D worker holds the blocks, so the table stays correct with many P and D workers.
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from kvtrace import jsoncodec as codec
from kvtrace import semconv as sc

# tracemalloc on CPython 3.11 measured 114 B per conversation and 187 B per entry (plus the key's
# sys.getsizeof and the JSON); rounded up to leave room for the dicts' spare slots
CONV_OVERHEAD = 150  # a conversation: its OrderedDict entry and _Conversation
ENTRY_OVERHEAD = 250  # an entry: Entry, its bytes object, its age-queue slot
SWEEP_PER_CALL = 64  # stale entries dropped at most per store() / health()


@dataclass(slots=True)
class Entry:
    raw: bytes  # D's kv_transfer_params, codec.pack()ed JSON (remote_host already set to D's host)
    decode_endpoint: str
    stored_at: float
    turn: int  # turn index that produced it

    @property
    def params(self) -> dict:
        return cast(dict, codec.unpack(self.raw))  # store() packed a dict

    @property
    def nbytes(self) -> int:
        return ENTRY_OVERHEAD + len(self.raw)


@dataclass(slots=True)
class _Conversation:
    next_turn: int = 0
    entry: Entry | None = None
    stored: int = -1  # the newest turn whose entry was stored (taken or not)


@dataclass
class Turn:
    """One turn's view of the table: its index and the offer decision (``params``: the offered
    entry's params, decoded once)."""

    table: ConversationTable
    key: str | None
    index: int | None
    offered: bool
    reason: str
    entry: Entry | None = None
    entry_age_s: float | None = None
    params: dict | None = None
    dropped_tokens: int | None = None  # diverged: the tokens D held (remote_num_tokens of the dropped entry)
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
        self,
        ttl_s: float,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
        max_bytes: int = 256 * 1024 * 1024,
        on_evict: Callable[[str], None] | None = None,
    ) -> None:
        self.on_evict = on_evict
        self.ttl_s = float(ttl_s)
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self.clock = clock
        self._convs: OrderedDict[str, _Conversation] = OrderedDict()
        self._by_age: OrderedDict[str, None] = OrderedDict()  # keys holding an entry, oldest store first
        self.nbytes = 0
        self.evicted_lru = 0
        self.evicted_stale = 0

    def __len__(self) -> int:
        """Conversations holding an entry."""
        return len(self._by_age)

    @staticmethod
    def key_bytes(key: str) -> int:
        return CONV_OVERHEAD + sys.getsizeof(key)

    def health(self) -> dict:
        """Counters for ``/health`` (drops a few stale entries first; never scans the table)."""
        self._sweep()
        return {
            "cached_conversations": len(self._by_age),
            "conversations": len(self._convs),
            "table_bytes": self.nbytes,
            "evicted_stale": self.evicted_stale,
            "evicted_lru": self.evicted_lru,
        }

    def begin(
        self,
        key: str | None,
        refuse: str | None = None,
        checked: bool = False,
        history: int | None = None,
        down: Callable[[str], bool] | None = None,
    ) -> Turn:
        """A turn of conversation ``key`` arrived: assign its index, take the entry if usable.
        ``refuse``: why the turn's prompt does not extend what D holds (sc.OFFER_DIVERGED,
        OFFER_REUSED_ID, OFFER_HISTORY_UNKNOWN); a usable entry is dropped, not offered (P would
        read KV of other tokens).  ``checked``: the prompt was checked against the record of turn
        ``history`` (None: no record); an entry of any other turn is not offered either.  ``down``:
        whether a D (base URL) is out of the routing; its blocks are not offered (OFFER_HOLDER_DOWN)."""
        if not key:
            return Turn(self, None, None, False, sc.OFFER_NO_CONVERSATION_ID)
        conv = self._touch(key)
        index = conv.next_turn
        conv.next_turn += 1
        entry = self._take(key, conv)
        if entry is None:
            return Turn(self, key, index, False, sc.OFFER_NO_ENTRY)
        age = self.clock() - entry.stored_at
        if age > self.ttl_s:
            return Turn(self, key, index, False, sc.OFFER_ENTRY_TOO_OLD, entry_age_s=age)
        if refuse is None and checked and entry.turn != history:
            refuse = sc.OFFER_HISTORY_UNKNOWN  # D's blocks are not of the turn the prompt was checked against
        if refuse is None and down is not None and down(entry.decode_endpoint):
            refuse = sc.OFFER_HOLDER_DOWN  # P's pull would wait on a worker that does not answer
        if refuse == sc.OFFER_DIVERGED:
            held = entry.params.get("remote_num_tokens")
            held = held if isinstance(held, int) and not isinstance(held, bool) else None
            return Turn(self, key, index, False, refuse, entry_age_s=age, dropped_tokens=held)
        if refuse is not None:
            return Turn(self, key, index, False, refuse, entry_age_s=age)
        return Turn(self, key, index, True, sc.OFFER_OFFERED, entry=entry, entry_age_s=age, params=entry.params)

    def store(self, key: str | None, turn: int | None, params: dict, decode_endpoint: str) -> bool:
        """D finished turn ``turn`` and returned ``params``; keep them unless a newer turn did
        (or they alone exceed the byte bound)."""
        if not key or turn is None:
            return False
        self._sweep()
        conv = self._touch(key)
        if turn < conv.stored:
            return False
        conv.stored = turn
        return self._set(key, conv, Entry(codec.pack(params), decode_endpoint, self.clock(), turn))

    def drop(self, key: str) -> None:
        """Drop conversation ``key``'s entry (the prefix table evicted its record); its turn
        numbering goes on."""
        conv = self._convs.get(key)
        if conv is not None:
            self._take(key, conv)

    def peek(self, key: str) -> Entry | None:
        conv = self._convs.get(key)
        return conv.entry if conv else None

    # ------------------------------------------------------------------ internals
    def _set(self, key: str, conv: _Conversation, entry: Entry) -> bool:
        if entry.nbytes + self.key_bytes(key) > self.max_bytes:
            self.evicted_lru += 1
            return False
        self._take(key, conv)
        conv.entry = entry
        self._by_age[key] = None
        self.nbytes += entry.nbytes
        self._bound()
        return True

    def _take(self, key: str, conv: _Conversation) -> Entry | None:
        entry, conv.entry = conv.entry, None
        if entry is not None:
            del self._by_age[key]
            self.nbytes -= entry.nbytes
        return entry

    def _put_back(self, key: str, entry: Entry) -> None:
        conv = self._touch(key)
        if conv.entry is None and conv.stored <= entry.turn:  # nothing newer was stored meanwhile
            self._set(key, conv, entry)

    def _touch(self, key: str) -> _Conversation:
        conv = self._convs.get(key)
        if conv is None:
            conv = self._convs[key] = _Conversation()
            self.nbytes += self.key_bytes(key)
            self._bound()
        else:
            self._convs.move_to_end(key)
        return conv

    def _bound(self) -> None:
        """Evict least recently used conversations until both bounds hold (never the newest)."""
        convs = self._convs
        while (len(convs) > self.max_entries or self.nbytes > self.max_bytes) and len(convs) > 1:
            key, conv = convs.popitem(last=False)
            self._take(key, conv)
            self.nbytes -= self.key_bytes(key)
            self.evicted_lru += 1
            if self.on_evict is not None:
                self.on_evict(key)

    def _sweep(self) -> None:
        """Drop up to :data:`SWEEP_PER_CALL` entries past the age limit, oldest first."""
        if not self._by_age:
            return
        limit = self.clock() - self.ttl_s
        for _ in range(SWEEP_PER_CALL):
            key = next(iter(self._by_age), None)
            if key is None:
                return
            conv = self._convs[key]
            assert conv.entry is not None  # a key in _by_age holds an entry
            if conv.entry.stored_at >= limit:
                return
            self._take(key, conv)
            self.evicted_stale += 1
