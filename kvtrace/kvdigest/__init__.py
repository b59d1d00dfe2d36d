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
from dataclasses import dataclass
from types import ModuleType

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.kvdigest import _pytags

_impl: ModuleType = _pytags
try:  # the same tags in one C call each (built with the package; optional: _pytags otherwise)
    from kvtrace.kvdigest import _ctags

    _ctags.set_keys(sc.DIGEST_VERSION, sc.DIGEST_CHUNK, sc.DIGEST_TOKENS, sc.DIGEST_TAGS, sc.DIGEST_FINGERPRINT)
    _impl = _ctags
except ImportError:  # pragma: no cover - a build without a compiler
    pass

#: which implementation computes the tags: "c" or "python"
IMPLEMENTATION = "c" if _impl is not _pytags else "python"
VERSION = 1
VERSION_BLOCKS = 2  # over vLLM's block hashes (make_blocks)
CHUNK_TOKENS = 64
TAG_BYTES = _pytags.TAG_BYTES
MIN_CHUNK, MAX_CHUNK = _pytags.MIN_CHUNK, _pytags.MAX_CHUNK  # an offer's chunk outside: unverifiable
MAX_TOKENS = _pytags.MAX_TOKENS
FINGERPRINT_BYTES = 8
_PUBLIC_KEY = b"kvtrace-kv-digest-v1 (public: set KVTRACE_KV_DIGEST_KEY)"


_KEYS: dict[str | None, bytes] = {}
_ENV: list[str | None] = []  # KVTRACE_KV_DIGEST_KEY as read at the first use in this process
_STATES: dict[str | None, object] = {}  # key value -> the implementation's keyed state


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


def _state(key_value: str | None):
    state = _STATES.get(key_value)
    if state is None:
        state = _STATES[key_value] = _impl.keyed(key(key_value))
    return state


def make(tokens, n: int, *, engine_id, request_id, block_ids, key_value: str | None = None) -> dict:
    """The digest of ``tokens[:n]`` (what D's retained blocks hold) for the offer D returns."""
    n = max(0, min(int(n), len(tokens)))
    tags = _impl.tags_v1(_state(key_value), engine_id, request_id, block_ids, tokens, n, CHUNK_TOKENS, False)
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
        code, verified = _impl.check(
            _STATES.get(key_value) or _state(key_value),
            obj,
            tokens,
            limit,
            engine_id,
            request_id,
            block_ids,
            block_hashes,
            blocks,
        )
    except Exception:
        return UNVERIFIABLE
    if code == _pytags.MATCH:
        return Verdict(sc.VERIFIED_MATCH, verified)
    if code == _pytags.MISMATCH:
        return Verdict(sc.VERIFIED_MISMATCH, verified, verified)
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
    state = _state(key_value)
    tags = _impl.tags_v2(state, engine_id, request_id, block_ids, block_hashes, tokens, n, hbs, chunk, False)
    return {
        sc.DIGEST_VERSION: VERSION_BLOCKS,
        sc.DIGEST_CHUNK: chunk,
        sc.DIGEST_TOKENS: n,
        sc.DIGEST_TAGS: binascii.b2a_base64(tags, newline=False).decode(),
        sc.DIGEST_FINGERPRINT: blocks.fingerprint,
    }


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
