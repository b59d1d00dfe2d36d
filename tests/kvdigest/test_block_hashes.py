"""Digest v2 (kvtrace.kvdigest.make_blocks): tags over vLLM's chained block hashes, a keyed
fingerprint of the hashing configuration, P's check by its own block hashes."""

from __future__ import annotations

import binascii
import hashlib
from array import array

import pytest

from kvtrace import kvdigest
from kvtrace import semconv as sc

HBS = 16
KEY = "test-deployment-key"
TOKENS = [(i * 7919 + 13) % 100_000 for i in range(300)]
BIND = dict(engine_id="d-0", request_id="cmpl-x-0-abcd1234", block_ids=[[4, 9, 2, 7]])
NONE_HASH = hashlib.sha256(b"vllm-none-hash").digest()
CFG = kvdigest.block_config("sha256", NONE_HASH, HBS, key_value=KEY)


def chain(tokens, hbs: int = HBS) -> list[bytes]:
    """Block hashes chained on the parent, as vLLM's request_block_hasher computes them (full blocks only)."""
    out, parent = [], NONE_HASH
    for start in range(0, len(tokens) - hbs + 1, hbs):
        parent = hashlib.sha256(parent + array("I", tokens[start : start + hbs]).tobytes()).digest()
        out.append(parent)
    return out


def make(tokens=TOKENS, n=300, cfg=CFG, hashes=None, **bind):
    hashes = chain(tokens, cfg.hash_block_size) if hashes is None else hashes
    return kvdigest.make_blocks(hashes, tokens, n, cfg, **{**BIND, **bind}, key_value=KEY)


def check(obj, tokens, limit, cfg=CFG, hashes=None, **bind):
    hashes = chain(tokens, cfg.hash_block_size) if hashes is None else hashes
    return kvdigest.verify(obj, tokens, limit, **{**BIND, **bind}, key_value=KEY, block_hashes=hashes, blocks=cfg)


def spec_tags(hashes, tokens, n: int) -> bytes:
    """The tags as the module docstring defines them, computed here from hashlib alone."""
    k = hashlib.blake2b(KEY.encode(), digest_size=32).digest()
    binding = f"{BIND['engine_id']}\x00{BIND['request_id']}\x00".encode()
    binding += array("q", BIND["block_ids"][0]).tobytes() + b"\xff"
    bounds = [*range(64, n, 64), n]
    out = b""
    for b in bounds:
        full = b // HBS
        data = binding + (hashes[full - 1] if full else b"") + array("I", tokens[full * HBS : b]).tobytes()
        out += hashlib.blake2b(data, key=k, digest_size=16).digest()[:4]
    return out


def test_v2_tags_are_the_keyed_hash_of_the_binding_the_block_hash_and_the_tail():
    hashes = chain(TOKENS)
    d = make()
    assert d == {
        sc.DIGEST_VERSION: 2,
        sc.DIGEST_CHUNK: 64,
        sc.DIGEST_TOKENS: 300,
        sc.DIGEST_TAGS: binascii.b2a_base64(spec_tags(hashes, TOKENS, 300), newline=False).decode(),
        sc.DIGEST_FINGERPRINT: CFG.fingerprint,
    }
    assert len(binascii.a2b_base64(d[sc.DIGEST_TAGS])) == 4 * 5  # 64, 128, 192, 256 and the tail at 300


def test_the_fingerprint_is_the_keyed_hash_of_algo_hash_block_size_and_none_hash():
    k = hashlib.blake2b(KEY.encode(), digest_size=32).digest()
    expected = hashlib.blake2b(b"sha256\x0016\x00" + NONE_HASH, key=k, digest_size=16).digest()[:8].hex()
    assert CFG == kvdigest.BlockConfig(16, 64, expected)


def test_v2_tags_and_the_fingerprint_of_a_known_input_never_change():
    assert (CFG.fingerprint, make()[sc.DIGEST_TAGS]) == ("5c0a4fd0f39f3b84", "I/LUUobON3DTrKSeSxzZhrOTqk0=")


@pytest.mark.parametrize(("hbs", "chunk"), [(16, 64), (32, 64), (64, 64), (128, 128), (48, 192)])
def test_the_chunk_is_the_lcm_of_64_and_the_hash_block_size(hbs, chunk):
    cfg = kvdigest.block_config("sha256", NONE_HASH, hbs)
    assert cfg.chunk == chunk
    d = make(cfg=cfg)
    assert d[sc.DIGEST_CHUNK] == chunk
    assert check(d, TOKENS + [1] * 40, 300, cfg=cfg) == kvdigest.Verdict(sc.VERIFIED_MATCH, 300)


def test_the_own_continuation_matches_with_one_tag():
    prompt = TOKENS + [5] * 60
    assert check(make(), prompt, 300) == kvdigest.Verdict(sc.VERIFIED_MATCH, 300)
    assert check(make(), prompt, 200) == kvdigest.Verdict(sc.VERIFIED_MATCH, 192)  # the last boundary below


@pytest.mark.parametrize(("at", "chunk_start"), [(0, 0), (63, 0), (64, 64), (150, 128), (255, 192), (299, 256)])
def test_changing_one_block_locates_its_chunk(at, chunk_start):
    prompt = list(TOKENS) + [5] * 20
    prompt[at] += 1  # vLLM's chain: that block's hash and every later one differ
    assert check(make(), prompt, 300) == kvdigest.Verdict(sc.VERIFIED_MISMATCH, chunk_start, chunk_start)


def test_one_changed_block_hash_is_a_mismatch_at_its_chunk():
    hashes = chain(TOKENS)
    hashes[9:] = [b"x" * 32] * (len(hashes) - 9)  # block 9 = tokens 144..160, in the chunk at 128
    assert check(make(), TOKENS, 300, hashes=hashes) == kvdigest.Verdict(sc.VERIFIED_MISMATCH, 128, 128)


@pytest.mark.parametrize(
    "other",
    [
        kvdigest.block_config("sha256_cbor", NONE_HASH, HBS, key_value=KEY),  # another algo
        kvdigest.block_config("sha256", hashlib.sha256(b"random seed").digest(), HBS, key_value=KEY),  # xxhash-like
        kvdigest.BlockConfig(HBS, 64, "0" * 16),
    ],
)
def test_another_hashing_configuration_is_unverifiable_not_a_mismatch(other):
    assert check(make(cfg=other), TOKENS, 300) == kvdigest.UNVERIFIABLE


def test_a_v2_offer_without_ps_block_hashes_or_configuration_is_unverifiable():
    d = make()
    assert kvdigest.verify(d, TOKENS, 300, **BIND, key_value=KEY) == kvdigest.UNVERIFIABLE
    assert kvdigest.verify(d, TOKENS, 300, **BIND, key_value=KEY, blocks=CFG) == kvdigest.UNVERIFIABLE
    short = chain(TOKENS)[:10]  # P's hashes stop before the limit
    assert check(d, TOKENS, 300, hashes=short) == kvdigest.UNVERIFIABLE


@pytest.mark.parametrize(
    "bind", [{"block_ids": [[4, 9, 2, 8]]}, {"request_id": "cmpl-y-1-abcd1234"}, {"engine_id": "d-1"}]
)
def test_a_v2_digest_copied_to_other_blocks_fails_at_the_first_chunk(bind):
    assert check(make(), TOKENS, 300, **bind) == kvdigest.Verdict(sc.VERIFIED_MISMATCH, 0, 0)


def test_another_key_matches_nothing():
    other = kvdigest.make_blocks(chain(TOKENS), TOKENS, 300, CFG, **BIND, key_value="another")
    assert check(other, TOKENS, 300) == kvdigest.Verdict(sc.VERIFIED_MISMATCH, 0, 0)


@pytest.mark.parametrize("n", [0, 10, 16, 64, 80, 128, 299])
def test_every_length_verifies_against_itself(n):
    d = make(n=n)
    assert len(binascii.a2b_base64(d[sc.DIGEST_TAGS])) == 4 * (n // 64 + (1 if n % 64 else 0))
    assert check(d, TOKENS, n) == kvdigest.Verdict(sc.VERIFIED_MATCH, n)


def test_make_refuses_block_hashes_that_do_not_cover_the_tokens():
    with pytest.raises(ValueError, match="do not cover"):
        make(hashes=chain(TOKENS)[:17])  # 300 tokens need 18 full blocks
    assert kvdigest.covers(chain(TOKENS), 300, CFG) and not kvdigest.covers(chain(TOKENS)[:17], 300, CFG)


def test_v1_offers_still_verify_by_tokens_beside_v2():
    v1 = kvdigest.make(TOKENS, 300, **BIND, key_value=KEY)
    assert v1[sc.DIGEST_VERSION] == 1 and sc.DIGEST_FINGERPRINT not in v1
    assert check(v1, TOKENS, 300) == kvdigest.Verdict(sc.VERIFIED_MATCH, 300)
    prompt = list(TOKENS)
    prompt[150] += 1
    assert check(v1, prompt, 300, hashes=chain(TOKENS)) == kvdigest.Verdict(sc.VERIFIED_MISMATCH, 128, 128)


@pytest.mark.parametrize(
    "bad", [{sc.DIGEST_VERSION: 3}, {sc.DIGEST_VERSION: True}, {sc.DIGEST_TAGS: "AAAA"}, {sc.DIGEST_CHUNK: 8}]
)
def test_a_malformed_v2_digest_is_unverifiable(bad):
    assert check({**make(), **bad}, TOKENS, 300) == kvdigest.UNVERIFIABLE
