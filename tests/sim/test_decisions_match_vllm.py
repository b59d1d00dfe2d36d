"""The simulator's pull-vs-recompute decisions equal vLLM 0.33's NixlConnector rules.

A reference implementation of the rule (written here from vLLM's pull_scheduler/pull_worker)
is compared with what a simulated P engine actually does over a grid of (prompt tokens, local
prefix hit, remote_num_tokens, kv_recompute_threshold, time vs D's expiry).  When vLLM is
importable the same grid is fed to vLLM's own NixlPullConnectorScheduler.
"""

from __future__ import annotations

import itertools
import math
import time
from types import SimpleNamespace

import pytest

from kvtrace import semconv as sc
from kvtrace.emit.recorder import KVRecorder
from kvtrace.sim import scheduler
from kvtrace.sim.costmodel import CostModel
from kvtrace.sim.engine import Engine, Registry
from kvtrace.sim.holds import Hold
from kvtrace.sim.kvcache import KVCache

from support.require import require_vllm

BS = 16
NOW = 1000.0
PROMPTS = (64, 200)
HITS = (0, 48, 192)
REMOTES = (0, 40, 100, 250)
THRESHOLDS = (0, 64)
EXPIRIES = {"none": None, "fresh": NOW + 100.0, "in_margin": NOW + 4.9, "at_margin": NOW + 5.0, "past": NOW - 1.0}


def reference(prompt: int, hit: int, remote: int, threshold: int, now: float, expiry: float | None):
    """vLLM's rule: (outcome, pulled tokens)."""
    count = min(remote, prompt) - hit
    if count <= 0:
        return (sc.OUTCOME_LOCAL_HIT if hit > 0 else sc.OUTCOME_NO_REMOTE), 0
    if threshold > 0 and count < threshold:
        return sc.OUTCOME_BELOW_THRESHOLD, 0
    if expiry is not None and now + 5.0 >= expiry:
        return sc.OUTCOME_EXPIRED, 0
    return sc.OUTCOME_PULLED, count


def grid():
    for prompt, hit, remote, threshold, exp in itertools.product(PROMPTS, HITS, REMOTES, THRESHOLDS, EXPIRIES):
        if hit <= (prompt - 1) // BS * BS:
            yield prompt, hit, remote, threshold, exp


def _engine(name, role, registry, tracer_provider, threshold, clock, policy="recompute"):
    kv = scheduler.KVConfig.from_dict(
        {"kv_load_failure_policy": policy, "kv_connector_extra_config": {"kv_recompute_threshold": threshold}}
    )
    cost = CostModel("qwen3-32b", enabled=False)
    rec = KVRecorder(
        tracer_provider,
        engine_id=name,
        role=role,
        block_size=BS,
        bytes_per_block=cost.bytes_per_token * BS,
        threshold=threshold,
        ttl_s=kv.ttl_s,
        load_failure_policy=policy,
    )
    return Engine(
        engine_id=name,
        role=role,
        host="127.0.0.1",
        port=9,
        kv=kv,
        cache=KVCache(256, BS),
        cost=cost,
        recorder=rec,
        registry=registry,
        clock=clock,
    )


async def _run(engine, prompt, params, rid, max_tokens=1):
    gen = engine.submit(prompt, max_tokens=max_tokens, params=params, request_id=rid, internal_id=rid + "-int")
    await gen.prefill()
    async for _ in gen.decode():
        pass
    return gen.finish()


@pytest.mark.parametrize("prompt,hit,remote,threshold,exp", list(grid()))
async def test_decision_grid_matches_vllm_rule(prompt, hit, remote, threshold, exp, tracer_provider, span_exporter):
    clock = lambda: NOW  # noqa: E731
    registry = Registry()
    p = _engine("P", sc.ROLE_PREFILL, registry, tracer_provider, threshold, clock)
    d = _engine("D", sc.ROLE_DECODE, registry, tracer_provider, threshold, clock)
    tokens = list(range(1, prompt + 1))
    if hit:
        await _run(p, tokens[:hit], None, "warm")
    expiry = EXPIRIES[exp]
    d_blocks = d.cache.allocate(math.ceil(remote / BS))
    d.holds.add(Hold("d-int", "d-rec", d_blocks, remote, expiry if expiry is not None else NOW + 480, True))
    params = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_block_ids": [d_blocks],
        "remote_engine_id": "D",
        "remote_request_id": "d-int",
        "remote_host": "127.0.0.1",
        "remote_port": 9,
        "tp_size": 1,
        "remote_num_tokens": remote,
        "remote_blocks_expiry_time": expiry,
    }
    span_exporter.clear()
    summary = (await _run(p, tokens, params, "req"))[sc.KV_PARAMS_KEY]

    want_outcome, want_pulled = reference(prompt, hit, remote, threshold, NOW, expiry)
    decision = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_DECISION]
    assert len(decision) == 1
    attrs = dict(decision[0].attributes)
    assert attrs[sc.KV_OUTCOME] == want_outcome
    assert attrs[sc.KV_LOCAL_HIT_TOKENS] == hit
    assert attrs[sc.KV_PULLED_TOKENS] == want_pulled
    assert attrs[sc.KV_RECOMPUTED_TOKENS] == prompt - hit - want_pulled
    assert summary[sc.KVT_DECISION] == want_outcome
    assert summary[sc.KVT_PULLED_TOKENS] == want_pulled
    transfers = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_KV_TRANSFER]
    if want_outcome in (sc.OUTCOME_PULLED, sc.OUTCOME_EXPIRED):
        count = min(remote, prompt) - hit
        assert [t.attributes[sc.KV_TRANSFER_BYTES] for t in transfers] == [math.ceil(count / BS) * BS * 262_144]
    else:
        assert transfers == []
    # D keeps its blocks only when P declined an expired read (vLLM sends no notification then)
    assert ("d-int" in d.holds) == (want_outcome == sc.OUTCOME_EXPIRED)


def test_matched_tokens_do_remote_prefill_ignores_threshold():
    params = {"do_remote_prefill": True}
    assert scheduler.matched_tokens(params, 100, 32, 64) == (68, True)
    assert scheduler.matched_tokens(params, 100, 100, 64) == (0, False)


def test_missing_remote_field_means_no_pull():
    base = {
        "do_remote_decode": True,
        "remote_block_ids": [[1]],
        "remote_engine_id": "d",
        "remote_request_id": "r",
        "remote_host": "h",
        "remote_port": 1,
        "remote_num_tokens": 500,
    }
    assert scheduler.matched_tokens(base, 400, 0, 64) == (400, True)
    for key in scheduler.REMOTE_FIELDS:
        params = {k: v for k, v in base.items() if k != key}
        assert scheduler.matched_tokens(params, 400, 0, 64) == (0, False)
        assert scheduler.outcome(params, 400, 0, 64) == sc.OUTCOME_NO_REMOTE
    assert scheduler.matched_tokens({**base, "remote_block_ids": []}, 400, 0, 64) == (0, False)


def test_kv_config_from_vllm_json():
    cfg = scheduler.KVConfig.from_dict(
        {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                "bidirectional_kv_xfer": False,
                "kv_recompute_threshold": 128,
                "decoder_kv_blocks_ttl": 60,
                "kv_lease_duration": 10,
            },
        }
    )
    assert (cfg.bidirectional, cfg.threshold, cfg.ttl_s, cfg.lease_s, cfg.kv_load_failure_policy) == (
        False,
        128,
        60.0,
        10.0,
        "recompute",
    )
    default = scheduler.KVConfig.from_dict(None)
    assert (
        default.bidirectional,
        default.threshold,
        default.ttl_s,
        default.lease_s,
        default.kv_load_failure_policy,
    ) == (True, 64, 480.0, 30.0, "fail")
    with pytest.raises(scheduler.ConfigError, match="kv_load_failure_policy"):
        scheduler.KVConfig.from_dict({"kv_load_failure_policy": "retry"})
    with pytest.raises(scheduler.ConfigError, match="kv_recompute_threshold"):
        scheduler.KVConfig.from_dict({"kv_connector_extra_config": {"kv_recompute_threshold": "many"}})


# ------------------------------------------------------------------ conformance with vLLM itself
def _vllm_scheduler(threshold: int):
    require_vllm("vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler")
    import torch
    from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import NixlPullConnectorScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    kvt = KVTransferConfig(
        kv_connector="NixlConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"bidirectional_kv_xfer": True, "kv_recompute_threshold": threshold},
    )
    cfg = VllmConfig(kv_transfer_config=kvt, device_config=DeviceConfig("cpu"), cache_config=CacheConfig(block_size=BS))
    kcc = KVCacheConfig(
        num_blocks=100,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"], FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32)
            )
        ],
    )
    return NixlPullConnectorScheduler(cfg, "p-engine", kcc)


@pytest.mark.vllm
def test_grid_conforms_to_vllm_scheduler():
    require_vllm("vllm.v1.request")
    from vllm import SamplingParams
    from vllm.v1.request import Request

    for threshold in THRESHOLDS:
        vsched = _vllm_scheduler(threshold)
        rows = 0
        for prompt, hit, remote in itertools.product(PROMPTS, HITS, REMOTES):
            if hit > prompt - 1:
                continue
            for params in (
                {
                    "do_remote_decode": True,
                    "do_remote_prefill": False,
                    "remote_block_ids": [[1, 2]],
                    "remote_engine_id": "d",
                    "remote_request_id": "r",
                    "remote_host": "h",
                    "remote_port": 1,
                    "tp_size": 1,
                    "remote_num_tokens": remote,
                },
                {
                    "do_remote_prefill": True,
                    "do_remote_decode": False,
                    "remote_block_ids": [[1]],
                    "remote_engine_id": "p",
                    "remote_request_id": "r",
                    "remote_host": "h",
                    "remote_port": 1,
                    "tp_size": 1,
                },
                {"do_remote_decode": True, "remote_num_tokens": remote},
                None,
            ):
                req = Request(
                    request_id=f"r{rows}",
                    prompt_token_ids=list(range(prompt)),
                    sampling_params=SamplingParams(max_tokens=1),
                    pooling_params=None,
                )
                req.kv_transfer_params = dict(params) if params else None
                assert scheduler.matched_tokens(params, prompt, hit, threshold) == tuple(
                    vsched.get_num_new_matched_tokens(req, hit)
                ), (prompt, hit, remote, threshold, params)
                rows += 1
        assert rows == 4 * 20  # (2 + 3 hits) x 4 remotes x 4 param shapes


@pytest.mark.vllm
def test_expiry_margin_conforms_to_vllm_worker():
    require_vllm("vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker")
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import pull_worker

    assert pull_worker._KV_BLOCKS_EXPIRY_SAFETY_MARGIN == scheduler.EXPIRY_SAFETY_MARGIN_S
    fake_self = SimpleNamespace(_engine_clock_offset={"d": 0.0})
    for offset in (-1.0, 3.0, 4.5, 5.5, 7.0, 100.0):
        now = time.perf_counter()
        meta = SimpleNamespace(
            remote=SimpleNamespace(blocks_expiry_time=now + offset, engine_id="d"), local_physical_block_ids=[[1]]
        )
        vllm_says = pull_worker.NixlPullConnectorWorker._is_turn2_read_expired(fake_self, meta)
        assert vllm_says == scheduler.read_expired(now, now + offset), offset
