"""The C tags (kvtrace.kvdigest._ctags) against the Python reference (kvtrace.kvdigest._pytags) and
against hashlib: the same bytes on random inputs, the same verdict on random malformed offers, the
same strictness as binascii on base64."""

from __future__ import annotations

import binascii
import hashlib
import random
import struct

import pytest

from kvtrace import kvdigest
from kvtrace import semconv as sc
from kvtrace.kvdigest import _pytags

KEY = kvdigest.key("test-key")
NONE_HASH = hashlib.sha256(b"none").digest()


@pytest.fixture(autouse=True)
def implementation(monkeypatch):
    """This module compares the two implementations itself: the C one, under test."""
    from support.require import require_vllm

    return require_vllm("kvtrace.kvdigest._ctags")


def _states(c):
    return c.keyed(KEY), _pytags.keyed(KEY)


def test_a_tag_is_the_first_4_bytes_of_hashlibs_keyed_blake2b_128_of_the_binding_and_tokens(implementation):
    c = implementation
    tokens = [7, 4_000_000_000, 0, 65_536]
    message = "é-1\x00r\x00".encode() + struct.pack("=3q", 5, -1, 2**40) + b"\xff" + struct.pack("=4I", *tokens)
    want = hashlib.blake2b(message, key=KEY, digest_size=16).digest()[:4]
    assert c.tags_v1(c.keyed(KEY), "é-1", "r", [5, -1, 2**40], tokens, 4, 64, True) == want
    assert c.tags_v1(c.keyed(KEY), "é-1", "r", [[5, -1, 2**40]], tuple(tokens), 4, 64, False) == want
    block_hash = hashlib.sha256(b"block").digest()
    v2 = b"d\x00r\x00" + struct.pack("=1q", 3) + b"\xff" + block_hash + struct.pack("=2I", 9, 8)
    want = hashlib.blake2b(v2, key=KEY, digest_size=16).digest()[:4]
    assert c.tags_v2(c.keyed(KEY), "d", "r", [3], [block_hash], [1] * 16 + [9, 8], 18, 16, 64, True) == want


def test_every_key_length_blake2b_accepts_gives_hashlibs_tags(implementation):
    for length in (1, 31, 32, 33, 64):
        key = bytes(range(length))
        want = hashlib.blake2b(b"e\x00r\x00" + struct.pack("=I", 42), key=key, digest_size=16).digest()[:4]
        assert implementation.tags_v1(implementation.keyed(key), "e", "r", None, [42], 1, 64, True) == want
    for bad in (b"", bytes(65)):
        with pytest.raises(ValueError, match="1 to 64 bytes"):
            implementation.keyed(bad)


class _Tokens:
    """A sequence that is neither a list nor a tuple, as vLLM's ConstantList (its slice is a list)."""

    def __init__(self, items):
        self._items = list(items)

    def __len__(self):
        return len(self._items)

    def __getitem__(self, index):
        return self._items[index]


def _case(rng: random.Random):
    n = rng.randint(0, 1500)  # past 512 tokens and 256 block ids: the C side's 2 KB buffer flushes
    tokens = [rng.randrange(0, 1 << 32) for _ in range(n + rng.randint(0, 40))]
    group = lambda: [rng.randrange(-(1 << 62), 1 << 62) for _ in range(rng.randint(0, 300))]  # noqa: E731
    groups = [group() for _ in range(rng.randint(1, 3))]
    block_ids = rng.choice([groups, groups[0], tuple(groups), None, []])
    ids = (rng.choice(["d-0", "é", "", None, 7, 2.5]), rng.choice(["r", f"cmpl-{rng.random()}", "x" * 300]))
    return n, tokens, block_ids, ids


def test_both_implementations_give_the_same_tags_on_random_inputs(implementation):
    c, rng = implementation, random.Random(26)
    c_state, py_state = _states(c)
    for _ in range(300):
        n, tokens, block_ids, (engine_id, request_id) = _case(rng)
        wrap = rng.choice([list, tuple, _Tokens])
        hbs = rng.choice([16, 32, 48])
        chunk = kvdigest.block_config("sha256", NONE_HASH, hbs).chunk
        hashes = [rng.randbytes(32) for _ in range(len(tokens) // hbs)]
        for last_only in (False, True):
            v1 = (engine_id, request_id, block_ids, wrap(tokens), n, rng.choice([16, 64, 100]), last_only)
            assert c.tags_v1(c_state, *v1) == _pytags.tags_v1(py_state, *v1)
            v2 = (engine_id, request_id, block_ids, hashes, wrap(tokens), n, hbs, chunk, last_only)
            assert c.tags_v2(c_state, *v2) == _pytags.tags_v2(py_state, *v2)


def _outcome(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - what matters is that both raise (verify: unverifiable)
        return "raised"


@pytest.mark.parametrize(
    "tokens, block_ids",
    [([-1], [1]), ([1 << 32], [1]), ([1.5], [1]), (["7"], [1]), ([1], [1 << 63]), ([1], ["x"]), ([1], [[1], 2])],
)
def test_what_cannot_be_hashed_raises_in_both(implementation, tokens, block_ids):
    c_state, py_state = _states(implementation)
    assert _outcome(implementation.tags_v1, c_state, "d", "r", block_ids, tokens, 1, 64, False) == "raised"
    assert _outcome(_pytags.tags_v1, py_state, "d", "r", block_ids, tokens, 1, 64, False) == "raised"
    for fn, state in ((implementation.tags_v1, c_state), (_pytags.tags_v1, py_state)):
        assert _outcome(fn, state, "d", "r", [1], [1, 2], 3, 64, False) == "raised"  # fewer tokens than n


_ODD_VALUES = [None, True, 1.0, -1, 0, 1, 2, 3, 15, 16, 64, 65_536, 65_537, 1 << 24, (1 << 24) + 1, 2**70, "64", []]


def _mutated(rng: random.Random, digest: dict) -> dict:
    out = dict(digest)
    for _ in range(rng.randint(1, 2)):
        key = rng.choice([*out, "other"])
        roll = rng.random()
        if roll < 0.35:
            out[key] = rng.choice(_ODD_VALUES)
        elif roll < 0.7 and isinstance(out.get(sc.DIGEST_TAGS), str):
            text = list(out[sc.DIGEST_TAGS])
            at = rng.randint(0, len(text))
            edit = rng.choice(["set", "insert", "delete"])
            if edit == "set" and text:
                text[min(at, len(text) - 1)] = rng.choice("AB+/=-_ \né")
            elif edit == "insert":
                text.insert(at, rng.choice("AB+/=-_ \né"))
            elif text:
                del text[min(at, len(text) - 1)]
            out[sc.DIGEST_TAGS] = "".join(text)
        else:
            out.pop(key, None)
    return out


def test_both_implementations_give_the_same_verdict_on_random_offers(implementation):
    """Matching, mismatching (a changed token) and malformed offers (each field replaced, removed,
    or its base64 edited), any limit, with and without P's block hashes and configuration."""
    c, rng = implementation, random.Random(27)
    c_state, py_state = _states(c)
    config = kvdigest.block_config("sha256", NONE_HASH, 16)
    tokens = [rng.randrange(0, 100_000) for _ in range(400)]
    hashes = [rng.randbytes(32) for _ in range(25)]
    bind = dict(engine_id="d", request_id="r", block_ids=[[1, 2, 3]])
    offers = [kvdigest.make(tokens, 250, **bind), kvdigest.make_blocks(hashes, tokens, 250, config, **bind)]
    seen = set()
    for i in range(20_000):
        offer = dict(rng.choice(offers)) if i % 3 == 0 else _mutated(rng, rng.choice(offers))
        prompt = list(tokens)
        if rng.random() < 0.4:
            prompt[rng.randrange(260)] += 1
        limit = rng.choice([250, 200, 128, 64, 63, 0, -3, 1000, 250.7])
        theirs = rng.choice([hashes, hashes[:5], None]), rng.choice([config, None])  # P's block hashes, config
        args = (offer, prompt, limit, *bind.values(), *theirs)
        got = _outcome(c.check, c_state, *args)
        assert got == _outcome(_pytags.check, py_state, *args), offer
        seen.add(got[0] if isinstance(got, tuple) else got)
    assert seen == {_pytags.UNVERIFIABLE, _pytags.MATCH, _pytags.MISMATCH}


def test_the_c_base64_is_as_strict_as_binascii(implementation):
    c, rng = implementation, random.Random(28)
    c_state, py_state = _states(c)
    strings = ["AAAA=", "AAAA==", "A=", "AB=", "AB==", "AB===", "ABC=", "AB=C", "=AAA", "", "AAAA=A", "ABC==", "AAAA\n"]
    strings += ["".join(rng.choice("AB/+=") for _ in range(rng.randint(0, 12))) for _ in range(20_000)]
    for text in strings:
        try:
            raw = binascii.a2b_base64(text, strict_mode=True)
        except binascii.Error:
            raw = None
        n = len(raw) // 4 * 64 if raw else 64  # a length whose tag count fits what decoded
        offer = {sc.DIGEST_VERSION: 1, sc.DIGEST_CHUNK: 64, sc.DIGEST_TOKENS: n, sc.DIGEST_TAGS: text}
        args = (offer, [1], 0, "d", "r", [1], None, None)
        assert c.check(c_state, *args) == _pytags.check(py_state, *args), text
        readable = raw is not None and len(raw) == 4 * (n // 64)
        assert (c.check(c_state, *args)[0] == _pytags.MATCH) is readable, text


def test_the_installed_package_uses_the_c_tags(implementation):
    """Where the extension was built (the README's test command requires it), kvdigest uses it."""
    assert kvdigest.IMPLEMENTATION == "c" and kvdigest._impl is implementation
