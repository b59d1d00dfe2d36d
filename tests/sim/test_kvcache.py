"""The simulator's KV cache, with exact numbers: chained block hashes, a hit capped below the
prompt length, LRU eviction order and pinned blocks.  Every test runs on both implementations: the
C one (``kvtrace.sim._ckv``, what an install with a compiler uses) and the Python reference
(``PyKVCache``, ``py_block_hashes``); random operation sequences compare them step by step."""

from __future__ import annotations

import random

import pytest

from kvtrace.sim import kvcache
from kvtrace.sim.kvcache import NoSpace, PyKVCache, py_block_hashes


def _c():
    from support.require import require_vllm

    # the README's test command (KVTRACE_REQUIRE_VLLM=1) builds the extension: fail there, skip elsewhere
    return require_vllm("kvtrace.sim._ckv")


@pytest.fixture(params=["c", "python"])
def impl(request):
    """(KVCache class, block_hashes) of one implementation."""
    if request.param == "c":
        ckv = _c()
        return ckv.KVCache, ckv.block_hashes
    return PyKVCache, py_block_hashes


def test_block_hashes_chain_and_prefix(impl):
    _, block_hashes = impl
    a = block_hashes(list(range(40)), 16)
    b = block_hashes(list(range(32)) + [99] * 8, 16)
    assert len(a) == 2 and a == b  # 8-token tail is not a full block
    assert block_hashes([5] * 16 + list(range(16)), 16)[1] != block_hashes([6] * 16 + list(range(16)), 16)[1]
    assert a == [hash((0, tuple(range(16)))), hash((a[0], tuple(range(16, 32))))]
    assert block_hashes(iter(range(16, 40)), 16, a[0]) == a[1:]  # any iterable, from a known parent


def test_c_block_hashes_are_pythons_tuple_hashes_either_way():
    """_ckv mixes the items' hashes as CPython's tuple hash does (checked at import), or builds the
    tuples where an interpreter hashes them otherwise: the same hashes, any ints, any parent."""
    ckv = _c()
    rng = random.Random(7)
    tokens = [rng.randrange(-(10**20), 10**20) for _ in range(160)] + [rng.randrange(100_000) for _ in range(800)]
    tokens += [-1, -2, 0, 2**61 - 1, 2**61, -(2**63)] * 16
    assert ckv.tuple_hash_is_own()  # the import-time check passed on this interpreter
    try:
        for own in (True, False):
            assert ckv.set_tuple_hash(own) is own
            for parent in (0, -1, 2**64 + 5, "p", (1, 2)):
                assert ckv.block_hashes(tokens, 16, parent) == py_block_hashes(tokens, 16, parent), (own, parent)
            assert ckv.block_hashes(tokens, 7) == py_block_hashes(tokens, 7)
            with pytest.raises(TypeError):
                ckv.block_hashes([[1]] * 16, 16)  # an unhashable token, as hash() says
    finally:
        ckv.set_tuple_hash(True)


def test_lookup_caps_hit_below_prompt_length(impl):
    KVCache, block_hashes = impl
    cache = KVCache(8, 16)
    tokens = list(range(32))
    hashes = block_hashes(tokens, 16)
    blocks = cache.allocate(2)
    cache.commit(blocks, hashes)
    cache.free(blocks)
    assert cache.lookup(hashes, 32) == blocks[:1]  # (32 - 1) // 16 = 1: the last token is recomputed
    assert cache.lookup(hashes, 33) == blocks
    assert cache.lookup(hashes, 0) == [] and cache.lookup(hashes, 1) == []


def test_lru_eviction_order_and_pinning(impl):
    KVCache, _ = impl
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
    with pytest.raises(NoSpace, match=r"^need 1 blocks, 0 free or evictable of 4$"):
        cache.allocate(1)
    cache.free(second)
    assert cache.allocate(1) == [second[0]] and cache.evictions == 3
    with pytest.raises(ValueError, match=r"^block \d freed more often than referenced$"):
        cache.free(first + first)


def test_errors_name_what_is_wrong(impl):
    KVCache, _ = impl
    with pytest.raises(ValueError, match="capacity and block_size must be positive"):
        KVCache(0, 16)
    cache = KVCache(4, 2)
    with pytest.raises(IndexError):
        cache.refcount(4)
    with pytest.raises(ValueError, match=r"zip\(\) argument 2 is shorter than argument 1"):
        cache.commit(cache.allocate(2), [7])
    assert cache.is_cached(0) and not cache.is_cached(1)  # the pair before the mismatch is published
    assert list(cache.refcounts([0, 1, 2])) == [1, 1, 0]
    with pytest.raises(IndexError):
        cache.held_only([[0], [4]])
    with pytest.raises(TypeError):
        cache.held_only([0])


def _step(rng: random.Random, cache, held: list[list[int]], log: list, keys: list[int]):
    """One random operation on ``cache`` (hashes drawn from ``keys``); what it returned (or raised)
    goes to ``log``."""
    op = rng.choice(["alloc", "alloc", "commit", "free", "touch", "lookup", "free_twice"])
    try:
        if op == "alloc":
            ids = cache.allocate(rng.randint(0, 5))
            held.append(ids)
            log.append(("alloc", ids))
        elif op == "commit" and held:
            ids = rng.choice(held)
            cache.commit(ids, [rng.choice(keys) for _ in ids])
            log.append(("commit",))
        elif op in ("free", "free_twice") and held:
            ids = held.pop(rng.randrange(len(held)))
            cache.free(ids + ids if op == "free_twice" else ids)
            log.append((op,))
        elif op == "touch" and held:
            ids = rng.choice(held)
            cache.touch(ids)
            held.append(list(ids))
            log.append(("touch",))
        elif op == "lookup":
            log.append(("lookup", cache.lookup([rng.choice(keys) for _ in range(4)], rng.randint(0, 80))))
    except (NoSpace, ValueError) as exc:
        log.append((type(exc).__name__, str(exc)))
    log.append((cache.num_free, cache.num_used, cache.num_cached, cache.evictions))
    log.append([cache.is_cached(b) for b in range(cache.capacity)])
    log.append(list(cache.refcounts(range(cache.capacity))))
    # the blocks only some of the references keep (every other list; a list twice)
    log.append((cache.held_only(held[::2]), cache.held_only(held[1::2] + held[:1]), cache.held_only(held)))


@pytest.mark.parametrize("wide", [False, True], ids=["small-hashes", "64-bit-hashes"])
def test_random_operations_give_the_same_results_in_c_and_python(wide):
    # 64-bit: any value a hash can take, the extremes included, in a pool small enough to repeat
    # (the C table's probe chains, their wrap past its end and deletions inside them)
    ckv = _c()
    for seed in range(40):
        draw = random.Random(f"keys-{seed}")
        extremes = [-(2**63), 2**63 - 1, -1, 0]
        keys = extremes + [draw.getrandbits(64) - 2**63 for _ in range(20)] if wide else list(range(12))
        logs = []
        for cls in (ckv.KVCache, PyKVCache):
            rng, cache, held, log = random.Random(seed), cls(16, 4), [], []
            for _ in range(300):
                _step(rng, cache, held, log, keys)
            logs.append(log)
        assert logs[0] == logs[1], seed


def test_the_c_pool_takes_64_bit_int_hashes_only():
    """block_hashes makes nothing else; anything else is refused, and the pairs before it are kept."""
    cache = _c().KVCache(4, 2)
    ids = cache.allocate(3)
    with pytest.raises(TypeError):
        cache.commit(ids, [5, "a", 6])
    with pytest.raises(OverflowError):
        cache.commit(ids, [5, 2**64, 6])
    assert [cache.is_cached(b) for b in ids] == [True, False, False] and cache.num_cached == 1
    assert cache.lookup([5, 6], 8) == ids[:1]
    with pytest.raises(OverflowError):
        cache.lookup([2**63], 8)


def test_the_installed_package_uses_the_c_pool():
    """Where the extension was built (the README's test command requires it), the simulator runs it."""
    ckv = _c()
    assert kvcache.IMPLEMENTATION == "c"
    assert kvcache.KVCache is ckv.KVCache and kvcache.block_hashes is ckv.block_hashes
