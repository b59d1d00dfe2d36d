"""The connector's digest check with vLLM's real scheduler (v1 Scheduler + NixlConnector's
scheduler side, no workers): D's params carry the digest of what its blocks hold; P records
whether an offer matches its prompt (``record``) or loads only the verified prefix (``enforce``)."""

from __future__ import annotations

import binascii
import time

import pytest

from kvtrace import kvdigest
from kvtrace import semconv as sc

from support.require import require_vllm

pytestmark = pytest.mark.vllm
require_vllm()
require_vllm("nixl")

from support import vllm_rig as rig  # noqa: E402

BS = 16
P_ENGINE, D_ENGINE = "engine-p", "engine-d"
D_REQUEST = "chatcmpl-prev-0000abcd"
D_BLOCKS = [list(range(100, 117))]  # 17 blocks: 260 tokens
HELD = list(range(1, 261))  # the tokens D's blocks hold


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return rig.make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def connector_cls(monkeypatch, tracer_provider):
    from kvtrace.vllm.connector import KVTraceNixlConnector

    monkeypatch.setattr(KVTraceNixlConnector, "tracer_provider", tracer_provider)
    return KVTraceNixlConnector


def _sched(model_dir, *, role: str, engine: str, verify: str | None = None):
    entry = {"role": role, **({"verify": verify} if verify else {})}
    extra = {"bidirectional_kv_xfer": True, "kv_recompute_threshold": 64, sc.KV_PARAMS_KEY: entry}
    cfg = rig.vllm_config(model_dir, extra=extra, block_size=BS, engine_id=engine)
    return rig.scheduler(cfg)


def _blocks() -> kvdigest.BlockConfig:
    """The block-hash configuration of the rig's engines (sha256 over 16-token blocks)."""
    from vllm.v1.core import kv_cache_utils

    rig.request([1])  # the rig initialises NONE_HASH as EngineCore does
    return kvdigest.block_config("sha256", kv_cache_utils.NONE_HASH, BS)


@pytest.fixture(params=[1, 2], ids=["v1-over-tokens", "v2-over-block-hashes"])
def version(request) -> int:
    return request.param


def _digest(held, version: int, blocks: kvdigest.BlockConfig | None = None) -> dict:
    binding = dict(engine_id=D_ENGINE, request_id=D_REQUEST, block_ids=D_BLOCKS)
    if version == 1:
        return kvdigest.make(held, len(held), **binding)
    hashes = rig.request(held, block_size=BS).block_hashes  # as D's vLLM hashed them
    return kvdigest.make_blocks(hashes, held, len(held), blocks or _blocks(), **binding)


def _offer(held=HELD, version: int = 1, digest: dict | None = None) -> dict:
    """D's params as an id-only router sends them back to P: D's kvtrace entry (its digest) included."""
    digest = digest or _digest(held, version)
    return {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_block_ids": [list(D_BLOCKS[0])],
        "remote_engine_id": D_ENGINE,
        "remote_request_id": D_REQUEST,
        "remote_host": "127.0.0.1",
        "remote_port": 5601,
        "tp_size": 1,
        "remote_num_tokens": len(held),
        "remote_blocks_expiry_time": time.perf_counter() + 300,
        sc.KV_PARAMS_KEY: {sc.KVT_ENGINE_ID: D_ENGINE, sc.KVT_DIGEST: digest},
    }


def _run(sched, req, **connector_output):
    out = sched.schedule()
    running = [r for r in (req,) if r.request_id in out.num_scheduled_tokens]
    return sched.update_from_output(out, rig.runner_output(running, **connector_output)), out


def _decision(exporter) -> dict:
    [d] = [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_KV_DECISION]
    attrs = dict(d.attributes)
    assert 290 < attrs.pop(sc.KV_EXPIRY_REMAINING_S) <= 300
    return attrs


def _expected(req, offer: dict, pulled: int, outcome: str, verification: dict) -> dict:
    return {
        sc.GEN_AI_REQUEST_ID: req.request_id.split("-")[1],
        sc.ENGINE_ID: P_ENGINE,
        sc.ENGINE_ROLE: sc.ROLE_PREFILL,
        sc.KV_DIRECTION: sc.DIRECTION_D2P,
        sc.KV_PROMPT_TOKENS: 300,
        sc.KV_LOCAL_HIT_TOKENS: 0,
        sc.KV_REMOTE_TOKENS: 260,
        sc.KV_PULLED_TOKENS: pulled,
        sc.KV_RECOMPUTED_TOKENS: 300 - pulled,
        sc.KV_THRESHOLD: 64,
        sc.KV_LOAD_FAILURE_POLICY: "fail",
        sc.KV_EXPIRY_DEADLINE: offer["remote_blocks_expiry_time"],
        sc.KV_PEER_ENGINE_ID: D_ENGINE,
        sc.KV_REMOTE_REQUEST_ID: D_REQUEST,
        sc.KV_OUTCOME: outcome,
        **verification,
    }


def _other_prompt(differ_at: int) -> list[int]:
    """Another conversation's prompt: D's tokens up to ``differ_at``, then its own."""
    prompt = HELD + list(range(1000, 1040))
    prompt[differ_at] = 499
    return prompt


def test_d_puts_the_digest_of_what_its_blocks_hold_in_its_params(connector_cls, model_dir):
    sched = _sched(model_dir, role="decode", engine=D_ENGINE)
    prompt = list(range(1, 161))
    p_params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(range(10))],
        "remote_engine_id": P_ENGINE,
        "remote_request_id": "chatcmpl-p1-00aa00aa",
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "tp_size": 1,
        "remote_num_tokens": 160,
    }
    req = rig.request(prompt, params=p_params, max_tokens=3, block_size=BS)
    sched.add_request(req)
    _run(sched, req)
    _run(sched, req, finished_recving={req.request_id})
    params = None
    for _ in range(4):
        eo, _ = _run(sched, req)
        done = [o for outs in eo.values() for o in outs.outputs if o.finish_reason is not None]
        if done:
            params = done[0].kv_transfer_params
            break
    assert params["do_remote_decode"] is True and params["remote_num_tokens"] == 162  # prompt + 3 outputs - 1
    held = prompt + [7, 7]  # the runner samples token 7
    hashes = rig.request(held + [7], block_size=BS).block_hashes  # what vLLM hashed: prompt + 3 outputs
    assert len(req.block_hashes) == 10 and req.block_hashes == hashes
    binding = dict(engine_id=D_ENGINE, request_id=req.request_id, block_ids=params["remote_block_ids"])
    digest = params[sc.KV_PARAMS_KEY][sc.KVT_DIGEST]
    assert digest == kvdigest.make_blocks(hashes, held, 162, _blocks(), **binding)
    assert (digest[sc.DIGEST_VERSION], digest[sc.DIGEST_CHUNK], digest[sc.DIGEST_TOKENS]) == (2, 64, 162)
    assert len(binascii.a2b_base64(digest[sc.DIGEST_TAGS])) == 4 * 3  # boundaries 64, 128 and 162


def test_d_without_block_hashes_falls_back_to_the_v1_digest(connector_cls, model_dir):
    from kvtrace.vllm.probe import _digest as d_digest

    req = rig.request(list(range(1, 161)), block_size=BS)
    params = {
        "remote_num_tokens": 160,
        "remote_engine_id": D_ENGINE,
        "remote_request_id": "r",
        "remote_block_ids": [[1]],
    }
    binding = dict(engine_id=D_ENGINE, request_id="r", block_ids=[[1]])
    assert d_digest(req, params, None) == kvdigest.make(list(range(1, 161)), 160, **binding)
    req.block_hashes.clear()  # a request vLLM did not hash
    sched = _sched(model_dir, role="decode", engine=D_ENGINE)
    blocks = sched.connector._probe.hashing.config()
    assert blocks is not None  # the configuration is known: only the missing hashes make it v1
    assert d_digest(req, params, blocks) == kvdigest.make(list(range(1, 161)), 160, **binding)


def test_record_says_mismatch_and_vllm_still_pulls_every_offered_token(
    connector_cls, model_dir, span_exporter, version
):
    sched = _sched(model_dir, role="prefill", engine=P_ENGINE)
    offer = _offer(version=version)
    req = rig.request(_other_prompt(150), params=offer, max_tokens=1, block_size=BS)
    sched.add_request(req)
    _run(sched, req)
    assert req.request_id not in sched.running  # waiting for D's KV: vLLM's rule pulls
    _run(sched, req, finished_recving={req.request_id})
    verification = {
        sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
        sc.KV_VERIFY_MODE: sc.VERIFY_RECORD,
        sc.KV_VERIFIED_TOKENS: 128,
        sc.KV_VERIFY_MISMATCH_TOKEN: 128,  # token 150 is in the chunk starting at 128
        sc.KV_VERIFY_WRONG_TOKENS: 260 - 128,
    }
    assert _decision(span_exporter) == _expected(req, offer, 260, sc.OUTCOME_PULLED, verification)
    assert req.kv_transfer_params["remote_block_ids"] == D_BLOCKS  # untouched


def test_enforce_loads_only_the_verified_blocks(connector_cls, model_dir, span_exporter, version):
    sched = _sched(model_dir, role="prefill", engine=P_ENGINE, verify=sc.VERIFY_ENFORCE)
    offer = _offer(version=version)
    req = rig.request(_other_prompt(150), params=offer, max_tokens=1, block_size=BS)
    sched.add_request(req)
    _run(sched, req)
    # NIXL pairs the blocks it loads with the tail of remote_block_ids: the list is cut to 128 tokens' blocks
    assert (req.kv_transfer_params["remote_num_tokens"], req.kv_transfer_params["remote_block_ids"]) == (
        128,
        [D_BLOCKS[0][:8]],
    )
    _run(sched, req, finished_recving={req.request_id})
    verification = {
        sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
        sc.KV_VERIFY_MODE: sc.VERIFY_ENFORCE,
        sc.KV_VERIFIED_TOKENS: 128,
        sc.KV_VERIFY_MISMATCH_TOKEN: 128,
        sc.KV_VERIFY_WRONG_TOKENS: 260 - 128,
    }
    assert _decision(span_exporter) == _expected(req, offer, 128, sc.OUTCOME_PULLED, verification)
    [transfer] = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_TRANSFER]
    assert (transfer.attributes[sc.KV_TRANSFER_TOKENS], transfer.attributes[sc.KV_TRANSFER_BLOCKS]) == (128, 8)


def test_enforce_recomputes_when_too_little_is_verified(connector_cls, model_dir, span_exporter, version):
    sched = _sched(model_dir, role="prefill", engine=P_ENGINE, verify=sc.VERIFY_ENFORCE)
    offer = _offer(version=version)
    req = rig.request(_other_prompt(10), params=offer, max_tokens=1, block_size=BS)
    sched.add_request(req)
    eo, out = _run(sched, req)
    assert out.num_scheduled_tokens[req.request_id] == 300  # computed at once, nothing waits for D
    verification = {
        sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
        sc.KV_VERIFY_MODE: sc.VERIFY_ENFORCE,
        sc.KV_VERIFIED_TOKENS: 0,
        sc.KV_VERIFY_MISMATCH_TOKEN: 0,
        sc.KV_VERIFY_WRONG_TOKENS: 260,
    }
    assert _decision(span_exporter) == _expected(req, offer, 0, sc.OUTCOME_UNVERIFIED, verification)
    assert [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_TRANSFER] == []


def test_the_own_continuation_matches(connector_cls, model_dir, span_exporter, version):
    sched = _sched(model_dir, role="prefill", engine=P_ENGINE, verify=sc.VERIFY_ENFORCE)
    offer = _offer(version=version)
    req = rig.request(HELD + list(range(1000, 1040)), params=offer, max_tokens=1, block_size=BS)
    sched.add_request(req)
    _run(sched, req)
    _run(sched, req, finished_recving={req.request_id})
    verification = {sc.KV_VERIFIED: sc.VERIFIED_MATCH, sc.KV_VERIFY_MODE: sc.VERIFY_ENFORCE, sc.KV_VERIFIED_TOKENS: 260}
    assert _decision(span_exporter) == _expected(req, offer, 260, sc.OUTCOME_PULLED, verification)


def test_a_v2_offer_hashed_under_another_configuration_is_unverifiable(connector_cls, model_dir, span_exporter):
    from vllm.v1.core import kv_cache_utils

    sched = _sched(model_dir, role="prefill", engine=P_ENGINE, verify=sc.VERIFY_ENFORCE)
    other = kvdigest.block_config("sha256_cbor", kv_cache_utils.NONE_HASH, BS)  # D's another algo
    offer = _offer(digest=_digest(HELD, 2, other))
    req = rig.request(HELD + list(range(1000, 1040)), params=offer, max_tokens=1, block_size=BS)
    sched.add_request(req)
    _run(sched, req)
    verification = {
        sc.KV_VERIFIED: sc.VERIFIED_UNVERIFIABLE,
        sc.KV_VERIFY_MODE: sc.VERIFY_ENFORCE,
        sc.KV_VERIFIED_TOKENS: 0,
    }
    assert _decision(span_exporter) == _expected(req, offer, 0, sc.OUTCOME_UNVERIFIED, verification)


def test_p_checks_a_v2_offer_by_its_own_block_hashes_not_its_tokens(connector_cls, model_dir, span_exporter):
    sched = _sched(model_dir, role="prefill", engine=P_ENGINE)
    offer = _offer(version=2)
    req = rig.request(HELD + list(range(1000, 1040)), params=offer, max_tokens=1, block_size=BS)
    # P's prefix differs from block 9 on (tokens 144..160: the chunk at 128), and so, chained, every later hash
    req.block_hashes[9:] = [b"another prefix %d" % i for i in range(9, len(req.block_hashes))]
    sched.add_request(req)
    _run(sched, req)
    _run(sched, req, finished_recving={req.request_id})
    verification = {
        sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
        sc.KV_VERIFY_MODE: sc.VERIFY_RECORD,
        sc.KV_VERIFIED_TOKENS: 128,
        sc.KV_VERIFY_MISMATCH_TOKEN: 128,
        sc.KV_VERIFY_WRONG_TOKENS: 260 - 128,
    }
    assert _decision(span_exporter) == _expected(req, offer, 260, sc.OUTCOME_PULLED, verification)
