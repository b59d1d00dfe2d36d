"""KV cache, holds and cost model of the simulator, with exact numbers."""

from __future__ import annotations

import math

import pytest

from kvtrace import semconv as sc
from kvtrace.sim.costmodel import CostModel
from kvtrace.sim.holds import Hold, Holds
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


def test_holds_expire_on_the_injected_clock():
    now = [100.0]
    released = []
    holds = Holds(lambda: now[0], 1.0, lambda h, reason: released.append((h.internal_id, reason)))
    holds.add(Hold("a", "ra", [1], 16, 110.0, True))
    holds.add(Hold("b", "rb", [2], 16, 130.0, False))
    now[0] = 110.0
    assert holds.sweep() == 1 and released == [("a", sc.RETENTION_EXPIRED)]
    assert holds.pop("b", sc.RETENTION_READ).block_ids == [2]
    assert released[-1] == ("b", sc.RETENTION_READ) and len(holds) == 0
    assert holds.pop("b", sc.RETENTION_READ) is None


def test_cost_model_formulas():
    qwen = CostModel("qwen3-32b", "efa-3200", time_scale=10.0)
    assert qwen.bytes_per_token == 64 * 8 * 128 * 2 * 2
    assert qwen.prefill_s(1000, 4000) == pytest.approx(0.002 + 1000 / 8000 + 6e-12 * 1000 * 4000)
    assert qwen.decode_step_s(8192) == pytest.approx(0.020 + 8192 * 262_144 / 3.35e12)
    nbytes = 20 * 16 * 262_144
    assert qwen.transfer_s(nbytes) == pytest.approx(0.001 + nbytes / 400e9)
    assert qwen.wall(1.0) == pytest.approx(0.1)
    assert CostModel("glm5-fp8", "tcp-100").transfer_s(51_168) == pytest.approx(0.005 + 51_168 / 12.5e9)
    assert CostModel("glm5-fp8").bytes_per_token == 78 * 656
    off = CostModel(enabled=False)
    assert (off.prefill_s(10, 10), off.decode_step_s(10), off.transfer_s(10)) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="unknown preset"):
        CostModel("llama")
    with pytest.raises(ValueError, match="unknown link"):
        CostModel(link="carrier-pigeon")
    assert math.isclose(qwen.decode_step_s(0) * 2, qwen.decode_step_s(0) + 0.020)
