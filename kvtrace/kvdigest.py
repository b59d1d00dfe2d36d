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
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from array import array
from dataclasses import dataclass

from kvtrace import semconv as sc
from kvtrace import settings

VERSION = 1
CHUNK_TOKENS = 64
TAG_BYTES = 4
MIN_CHUNK, MAX_CHUNK = 16, 65536  # an offer's chunk outside this is unverifiable (bounds P's work)
MAX_TOKENS = 1 << 24
_PUBLIC_KEY = b"kvtrace-kv-digest-v1 (public: set KVTRACE_KV_DIGEST_KEY)"


_KEYS: dict[str | None, bytes] = {}
_ENV: list[str | None] = []  # KVTRACE_KV_DIGEST_KEY as read at the first use in this process


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


def _start(k: bytes, engine_id: object, request_id: object, block_ids: object):
    h = hashlib.blake2b(f"{engine_id}\x00{request_id}\x00".encode(), key=k, digest_size=16)
    groups = block_ids or ()
    if groups and not isinstance(groups[0], (list, tuple)):
        groups = (groups,)  # a flat list is one group
    for group in groups:  # vLLM: one list per KV-cache group
        h.update(array("q", group).tobytes())
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


def _tags(h, data: bytes, bounds: list[int]):
    """Yield the tag at each boundary (token counts), feeding ``h`` the tokens in between."""
    pos, view = 0, memoryview(data)
    for b in bounds:
        h.update(view[pos * 4 : b * 4])
        pos = b
        yield h.copy().digest()[:TAG_BYTES]


def _token_bytes(tokens, n: int) -> memoryview:
    """The first ``n`` token ids as uint32 bytes (a view: no copy of the list or of the bytes)."""
    return memoryview(array("I", tokens if len(tokens) <= n + 64 else tokens[:n]))[:n].cast("B")


def make(tokens, n: int, *, engine_id, request_id, block_ids, key_value: str | None = None) -> dict:
    """The digest of ``tokens[:n]`` (what D's retained blocks hold) for the offer D returns."""
    n = max(0, min(int(n), len(tokens)))
    h = _start(key(key_value), engine_id, request_id, block_ids)
    tags = b"".join(_tags(h, _token_bytes(tokens, n), _boundaries(n, CHUNK_TOKENS)))
    return {
        sc.DIGEST_VERSION: VERSION,
        sc.DIGEST_CHUNK: CHUNK_TOKENS,
        sc.DIGEST_TOKENS: n,
        sc.DIGEST_TAGS: base64.b64encode(tags).decode(),
    }


@dataclass(frozen=True, slots=True)
class Verdict:
    """P's check of one offer: ``status`` (sc.VERIFIED_*), ``verified`` (prompt tokens proven
    equal to D's), ``first_mismatch`` (start of the first differing chunk, or None)."""

    status: str
    verified: int = 0
    first_mismatch: int | None = None


UNVERIFIABLE = Verdict(sc.VERIFIED_UNVERIFIABLE)


def _parse(obj) -> tuple[int, int, bytes] | None:
    if not isinstance(obj, dict) or obj.get(sc.DIGEST_VERSION) != VERSION:
        return None
    chunk, n, tags = obj.get(sc.DIGEST_CHUNK), obj.get(sc.DIGEST_TOKENS), obj.get(sc.DIGEST_TAGS)
    if type(chunk) is not int or type(n) is not int or not isinstance(tags, str):
        return None
    if not (MIN_CHUNK <= chunk <= MAX_CHUNK and 0 <= n <= MAX_TOKENS):
        return None
    try:
        raw = base64.b64decode(tags, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != TAG_BYTES * _count(n, chunk):
        return None
    return chunk, n, raw


def verify(obj, tokens, limit: int, *, engine_id, request_id, block_ids, key_value: str | None = None) -> Verdict:
    """Check the offer's digest ``obj`` against the prompt ``tokens`` up to ``limit`` tokens (what
    P would load up to: min(remote_num_tokens, prompt)).  ``match``: every tag up to the limit
    agrees (``verified`` = the last agreeing boundary, which is the limit when it is D's length or
    a chunk boundary); ``mismatch``: the first disagreeing tag's chunk starts at
    ``first_mismatch``; ``unverifiable``: no valid digest.  Never raises."""
    try:
        parsed = _parse(obj)
        if parsed is None:
            return UNVERIFIABLE
        chunk, n, raw = parsed
        limit = max(0, min(int(limit), n, len(tokens)))
        last = limit if limit == n else limit // chunk * chunk  # the last boundary P can check
        if last == 0:
            return Verdict(sc.VERIFIED_MATCH, 0)
        h = _start(key(key_value), engine_id, request_id, block_ids)
        data = _token_bytes(tokens, last)
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
