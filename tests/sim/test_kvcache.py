"""The simulator's KV cache, with exact numbers: chained block hashes, a hit capped below the
prompt length, LRU eviction order and pinned blocks."""

from __future__ import annotations

import pytest

from kvtrace.sim.kvcache import KVCache, NoSpace, block_hashes


def test_block_hashes_chain_and_prefix():
    a = block_hashes(list(range(40)), 16)
    b = block_hashes(list(range(32)) + [99] * 8, 16)
    assert len(a) == 2 and a == b  # 8-token tail is not a full block
    assert block_hashes([5] * 16 + list(range(16)), 16)[1] != block_hashes([6] * 16 + list(range(16)), 16)[1]


def test_lookup_caps_hit_below_prompt_length():
    cache = KVCache(8, 16)
    tokens = list(range(32))
    hashes = block_hashes(tokens, 16)
    blocks = cache.allocate(2)
    cache.commit(blocks, hashes)
    cache.free(blocks)
    assert cache.lookup(hashes, 32) == blocks[:1]  # (32 - 1) // 16 = 1: the last token is recomputed
    assert cache.lookup(hashes, 33) == blocks


def test_lru_eviction_order_and_pinning():
    cache = KVCache(4, 2)
    first = cache.allocate(2)
    cache.commit(first, [11, 12])
    second = cache.allocate(2)
    cache.commit(second, [21, 22])
    cache.free(first)  # evictable, oldest
    cache.touch(second)  # pinned twice
    cache.free(second)
    assert (cache.num_used, cache.num_free, cache.num_cached) == (2, 2, 4)
    got = cache.allocate(2)
    assert got == first and cache.evictions == 2 and cache.num_cached == 2
    with pytest.raises(NoSpace):
        cache.allocate(1)
    cache.free(second)
    assert cache.allocate(1) == [second[0]] and cache.evictions == 3
    with pytest.raises(ValueError):
        cache.free(first + first)
