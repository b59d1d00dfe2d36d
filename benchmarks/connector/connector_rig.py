"""The connectors ``bench_connector.py`` measures and one synthetic request's scheduler hooks.

``make_connectors`` builds KVTraceNixlConnector and bare NixlConnector in the SCHEDULER role from one
VllmConfig (the rig's tiny model directory); ``request_calls`` is request ``i``'s hook sequence (every other
request pulls from D, with D's digest in its offer); ``d_side_calls`` is what D's request_finished
adds.
The rig (``support.vllm_rig``) lives in ``tests/``: the bench puts it on ``sys.path`` first.
"""

from __future__ import annotations

import time
from pathlib import Path

HOOKS = (
    "on_new_request",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
    "get_kv_connector_stats",
    "request_finished_all_groups",
)
BS = 16


class Discard:
    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=0):
        return True


def make_connectors(model_dir: Path, deferred: bool, metrics: bool = True, verify: str = "record"):
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector

    import kvtrace
    from kvtrace.vllm.connector import KVTraceNixlConnector

    from support import vllm_rig as rig

    extra = {"bidirectional_kv_xfer": True, "kvtrace": {"role": "prefill", "metrics": metrics, "verify": verify}}
    cfg = rig.vllm_config(model_dir, extra=extra, block_size=BS)
    kvc = rig.kv_cache_config(BS, 100_000)
    provider = kvtrace.configure("bench-connector", traces_dir=None, otlp="off", handle_sigterm=False)
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=65536))
    KVTraceNixlConnector.tracer_provider = provider
    KVTraceNixlConnector.deferred_spans = deferred
    wrapped = KVTraceNixlConnector(cfg, KVConnectorRole.SCHEDULER, kvc)
    bare = NixlConnector(cfg, KVConnectorRole.SCHEDULER, kvc)
    return wrapped, bare, provider


def request_calls(i: int, conn_tag: str, block_config):
    """The hook sequence of synthetic request ``i`` (fresh objects per connector); ``block_config`` is the
    engine's :class:`~kvtrace.kvdigest.BlockConfig` (the offer's v2 digest; ``record_v1``: a v1 one)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import RequestStatus

    from kvtrace import kvdigest
    from kvtrace import semconv as sc

    from support import vllm_rig as rig

    pull = i % 2 == 1
    prompt = [5 + (i + k) % 400 for k in range(256)]
    params = {"do_remote_decode": True, "do_remote_prefill": False}
    if pull:
        params.update(
            remote_block_ids=[list(range(16))],
            remote_engine_id="d",
            remote_request_id=f"d-{i}",
            remote_host="127.0.0.1",
            remote_port=5601,
            tp_size=1,
            remote_num_tokens=250,
            remote_blocks_expiry_time=time.perf_counter() + 300,
        )
    # the rig's Request carries block hashes as EngineCore's block hasher computes them
    req = rig.request(prompt, params=params, max_tokens=1, block_size=BS, request_id=f"chatcmpl-{conn_tag}{i}-abcd1234")
    if pull:
        # D's kvtrace entry with the digest of the 250 tokens it holds (what an id-only router sends back):
        # v2 over the block hashes D's vLLM computed for them (those of this prompt), v1 over the tokens
        binding = dict(engine_id="d", request_id=f"d-{i}", block_ids=[list(range(16))])
        if conn_tag == "record_v1":
            digest = kvdigest.make(prompt, 250, **binding)
        else:
            digest = kvdigest.make_blocks(req.block_hashes, prompt, 250, block_config, **binding)
        params[sc.KV_PARAMS_KEY] = {sc.KVT_ENGINE_ID: "d", sc.KVT_DIGEST: digest}
    local = 64
    ext = 250 - local if pull else 0
    blocks = KVCacheBlocks(([KVCacheBlock(b) for b in range(1000 + i * 20, 1000 + i * 20 + 16)],))
    stats = NixlKVConnectorStats()
    stats.data["transfer_duration"].append(0.002)
    stats.data["post_duration"].append(0.0005)
    stats.data["bytes_transferred"].append(12345)
    if conn_tag != "bare":  # what KVTraceNixlConnector's workers send
        from kvtrace.vllm.metrics import KVTraceConnectorStats

        stats = KVTraceConnectorStats.wrap(stats)
    out = KVConnectorOutput(
        finished_recving={req.request_id} if pull else None, kv_connector_stats=stats if pull else None
    )
    sched_out = SchedulerOutput.make_empty()

    def finish(c):
        req.status = RequestStatus.FINISHED_STOPPED
        req.num_computed_tokens = 256
        return c.request_finished_all_groups(req, ([b.block_id for b in blocks.blocks[0]],))

    return [
        ("on_new_request", lambda c: c.on_new_request(req)),
        ("get_num_new_matched_tokens", lambda c: c.get_num_new_matched_tokens(req, local)),
        ("update_state_after_alloc", lambda c: c.update_state_after_alloc(req, blocks, ext)),
        ("build_connector_meta", lambda c: c.build_connector_meta(sched_out)),
        ("update_connector_output", lambda c: c.update_connector_output(out)),
        ("get_kv_connector_stats", lambda c: c.get_kv_connector_stats()),
        ("request_finished_all_groups", finish),
    ]


def d_side_calls(i: int, hashing):
    """D's part of request ``i``: calls of what its request_finished adds when it retains the 250
    tokens of 16 blocks, as the probe makes it: v2 over the Request's block hashes (``hashing``: the
    connector's :class:`~kvtrace.vllm.blockhash.BlockHashing`), v1 over its all_token_ids."""
    from kvtrace.vllm import probe

    from support import vllm_rig as rig

    prompt = [5 + (i + k) % 400 for k in range(256)]
    req = rig.request(prompt, max_tokens=1, block_size=BS, request_id=f"chatcmpl-d{i}-abcd1234")
    params = dict(
        do_remote_decode=True,
        remote_block_ids=[list(range(16))],
        remote_engine_id="d",
        remote_request_id=req.request_id,
        remote_num_tokens=250,
    )
    blocks = hashing.config()
    return {"v2": lambda: probe._digest(req, params, blocks), "v1": lambda: probe._digest(req, params)}
