"""The digest's tags in Python: the reference of :mod:`kvtrace.kvdigest._ctags`, and what runs
where that extension was not built.  Each tag is the first 4 bytes of a keyed BLAKE2b-128 over the
binding (``f"{engine_id}\\x00{request_id}\\x00"``, then per KV-cache group its block ids as native
int64 and ``0xff``) and then:

- v1: the token ids up to the tag's boundary, as native uint32;
- v2: the vLLM block hash of the last full block before the boundary, then the tokens after it.

Boundaries: every ``chunk`` tokens below ``n``, and ``n``; ``last_only`` gives the tag at ``n``
alone (P's check of a matching offer).
"""

from __future__ import annotations

import binascii
import hashlib
import struct
from array import array
from functools import partial

from kvtrace import semconv as sc

DIGEST_BYTES = 16
TAG_BYTES = 4
UNVERIFIABLE, MATCH, MISMATCH = 0, 1, 2  # check()'s codes
VERSIONS = (1, 2)  # v1 over the tokens, v2 over vLLM's block hashes
MIN_CHUNK, MAX_CHUNK = 16, 65536  # an offer's chunk outside this is unverifiable (bounds P's work)
MAX_TOKENS = 1 << 24


def keyed(key: bytes):
    """The keyed BLAKE2b state before any input (copied per digest: a keyed init costs ~10x a copy)."""
    return hashlib.blake2b(key=key, digest_size=DIGEST_BYTES)


_PACKERS: dict[tuple[str, int], object] = {}
_MAX_PACKERS = 1024


def _packed(code: str, values) -> bytes:
    """``values`` as native ``code`` integers: the bytes of ``array(code, values)``.  A cached
    ``struct.Struct`` per length packs a short list in a third of array()'s time (array converts
    item by item through a generic setter); the cache is bounded, lengths past it build their own."""
    n = len(values)
    pack = _PACKERS.get((code, n))
    if pack is None:
        pack = struct.Struct(f"={n}{code}").pack
        if len(_PACKERS) < _MAX_PACKERS:
            _PACKERS[(code, n)] = pack
    return pack(*values)  # type: ignore[operator]


def _bound(state, engine_id, request_id, block_ids):
    h = state.copy()
    h.update(f"{engine_id}\x00{request_id}\x00".encode())
    groups = block_ids or ()
    if groups and not isinstance(groups[0], (list, tuple)):
        groups = (groups,)  # a flat list is one group
    for group in groups:  # vLLM: one list per KV-cache group
        h.update(_packed("q", group))
        h.update(b"\xff")
    return h


def _tokens(tokens, n: int) -> memoryview:
    """The first ``n`` token ids as uint32 (a view, no copy).  Converting a Python int costs ~10x
    copying its reference: slice first unless only a few tokens would be converted for nothing.
    array() reads a list or tuple by index but any other sequence through its iterator, at 2x the
    cost: vLLM's ``Request.all_token_ids`` is a ``ConstantList``, whose slice is a list."""
    if len(tokens) > n + 16 or not isinstance(tokens, (list, tuple)):
        tokens = tokens[:n]
    view = memoryview(array("I", tokens))
    if len(view) < n:
        raise ValueError("fewer tokens than asked for")
    return view[:n]


def tags_v1(state, engine_id, request_id, block_ids, tokens, n: int, chunk: int, last_only: bool) -> bytes:
    if n < 0 or chunk <= 0:
        raise ValueError("n must be >= 0 and chunk > 0")
    h = _bound(state, engine_id, request_id, block_ids)
    if not n:
        return b""
    view, tags, pos = _tokens(tokens, n), bytearray(), 0
    if not last_only:
        for b in range(chunk, n, chunk):
            h.update(view[pos:b])
            pos = b
            tags += h.copy().digest()[:TAG_BYTES]
    h.update(view[pos:n])
    return bytes(tags + h.digest()[:TAG_BYTES])


def tags_v2(
    state, engine_id, request_id, block_ids, block_hashes, tokens, n: int, hbs: int, chunk: int, last_only: bool
) -> bytes:
    if n < 0 or hbs <= 0 or chunk < hbs or chunk % hbs:
        raise ValueError("n must be >= 0 and chunk a positive multiple of hbs")
    h = _bound(state, engine_id, request_id, block_ids)
    if not n:
        return b""
    tags = bytearray()
    if not last_only:
        for b in range(chunk, n, chunk):
            t = h.copy()
            t.update(block_hashes[b // hbs - 1])
            tags += t.digest()[:TAG_BYTES]
    full = n // hbs
    if full:
        h.update(block_hashes[full - 1])
    if n > full * hbs:
        tail = tokens[full * hbs : n]
        if len(tail) < n - full * hbs:
            raise ValueError("fewer tokens than asked for")
        h.update(_packed("I", tail))
    return bytes(tags + h.digest()[:TAG_BYTES])


def _count(n: int, chunk: int) -> int:
    """Tags of an ``n``-token digest: one per whole chunk, one for a partial last chunk."""
    return n // chunk + (1 if n % chunk else 0)


def parse(obj) -> tuple[int, int, int, bytes, object] | None:
    """``(version, chunk, n, tags, fingerprint)`` of a well-formed digest object, else None."""
    if not isinstance(obj, dict):
        return None
    version = obj.get(sc.DIGEST_VERSION)
    if type(version) is not int or version not in VERSIONS:
        return None
    chunk, n, tags = obj.get(sc.DIGEST_CHUNK), obj.get(sc.DIGEST_TOKENS), obj.get(sc.DIGEST_TAGS)
    if type(chunk) is not int or type(n) is not int or not isinstance(tags, str):
        return None
    if not (MIN_CHUNK <= chunk <= MAX_CHUNK and 0 <= n <= MAX_TOKENS):
        return None
    try:  # strict: only the base64 alphabet, padding at the end (base64.b64decode(validate=True), faster)
        raw = binascii.a2b_base64(tags, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != TAG_BYTES * _count(n, chunk):
        return None
    return version, chunk, n, raw, obj.get(sc.DIGEST_FINGERPRINT)


def check(state, obj, tokens, limit, engine_id, request_id, block_ids, block_hashes, blocks) -> tuple[int, int]:
    """``(code, verified)`` of the offer's digest ``obj`` against ``tokens`` up to ``limit``
    (:func:`kvtrace.kvdigest.verify`).  Raises on what cannot be read (the caller: unverifiable)."""
    parsed = parse(obj)
    if parsed is None:
        return UNVERIFIABLE, 0
    version, chunk, n, raw, fp = parsed
    hbs = 1
    if version == 2:
        if blocks is None or block_hashes is None or fp != blocks.fingerprint or chunk != blocks.chunk:
            return UNVERIFIABLE, 0
        hbs = blocks.hash_block_size
    limit = min(int(limit), n, len(tokens))
    last = limit if limit == n else limit - limit % chunk  # the last boundary P can check
    if last <= 0:
        return MATCH, 0
    if version == 2:
        if len(block_hashes) < last // hbs:
            return UNVERIFIABLE, 0
        tags = partial(tags_v2, state, engine_id, request_id, block_ids, block_hashes, tokens, last, hbs, chunk)
    else:
        tags = partial(tags_v1, state, engine_id, request_id, block_ids, tokens, last, chunk)
    # the common case first: the tag at the limit proves every earlier boundary (prefix-closed)
    if raw.startswith(tags(True), (last - 1) // chunk * TAG_BYTES):
        return MATCH, last
    mine, verified = tags(False), 0  # the walk, only on a mismatch: the first differing chunk
    for j in range(len(mine) // TAG_BYTES):
        at = j * TAG_BYTES
        if mine[at : at + TAG_BYTES] != raw[at : at + TAG_BYTES]:
            break
        verified = min((j + 1) * chunk, last)
    return MISMATCH, verified
