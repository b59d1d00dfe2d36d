"""A keyed, compact identity of the token sequence a KV cache holds: D puts it in the
``kv_transfer_params`` it returns, P checks it against its own prompt before a pull.

vLLM's P decides a d2p pull from the offer alone (``count = min(remote_num_tokens, prompt) -
local_hit``): nothing proves that D's blocks were computed from this prompt's first tokens.  The
digest is that proof, produced where the blocks are (D's connector, at ``request_finished``) and
checked where the pull is decided (P's connector, at ``get_num_new_matched_tokens``):

- **Chained per chunk.**  A tag at every ``chunk`` (64) tokens and one at D's last token, each the
  keyed BLAKE2b of *all* tokens up to it (one running hash, copied at each boundary), so a tag
  covers every earlier chunk, as vLLM's prefix-cache block hashes chain on their parent.  Equal
  tags up to a boundary mean equal prefixes; the first unequal tag locates the first differing
  chunk.
- **Bound to the blocks.**  The hash starts from D's engine id, request id and block ids, so a
  digest copied into another offer (another conversation's blocks) fails at the first chunk.
- **Keyed** with :data:`kvtrace.settings.KV_DIGEST_KEY` (a per-deployment secret, the same on P
  and D): without the key nobody can compute a tag, so the tags say nothing about the text and
  an offer's digest cannot be forged.  Unset, a built-in public key still catches honest
  mismatches (see the setting's doc).
- **Compact.**  4 bytes per chunk (a chance collision per compared chunk is 2^-32; forging needs
  the key), base64: at most ``ceil(1000/64) * 4 * 4/3`` = 86 bytes per 1,000 tokens plus ~60 bytes
  of object, about 11 KB for a 128k-token context.

Object (``kv_transfer_params["kvtrace"]["kv_digest"]``): ``{"v": 1, "chunk": 64, "n": <tokens
covered>, "tags": "<base64>"}``.  :func:`verify` never raises on a malformed object: it is
``unverifiable``.  The pull rule under ``verify=enforce`` is :func:`kvtrace.kvrules.enforced_outcome`.

**v2, over vLLM's own block hashes** (:func:`make_blocks`; ``"v": 2`` plus ``"fp"``).  With a KV
connector configured vLLM hashes every full block of every request (``Request.block_hashes``,
``hash_block_size`` tokens each, chained on the parent, extra keys such as cache_salt and LoRA
included), so a block hash is a collision-resistant identity of the whole prefix up to it.  The tag
at boundary ``b`` is the keyed BLAKE2b of the binding (as v1), the hash of block ``b // hbs - 1``
(none when ``b < hbs``) and the raw tokens after it up to ``b`` (fewer than ``hbs``: only D's partial
last chunk has any).  No token list is converted, and P's check of a matching offer is one tag: O(1)
in the prompt.  ``chunk`` = lcm(64, hbs) (64 for the usual 16-token blocks).  ``fp`` = the keyed
hash of (prefix_caching_hash_algo, NONE_HASH, hbs): an offer whose ``fp`` differs from P's own was
hashed under another configuration and is ``unverifiable``, not a mismatch.  P and D must run the
same vLLM, Python and prefix_caching_hash_algo (NIXL's KV compatibility requires that anyway); a
non-cryptographic algo (xxhash) without a shared PYTHONHASHSEED draws a random NONE_HASH per process,
so the fingerprints differ and every v2 offer is unverifiable.  D falls back to v1 when the request
lacks the block hashes or the configuration is unknown; P still verifies v1 offers by tokens
(rolling upgrades; the simulator, which has no vLLM block hashes, emits v1).
"""

from __future__ import annotations

import binascii
import hashlib
import math
from array import array
from dataclasses import dataclass

from kvtrace import semconv as sc
from kvtrace import settings

VERSION = 1
VERSION_BLOCKS = 2  # over vLLM's block hashes (make_blocks)
CHUNK_TOKENS = 64
TAG_BYTES = 4
MIN_CHUNK, MAX_CHUNK = 16, 65536  # an offer's chunk outside this is unverifiable (bounds P's work)
MAX_TOKENS = 1 << 24
FINGERPRINT_BYTES = 8
_PUBLIC_KEY = b"kvtrace-kv-digest-v1 (public: set KVTRACE_KV_DIGEST_KEY)"


_KEYS: dict[str | None, bytes] = {}
_ENV: list[str | None] = []  # KVTRACE_KV_DIGEST_KEY as read at the first use in this process
_STATES: dict[str | None, hashlib.blake2b] = {}  # key(value) -> its keyed BLAKE2b state before any input


def key(value: str | None = None) -> bytes:
    """The digest key: ``value``, else KVTRACE_KV_DIGEST_KEY (read once per process: this runs
    per request, and os.environ costs more than the rest of the lookup), else the public default."""
    if value is None:
        if not _ENV:
            _ENV.append(settings.KV_DIGEST_KEY.get())
        value = _ENV[0]
    k = _KEYS.get(value)
    if k is None:
        raw = value.encode() if value else _PUBLIC_KEY
        k = _KEYS[value] = hashlib.blake2b(raw, digest_size=32).digest()  # any length in, a 32-byte key out
    return k


def _start(key_value: str | None, engine_id: object, request_id: object, block_ids: object):
    # a keyed BLAKE2b init costs ~10x a copy of a keyed state with nothing hashed yet, and both
    # give the same hash: build that state once per key
    base = _STATES.get(key_value)
    if base is None:
        base = _STATES[key_value] = hashlib.blake2b(key=key(key_value), digest_size=16)
    h = base.copy()
    h.update(f"{engine_id}\x00{request_id}\x00".encode())
    groups = block_ids or ()
    if groups and not isinstance(groups[0], (list, tuple)):
        groups = (groups,)  # a flat list is one group
    for group in groups:  # vLLM: one list per KV-cache group
        h.update(array("q", group))
        h.update(b"\xff")
    return h


def _count(n: int, chunk: int) -> int:
    """Tags of an ``n``-token digest: one per whole chunk, one for a partial last chunk."""
    return n // chunk + (1 if n % chunk else 0)


def _boundaries(n: int, chunk: int) -> list[int]:
    out = list(range(chunk, n + 1, chunk))
    if n % chunk:
        out.append(n)
    return out


def _tags(h, view: memoryview, bounds: list[int]):
    """Yield the tag at each boundary (token counts), feeding ``h`` the tokens in between."""
    pos = 0
    for b in bounds:
        h.update(view[pos:b])
        pos = b
        yield h.copy().digest()[:TAG_BYTES]


def _tokens(tokens, n: int) -> memoryview:
    """The first ``n`` token ids as uint32 (hashed as their bytes; a view, no copy).  Converting a
    Python int costs ~10x copying its reference: slice first unless only a few tokens would be
    converted for nothing.  array() reads a list or tuple by index but any other sequence through
    its iterator, at 2x the cost: vLLM's ``Request.all_token_ids`` is a ``ConstantList``, whose
    slice is a list."""
    if len(tokens) > n + 16 or not isinstance(tokens, (list, tuple)):
        tokens = tokens[:n]
    return memoryview(array("I", tokens))[:n]


def make(tokens, n: int, *, engine_id, request_id, block_ids, key_value: str | None = None) -> dict:
    """The digest of ``tokens[:n]`` (what D's retained blocks hold) for the offer D returns."""
    n = max(0, min(int(n), len(tokens)))
    h = _start(key_value, engine_id, request_id, block_ids)
    view, update, tags, pos = _tokens(tokens, n), h.update, bytearray(), 0
    for b in range(CHUNK_TOKENS, n, CHUNK_TOKENS):  # _tags without a generator: this runs in request_finished
        update(view[pos:b])
        pos = b
        tags += h.copy().digest()[:TAG_BYTES]
    if n:  # the last boundary (n) needs no copy
        update(view[pos:n])
        tags += h.digest()[:TAG_BYTES]
    return {
        sc.DIGEST_VERSION: VERSION,
        sc.DIGEST_CHUNK: CHUNK_TOKENS,
        sc.DIGEST_TOKENS: n,
        sc.DIGEST_TAGS: binascii.b2a_base64(tags, newline=False).decode(),
    }


@dataclass(slots=True)
class Verdict:
    """P's check of one offer: ``status`` (sc.VERIFIED_*), ``verified`` (prompt tokens proven
    equal to D's), ``first_mismatch`` (start of the first differing chunk, or None).  Treated as
    immutable; not ``frozen`` because a frozen dataclass's ``__init__`` costs 3x (one
    ``object.__setattr__`` per field) and one is made per checked offer in P's scheduler."""

    status: str
    verified: int = 0
    first_mismatch: int | None = None


UNVERIFIABLE = Verdict(sc.VERIFIED_UNVERIFIABLE)


def _parse(obj) -> tuple[int, int, int, bytes, object] | None:
    """``(version, chunk, n, tags, fingerprint)`` of a well-formed offer, else None."""
    if not isinstance(obj, dict):
        return None
    version = obj.get(sc.DIGEST_VERSION)
    if type(version) is not int or version not in (VERSION, VERSION_BLOCKS):
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


def verify(
    obj,
    tokens,
    limit: int,
    *,
    engine_id,
    request_id,
    block_ids,
    key_value: str | None = None,
    block_hashes=None,
    blocks: BlockConfig | None = None,
) -> Verdict:
    """Check the offer's digest ``obj`` against the prompt ``tokens`` up to ``limit`` tokens (what
    P would load up to: min(remote_num_tokens, prompt)).  ``match``: every tag up to the limit
    agrees (``verified`` = the last agreeing boundary, which is the limit when it is D's length or
    a chunk boundary); ``mismatch``: the first disagreeing tag's chunk starts at
    ``first_mismatch``; ``unverifiable``: no valid digest.  A v2 offer is checked against P's own
    ``block_hashes`` under P's ``blocks`` configuration (unverifiable without them or when the
    fingerprints differ).  Never raises."""
    try:
        parsed = _parse(obj)
        if parsed is None:
            return UNVERIFIABLE
        version, chunk, n, raw, fp = parsed
        if version == VERSION_BLOCKS:
            return _verify_blocks(
                chunk, n, raw, fp, tokens, limit, block_hashes, blocks, key_value, engine_id, request_id, block_ids
            )
        limit = max(0, min(int(limit), n, len(tokens)))
        last = limit if limit == n else limit // chunk * chunk  # the last boundary P can check
        if last == 0:
            return Verdict(sc.VERIFIED_MATCH, 0)
        h = _start(key_value, engine_id, request_id, block_ids)
        data = _tokens(tokens, last)
        # the common case first: the tag at the limit proves every earlier boundary (prefix-closed)
        i = _count(last, chunk) - 1
        whole = h.copy()
        whole.update(data)
        if whole.digest()[:TAG_BYTES] == raw[i * TAG_BYTES : (i + 1) * TAG_BYTES]:
            return Verdict(sc.VERIFIED_MATCH, last)
        bounds = [b for b in _boundaries(n, chunk) if b <= last]
        verified = 0
        for j, tag in enumerate(_tags(h, data, bounds)):
            if tag != raw[j * TAG_BYTES : (j + 1) * TAG_BYTES]:
                return Verdict(sc.VERIFIED_MISMATCH, verified, verified)
            verified = bounds[j]
        return Verdict(sc.VERIFIED_MISMATCH, verified, verified)  # only a chance tag collision gets here
    except Exception:
        return UNVERIFIABLE


@dataclass(slots=True, frozen=True)
class BlockConfig:
    """How this engine hashes blocks, as v2 needs it: ``hash_block_size`` tokens per block hash,
    ``chunk`` tokens per tag, ``fingerprint`` of the configuration (:func:`block_config`)."""

    hash_block_size: int
    chunk: int
    fingerprint: str


def block_config(algo: str, none_hash: bytes, hash_block_size: int, key_value: str | None = None) -> BlockConfig:
    """The v2 configuration of an engine whose block hashes use ``algo`` from ``none_hash`` over
    ``hash_block_size``-token blocks.  The fingerprint is keyed: it reveals nothing about NONE_HASH."""
    hbs = int(hash_block_size)
    if hbs <= 0:
        raise ValueError(f"hash_block_size must be positive, got {hbs}")
    data = f"{algo}\x00{hbs}\x00".encode() + bytes(none_hash)
    fp = hashlib.blake2b(data, key=key(key_value), digest_size=16).digest()[:FINGERPRINT_BYTES].hex()
    chunk = math.lcm(CHUNK_TOKENS, hbs)
    if chunk > MAX_CHUNK:
        raise ValueError(f"hash_block_size {hbs} gives a chunk above {MAX_CHUNK} tokens")
    return BlockConfig(hbs, chunk, fp)


def _tag_at(h, b: int, hbs: int, block_hashes, tokens) -> bytes:
    """v2's tag at boundary ``b`` from the binding state ``h`` (consumed): block ``b // hbs - 1``'s
    hash, then the tokens after it up to ``b``."""
    full = b // hbs
    if full:
        h.update(block_hashes[full - 1])
    if b > full * hbs:
        h.update(array("I", tokens[full * hbs : b]))
    return h.digest()[:TAG_BYTES]


def covers(block_hashes, n: int, blocks: BlockConfig) -> bool:
    """Whether ``block_hashes`` reach the last full block of the first ``n`` tokens."""
    return len(block_hashes) >= n // blocks.hash_block_size


def make_blocks(
    block_hashes, tokens, n: int, blocks: BlockConfig, *, engine_id, request_id, block_ids, key_value: str | None = None
) -> dict:
    """The v2 digest of ``tokens[:n]`` from their vLLM block hashes (:func:`covers` must hold)."""
    n = max(0, min(int(n), len(tokens)))
    hbs, chunk = blocks.hash_block_size, blocks.chunk
    if not covers(block_hashes, n, blocks):
        raise ValueError(f"{len(block_hashes)} block hashes do not cover {n} tokens of {hbs}")
    h, tags = _start(key_value, engine_id, request_id, block_ids), bytearray()
    for b in range(chunk, n, chunk):  # the boundary at n (last) needs no copy
        t = h.copy()
        t.update(block_hashes[b // hbs - 1])
        tags += t.digest()[:TAG_BYTES]
    if n:
        tags += _tag_at(h, n, hbs, block_hashes, tokens)
    return {
        sc.DIGEST_VERSION: VERSION_BLOCKS,
        sc.DIGEST_CHUNK: chunk,
        sc.DIGEST_TOKENS: n,
        sc.DIGEST_TAGS: binascii.b2a_base64(tags, newline=False).decode(),
        sc.DIGEST_FINGERPRINT: blocks.fingerprint,
    }


def _verify_blocks(chunk, n, raw, fp, tokens, limit, block_hashes, blocks, key_value, *binding) -> Verdict:
    if blocks is None or block_hashes is None or fp != blocks.fingerprint or chunk != blocks.chunk:
        return UNVERIFIABLE
    hbs = blocks.hash_block_size
    limit = max(0, min(int(limit), n, len(tokens)))
    last = limit if limit == n else limit // chunk * chunk
    if last == 0:
        return Verdict(sc.VERIFIED_MATCH, 0)
    if len(block_hashes) < last // hbs:
        return UNVERIFIABLE
    i = _count(last, chunk) - 1  # the common case: one tag, on the binding state itself (no copy)
    if (
        _tag_at(_start(key_value, *binding), last, hbs, block_hashes, tokens)
        == raw[i * TAG_BYTES : (i + 1) * TAG_BYTES]
    ):
        return Verdict(sc.VERIFIED_MATCH, last)
    h, verified = _start(key_value, *binding), 0  # the walk, only on a mismatch: locate the first differing chunk
    for j, b in enumerate(b for b in _boundaries(n, chunk) if b <= last):
        if _tag_at(h.copy(), b, hbs, block_hashes, tokens) != raw[j * TAG_BYTES : (j + 1) * TAG_BYTES]:
            break
        verified = b
    return Verdict(sc.VERIFIED_MISMATCH, verified, verified)


def offered(params: dict | None) -> object:
    """The digest object inside an offer's ``kvtrace`` entry (None when there is none)."""
    entry = (params or {}).get(sc.KV_PARAMS_KEY)
    return entry.get(sc.KVT_DIGEST) if isinstance(entry, dict) else None


def _loads(count: int, threshold: int) -> bool:
    """:func:`kvtrace.kvrules.loads` for one request, without numpy (P's scheduler hook)."""
    return count > 0 and not (threshold > 0 and count < threshold)


def attributes(verdict: Verdict, mode: str, wanted: int, local_hit: int, threshold: int) -> dict:
    """The decision span's verification attributes.  ``wanted`` = min(remote_num_tokens, prompt):
    where vLLM's rule loads up to (:func:`kvtrace.kvrules.wrong_tokens` for the wrong part)."""
    attrs = {sc.KV_VERIFIED: verdict.status, sc.KV_VERIFY_MODE: mode, sc.KV_VERIFIED_TOKENS: verdict.verified}
    if verdict.status == sc.VERIFIED_MISMATCH:
        wrong = wanted - max(verdict.verified, local_hit) if _loads(wanted - local_hit, threshold) else 0
        attrs[sc.KV_VERIFY_MISMATCH_TOKEN] = verdict.first_mismatch
        attrs[sc.KV_VERIFY_WRONG_TOKENS] = max(0, wrong)
    return attrs


def enforced_limit(verdict: Verdict, mode: str, wanted: int) -> int | None:
    """Under ``enforce``, the tokens P may take from the offer when fewer than ``wanted`` are
    verified (None: the offer stands as it is)."""
    if mode != sc.VERIFY_ENFORCE or verdict.verified >= wanted:
        return None
    return verdict.verified
