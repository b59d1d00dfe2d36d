"""Paged KV cache of one simulated worker: blocks, prefix cache, LRU eviction, pinning.

Modelled on vLLM's v1 KV cache manager (one KV-cache group):

- ``capacity`` physical blocks of ``block_size`` tokens, ids ``0..capacity-1``;
- a *full* block gets a content hash chained on its parent's hash
  (``hash((parent_hash, tokens_of_block))``), so equal prefixes give equal hashes;
- :meth:`lookup` walks a prompt's block hashes through the prefix cache; like vLLM the hit is
  capped so the last prompt token is always computed (``max hit = (n - 1) // block_size``);
- every block has a reference count; a request's block table, P's lease and D's retention each
  hold one reference (pinning).  A block whose count drops to 0 stays cached and evictable,
  least recently freed first; a block without a hash goes back to the free list.

Allocation takes never-used/free blocks first, then evicts cached unreferenced blocks in LRU
order; it raises :class:`NoSpace` when referenced blocks leave too few.

:class:`PyKVCache` and :func:`py_block_hashes` are the reference; :class:`KVCache` and
:func:`block_hashes` are the same in C (``kvtrace/sim/_ckv.c``, the same ids, order and errors)
where the extension was built, else these (:data:`IMPLEMENTATION` says which).  The C pool takes
hashes that are 64-bit ints (what :func:`block_hashes` makes; its prefix cache is a table of them in C
arrays), and refuses others with ``TypeError`` / ``OverflowError``.

:class:`BlockQueue` is the scheduler's waiting queue in front of the pool (vLLM 0.32/0.33
``v1/core/sched/scheduler.py``): requests are admitted in arrival order, and when the head's
``allocate_slots`` returns None the scheduler stops admitting (``break``), so the head waits and
everyone behind it waits too, until blocks come back: a request finishing, or a hold ending (a
peer's read or notification, or the TTL reaped by the worker's ``_reap_expired_send_leases``).
"""

from __future__ import annotations

import asyncio
import itertools
import operator
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from kvtrace import semconv as sc


class NoSpace(Exception):
    """Not enough free or evictable blocks."""


def py_block_hashes(tokens: Iterable[int], block_size: int, parent: int = 0) -> list[int]:
    """Chained content hashes of the full blocks of ``tokens`` (``parent``: the hash of the block
    before them, to go on from a prefix whose hashes are known)."""
    out: list[int] = []
    it = iter(tokens)
    for block in zip(*[it] * block_size, strict=False):  # the full blocks' tuples, made in C; no partial one
        parent = hash((parent, block))
        out.append(parent)
    return out


class PyKVCache:
    """Block pool + prefix cache of one worker.  Not thread-safe (one asyncio loop)."""

    def __init__(self, capacity: int, block_size: int) -> None:
        if capacity <= 0 or block_size <= 0:
            raise ValueError("capacity and block_size must be positive")
        self.capacity = capacity
        self.block_size = block_size
        self._ref = [0] * capacity
        self._hash: list[int | None] = [None] * capacity
        self._free: list[int] = list(range(capacity - 1, -1, -1))  # pop() gives 0, 1, 2, ...
        self._cached: dict[int, int] = {}  # block hash -> block id
        self._lru: OrderedDict[int, None] = OrderedDict()  # unreferenced cached blocks
        self.evictions = 0

    # ------------------------------------------------------------------ queries
    def lookup(self, hashes: list[int], num_tokens: int) -> list[int]:
        """Block ids of the longest cached prefix of ``hashes`` (capped at (n-1)//bs)."""
        limit = min(len(hashes), max(0, (num_tokens - 1) // self.block_size))
        hit: list[int] = []
        for h in hashes[:limit]:
            bid = self._cached.get(h)
            if bid is None:
                break
            hit.append(bid)
        return hit

    @property
    def num_free(self) -> int:
        """Blocks available to a new allocation (free + evictable)."""
        return len(self._free) + len(self._lru)

    @property
    def num_used(self) -> int:
        """Blocks held by at least one reference."""
        return self.capacity - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def is_cached(self, block_id: int) -> bool:
        h = self._hash[block_id]
        return h is not None and self._cached.get(h) == block_id

    def refcount(self, block_id: int) -> int:
        return self._ref[block_id]

    def refcounts(self, block_ids: Iterable[int]) -> Iterator[int]:
        """:meth:`refcount` of each block, lazily (no Python call per block)."""
        return map(self._ref.__getitem__, block_ids)

    def held_only(self, lists: Sequence[Sequence[int]]) -> int:
        """How many distinct blocks are referenced exactly as often as they appear in ``lists`` (each a
        hold's block ids): the blocks that ending every hold would free."""
        counts = Counter(itertools.chain.from_iterable(lists))
        return sum(map(operator.eq, self.refcounts(counts.keys()), counts.values()))

    # ------------------------------------------------------------------ mutation
    def touch(self, block_ids: list[int]) -> None:
        """Take one more reference on existing blocks (a prefix hit, a pin)."""
        for bid in block_ids:
            if self._ref[bid] == 0:
                self._lru.pop(bid, None)
            self._ref[bid] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` new blocks with one reference each, evicting LRU cached blocks if needed."""
        if n > self.num_free:
            raise NoSpace(f"need {n} blocks, {self.num_free} free or evictable of {self.capacity}")
        out: list[int] = []
        for _ in range(n):
            if self._free:
                bid = self._free.pop()
            else:
                bid, _ = self._lru.popitem(last=False)
                self._uncache(bid)
                self.evictions += 1
            self._ref[bid] = 1
            out.append(bid)
        return out

    def commit(self, block_ids: list[int], hashes: list[int]) -> None:
        """Publish full blocks in the prefix cache (``hashes[i]`` is block ``block_ids[i]``'s).
        A hash already cached under another block keeps the existing entry."""
        for bid, h in zip(block_ids, hashes, strict=True):
            if self._hash[bid] is not None:
                continue
            if h in self._cached:
                continue
            self._hash[bid] = h
            self._cached[h] = bid

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference per block; unreferenced blocks become evictable (or free)."""
        for bid in block_ids:
            ref = self._ref[bid] - 1
            if ref < 0:
                raise ValueError(f"block {bid} freed more often than referenced")
            self._ref[bid] = ref
            if ref == 0:
                if self.is_cached(bid):
                    self._lru[bid] = None
                else:
                    self._hash[bid] = None
                    self._free.append(bid)

    def _uncache(self, bid: int) -> None:
        h = self._hash[bid]
        if h is not None and self._cached.get(h) == bid:
            del self._cached[h]
        self._hash[bid] = None


try:  # the same pool and hashes in C (kvtrace/sim/_ckv.c), where the extension was built
    from kvtrace.sim import _ckv
except ImportError:  # pragma: no cover - a build without a compiler
    _ckv = None  # type: ignore[assignment]

if _ckv is not None:
    _ckv.set_errors(NoSpace)
    KVCache: type[PyKVCache] = _ckv.KVCache  # type: ignore[assignment]
    block_hashes = _ckv.block_hashes
else:  # pragma: no cover
    KVCache = PyKVCache
    block_hashes = py_block_hashes
#: which implementation :class:`KVCache` and :func:`block_hashes` are: "c" or "python"
IMPLEMENTATION = "python" if _ckv is None else "c"


@dataclass
class Wait:
    """How one request waited for blocks (times on the engine's clock)."""

    start: float
    reason: str  # sc.QUEUE_REASONS
    needed: int  # new blocks it needed
    free: int  # free + evictable blocks when it began waiting
    held: int  # blocks held only for a remote reader then
    end: float = 0.0
    freed_by: str | None = None  # sc.QUEUE_FREED_BY: what last returned blocks before it got in


class BlockQueue:
    """FCFS admission to a :class:`KVCache`: only the head of the queue allocates.

    ``held()`` counts the blocks that only holds for remote readers keep referenced (what
    releasing every hold would return); the engine calls :meth:`released` whenever blocks go
    back to the pool."""

    def __init__(self, cache: KVCache, clock: Callable[[], float], held: Callable[[], int]) -> None:
        self.cache = cache
        self._clock = clock
        self._held = held
        self._waiters: deque[tuple[asyncio.Event, Wait]] = deque()
        self.changes = 0  # references taken (admissions) and given back (released): the pool's counts moved

    def __len__(self) -> int:
        return len(self._waiters)

    async def admit(
        self, hashes: list[int], n_tokens: int, total: int, lookup: bool, on_wait: Callable[[Wait], None]
    ) -> tuple[list[int], list[int]]:
        """``(hit, blocks)``: the prefix-hit blocks and all ``total`` blocks of the request (hit
        first).  A request that had to wait is told ``on_wait(wait)`` once it got in, or once it
        was cancelled while waiting (then ``freed_by`` is None unless blocks came back meanwhile)."""
        hit, need, free = self._shortfall(hashes, n_tokens, total, lookup)
        if need <= free and not self._waiters:
            return self._allocate(hit, total)
        held = self._held()
        reason = sc.QUEUE_FCFS if need <= free else sc.QUEUE_KV_HELD if need <= free + held else sc.QUEUE_KV_IN_USE
        wait = Wait(self._clock(), reason, need, free, held)
        me = (asyncio.Event(), wait)
        self._waiters.append(me)
        try:
            while True:
                if self._waiters[0] is me:
                    hit, need, free = self._shortfall(hashes, n_tokens, total, lookup)
                    if need <= free:  # no await since the lookup: the hit still holds
                        return self._allocate(hit, total)
                me[0].clear()
                await me[0].wait()
        finally:
            self._waiters.remove(me)
            self._wake()  # the next one may fit too (or is the head now)
            wait.end = self._clock()
            on_wait(wait)

    def released(self, reason: str) -> None:
        """Blocks went back to the pool (``reason``: sc.QUEUE_FREED_BY): the head tries again."""
        self.changes += 1
        for _, wait in self._waiters:
            wait.freed_by = reason
        self._wake()

    def _wake(self) -> None:
        if self._waiters:
            self._waiters[0][0].set()

    def _shortfall(self, hashes: list[int], n_tokens: int, total: int, lookup: bool) -> tuple[list[int], int, int]:
        """(the prefix hit, new blocks needed, blocks free or evictable besides the hit's own): it
        fits when needed <= free."""
        hit = self.cache.lookup(hashes, n_tokens) if lookup else []
        evictable_hit = operator.countOf(self.cache.refcounts(hit), 0)
        return hit, total - len(hit), self.cache.num_free - evictable_hit

    def _allocate(self, hit: list[int], total: int) -> tuple[list[int], list[int]]:
        self.changes += 1
        self.cache.touch(hit)
        return hit, hit + self.cache.allocate(total - len(hit))
