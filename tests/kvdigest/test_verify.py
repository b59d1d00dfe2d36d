"""The identity of retained KV (kvtrace.kvdigest) and the enforce rule (kvtrace.kvrules)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pytest

from kvtrace import kvdigest, kvrules
from kvtrace import semconv as sc

TOKENS = [(i * 7919 + 13) % 100_000 for i in range(300)]
BIND = dict(engine_id="d-0", request_id="cmpl-x-0-abcd1234", block_ids=[[4, 9, 2, 7]])


def digest(tokens=TOKENS, n=300, **kw):
    return kvdigest.make(tokens, n, **{**BIND, **kw})


def check(obj, tokens, limit, **kw):
    return kvdigest.verify(obj, tokens, limit, **{**BIND, **kw})


def test_the_digest_is_the_same_in_another_process(monkeypatch):
    monkeypatch.delenv("KVTRACE_KV_DIGEST_KEY", raising=False)
    code = (
        "import json, sys; from kvtrace import kvdigest; a = json.loads(sys.argv[1]); "
        "print(json.dumps(kvdigest.make(a['t'], a['n'], engine_id=a['e'], request_id=a['r'], block_ids=a['b'])))"
    )
    arg = json.dumps({"t": TOKENS, "n": 300, "e": BIND["engine_id"], "r": BIND["request_id"], "b": BIND["block_ids"]})
    for key in (None, "deployment-secret"):
        env = {"PYTHONHASHSEED": "random", **({"KVTRACE_KV_DIGEST_KEY": key} if key else {})}
        out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, env=env, check=True)
        assert json.loads(out.stdout) == digest(key_value=key)


@pytest.mark.parametrize(
    "n, bind, key_value, tags",
    [
        (300, BIND, None, "OdHIfKFtMkBmUkhlmtxL8hRKBlA="),
        (300, BIND, "deployment-secret", "3a800WVY2CAenvtgwLfk/Zxm4j4="),
        (128, dict(engine_id="d-0", request_id="r", block_ids=[[1, 2], [3]]), "k", "3pe75upar4k="),
        (0, dict(engine_id="d-0", request_id="r", block_ids=[]), "k", ""),
    ],
)
def test_the_v1_tags_of_a_known_input_never_change(n, bind, key_value, tags):
    """P and D may run different kvtrace releases: what a version-1 digest hashes is fixed (these
    tags were made by the first v1 implementation; a change of what is hashed needs a new "v")."""
    got = kvdigest.make(TOKENS, n, **bind, key_value=key_value)
    assert got == {sc.DIGEST_VERSION: 1, sc.DIGEST_CHUNK: 64, sc.DIGEST_TOKENS: n, sc.DIGEST_TAGS: tags}
    flat = dict(engine_id="d-0", request_id="r", block_ids=[4, 9])  # a flat block list is one group
    assert kvdigest.make([*TOKENS, 4_000_000_000], 301, **flat, key_value="k")[sc.DIGEST_TAGS] == (
        "KxsalehaGzX14/LV0JG+glPb1vU="
    )


@pytest.mark.parametrize("extra", [0, 1, 16, 17, 64, 5000])
def test_tokens_past_the_covered_count_change_neither_the_digest_nor_the_check(extra):
    longer = TOKENS + [(i * 31 + 7) % 100_000 for i in range(extra)]
    assert kvdigest.make(longer, 300, **BIND) == digest()
    assert check(digest(), longer, 300 + extra) == kvdigest.Verdict(sc.VERIFIED_MATCH, 300)
    assert check(digest(), longer, 256) == kvdigest.Verdict(sc.VERIFIED_MATCH, 256)


class _ReadOnly(Sequence):
    """A read-only sequence that is not a list, as vLLM's ``Request.all_token_ids`` (ConstantList)."""

    def __init__(self, items):
        self._x = items

    def __getitem__(self, item):
        return self._x[item]

    def __len__(self):
        return len(self._x)


@pytest.mark.parametrize("wrap", [tuple, _ReadOnly])
def test_any_sequence_of_token_ids_gives_the_lists_digest_and_verdict(wrap):
    for n in (300, 299, 250):
        assert kvdigest.make(wrap(TOKENS), n, **BIND) == kvdigest.make(TOKENS, n, **BIND)
    assert check(digest(), wrap(TOKENS), 300) == kvdigest.Verdict(sc.VERIFIED_MATCH, 300)
    other = list(TOKENS)
    other[200] += 1
    assert check(digest(), wrap(other), 300) == kvdigest.Verdict(sc.VERIFIED_MISMATCH, 192, 192)


def test_a_token_id_outside_uint32_is_unverifiable_not_an_error():
    assert check(digest(), [*TOKENS[:299], 1 << 32], 300) == kvdigest.UNVERIFIABLE
    assert check(digest(), [*TOKENS[:299], -1], 300) == kvdigest.UNVERIFIABLE


def test_the_digest_object_is_versioned_and_covers_every_chunk_and_the_tail():
    d = digest()
    assert set(d) == {sc.DIGEST_VERSION, sc.DIGEST_CHUNK, sc.DIGEST_TOKENS, sc.DIGEST_TAGS}
    assert (d[sc.DIGEST_VERSION], d[sc.DIGEST_CHUNK], d[sc.DIGEST_TOKENS]) == (1, 64, 300)
    assert len(d[sc.DIGEST_TAGS]) == 4 * math.ceil(4 * 5 / 3)  # 4 whole chunks + the 44-token tail, 4 bytes each


@pytest.mark.parametrize("n", [1_000, 10_000, 131_072])
def test_the_digest_stays_within_86_bytes_per_1000_tokens_plus_60(n):
    tokens = list(range(n))
    size = len(json.dumps(kvdigest.make(tokens, n, **BIND)))
    assert size <= 86 * n / 1000 + 60


@pytest.mark.parametrize("at", [0, 1, 63, 64, 200, 255, 256, 299])
def test_changing_any_one_token_changes_the_digest_and_locates_its_chunk(at):
    other = list(TOKENS)
    other[at] += 1
    assert digest(other) != digest()
    verdict = check(digest(), other, 300)
    assert verdict == kvdigest.Verdict(sc.VERIFIED_MISMATCH, at // 64 * 64, at // 64 * 64)


def test_the_own_prompt_matches_up_to_the_limit():
    prompt = TOKENS + [1, 2, 3]
    assert check(digest(), prompt, 300) == kvdigest.Verdict(sc.VERIFIED_MATCH, 300)
    # a shorter prompt: proven up to its last whole chunk
    assert check(digest(), TOKENS[:250], 250) == kvdigest.Verdict(sc.VERIFIED_MATCH, 192)
    assert check(digest(), TOKENS, 40) == kvdigest.Verdict(sc.VERIFIED_MATCH, 0)


@pytest.mark.parametrize(
    "bind",
    [dict(engine_id="d-1"), dict(request_id="cmpl-y-0-abcd1234"), dict(block_ids=[[4, 9, 2, 8]])],
)
def test_a_digest_moved_to_other_blocks_fails_at_the_first_chunk(bind):
    assert check(digest(), TOKENS, 300, **bind) == kvdigest.Verdict(sc.VERIFIED_MISMATCH, 0, 0)


def test_another_key_matches_nothing():
    assert check(digest(key_value="p-and-d-secret"), TOKENS, 300) == kvdigest.Verdict(sc.VERIFIED_MISMATCH, 0, 0)
    assert check(digest(key_value="k"), TOKENS, 300, key_value="k") == kvdigest.Verdict(sc.VERIFIED_MATCH, 300)


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "tags",
        {},
        {**digest(), sc.DIGEST_VERSION: 2},
        {**digest(), sc.DIGEST_CHUNK: 1},  # would make P hash per token
        {**digest(), sc.DIGEST_CHUNK: True},
        {**digest(), sc.DIGEST_TOKENS: -1},
        {**digest(), sc.DIGEST_TOKENS: 500},  # tag count disagrees
        {**digest(), sc.DIGEST_TAGS: "not base64!"},
        {**digest(), sc.DIGEST_TAGS: 7},
    ],
)
def test_a_malformed_digest_is_unverifiable(bad):
    assert check(bad, TOKENS, 300) == kvdigest.UNVERIFIABLE


def test_the_offer_carries_the_digest_inside_kvtraces_entry():
    d = digest()
    assert kvdigest.offered({"remote_num_tokens": 300, sc.KV_PARAMS_KEY: {sc.KVT_DIGEST: d}}) is d
    assert kvdigest.offered({"remote_num_tokens": 300}) is None
    assert kvdigest.offered({sc.KV_PARAMS_KEY: "x"}) is None


def test_attributes_count_the_tokens_vllms_rule_loads_from_other_kv():
    mismatch = kvdigest.Verdict(sc.VERIFIED_MISMATCH, 128, 128)
    assert kvdigest.attributes(mismatch, sc.VERIFY_RECORD, 300, 64, 64) == {
        sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
        sc.KV_VERIFY_MODE: sc.VERIFY_RECORD,
        sc.KV_VERIFIED_TOKENS: 128,
        sc.KV_VERIFY_MISMATCH_TOKEN: 128,
        sc.KV_VERIFY_WRONG_TOKENS: 172,
    }
    # below the threshold vLLM loads nothing: nothing wrong was loaded
    assert kvdigest.attributes(mismatch, sc.VERIFY_RECORD, 300, 260, 64)[sc.KV_VERIFY_WRONG_TOKENS] == 0
    assert kvdigest.attributes(kvdigest.Verdict(sc.VERIFIED_MATCH, 300), sc.VERIFY_ENFORCE, 300, 0, 64) == {
        sc.KV_VERIFIED: sc.VERIFIED_MATCH,
        sc.KV_VERIFY_MODE: sc.VERIFY_ENFORCE,
        sc.KV_VERIFIED_TOKENS: 300,
    }
    # the scalar rule inside attributes() is kvrules.wrong_tokens
    for local, verified in ((0, 0), (64, 128), (200, 128), (0, 300)):
        want = int(kvrules.wrong_tokens(300 - local, local, verified, 64))
        got = kvdigest.attributes(kvdigest.Verdict(sc.VERIFIED_MISMATCH, verified, verified), "record", 300, local, 64)
        assert got[sc.KV_VERIFY_WRONG_TOKENS] == want


def test_enforce_pulls_the_verified_prefix_when_it_clears_the_threshold_else_recomputes():
    count = np.array([236, 236, 236, 236, 30, 0])
    vcount = np.array([236, 128, 40, -64, 10, 0])  # verified - local hit (negative: under the local hit)
    code = kvrules.d2p_outcome(True, count, np.array([64, 64, 64, 64, 64, 64]), 64)
    got = kvrules.enforced_outcome(code, count, vcount, 64)
    assert [sc.OUTCOMES[c] for c in got] == [
        "pulled",
        "pulled",
        "unverified",
        "unverified",
        "below_threshold",
        "local_hit",
    ]
    assert kvrules.enforced_pull(count, vcount, 64).tolist() == [236, 128, 0, 0, 0, 0]
    assert kvrules.verified_count(np.array([128, 500]), np.array([300, 300]), 64).tolist() == [64, 236]
