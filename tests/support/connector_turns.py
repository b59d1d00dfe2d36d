"""Turns of a P/D conversation played inside vLLM's real Scheduler (scheduler role, no workers, no
NIXL I/O), for the connector and connector-metrics tests: the worker side is played by hand-made
ModelRunnerOutputs, as vLLM's own connector tests do.  Import only after ``require_vllm()``."""

from __future__ import annotations

import time

from kvtrace import semconv as sc

from support import vllm_rig as rig

BS = 16
BLOCK_BYTES = 2 * BS * 2 * 32 * 2 * 2  # K,V x block x kv heads x head dim x bf16 x 2 layers
P_ENGINE, D_ENGINE = "engine-p", "engine-d"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def make_scheduler(
    model_dir,
    *,
    role="prefill",
    engine=P_ENGINE,
    ttl=480,
    threshold=64,
    connector="KVTraceNixlConnector",
    module="kvtrace.vllm.connector",
):
    extra = {
        "bidirectional_kv_xfer": True,
        "kv_recompute_threshold": threshold,
        "decoder_kv_blocks_ttl": ttl,
        sc.KV_PARAMS_KEY: {"role": role},
    }
    if connector == "NixlConnector":
        module = None
    return rig.scheduler(
        rig.vllm_config(
            model_dir, extra=extra, block_size=BS, engine_id=engine, connector=connector, module_path=module
        )
    )


def d_params(num_tokens: int, blocks: int, *, expiry_in: float = 300.0, ctx: dict | None = None) -> dict:
    """What D returned after its turn (bidirectional), as the proxy forwards it to P."""
    params = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_block_ids": [list(range(100, 100 + blocks))],
        "remote_engine_id": D_ENGINE,
        "remote_request_id": "chatcmpl-prev-0000abcd",
        "remote_host": "127.0.0.1",
        "remote_port": 5601,
        "tp_size": 1,
        "remote_num_tokens": num_tokens,
        "remote_blocks_expiry_time": time.perf_counter() + expiry_in,
    }
    if ctx is not None:
        params[sc.KV_PARAMS_KEY] = ctx
    return params


def run_step(sched, req, **connector_output):
    """One step: schedule and feed back a runner output.  Returns the engine outputs."""
    out = sched.schedule()
    running = [r for r in (req,) if r.request_id in out.num_scheduled_tokens]
    return sched.update_from_output(out, rig.runner_output(running, **connector_output)), out


def finished_params(engine_outputs, rid):
    """The kv_transfer_params of request ``rid``'s finished output."""
    for outs in engine_outputs.values():
        for o in outs.outputs:
            if o.request_id == rid and o.finish_reason is not None:
                return o.kv_transfer_params
    raise AssertionError(f"{rid} did not finish")


def nixl_stats(**data):
    """NIXL connector stats holding ``data`` (name -> values), as a worker reports them."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats

    stats = NixlKVConnectorStats()
    for k, v in data.items():
        stats.data[k] = list(v)
    return stats


def prefill_turn(sched, prompt, params, **first_output):
    """A P request (max_tokens=1) added and run one step; (request, engine outputs)."""
    req = rig.request(prompt, params=params, max_tokens=1, block_size=BS)
    sched.add_request(req)
    eo, _ = run_step(sched, req, **first_output)
    return req, eo


def decode_turn(sched, prompt, *, max_tokens=3):
    """A D request for P's blocks run to its end; (request, its final kv_transfer_params)."""
    p_params = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": [list(range(len(prompt) // BS))],
        "remote_engine_id": P_ENGINE,
        "remote_request_id": "chatcmpl-p1-00aa00aa",
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "tp_size": 1,
        "remote_num_tokens": len(prompt),
    }
    req = rig.request(
        prompt, params=p_params, max_tokens=max_tokens, block_size=BS, trace_headers={"traceparent": TRACEPARENT}
    )
    sched.add_request(req)
    run_step(sched, req)
    run_step(sched, req, finished_recving={req.request_id})
    eo = None
    for _ in range(max_tokens + 1):
        eo, _ = run_step(sched, req)
        if any(o.finish_reason is not None for outs in eo.values() for o in outs.outputs):
            break
    return req, finished_params(eo, req.request_id)
