"""Added cost per scheduler hook: KVTraceNixlConnector vs bare NixlConnector, same run.

Both connectors are built in the SCHEDULER role from the same VllmConfig (a tiny Llama model
directory, no weights) and fed the same synthetic request stream: P legs of multi-turn
conversations whose every other turn pulls from D (``do_remote_decode`` + D's params), each
through on_new_request -> get_num_new_matched_tokens -> update_state_after_alloc ->
build_connector_meta -> update_connector_output (finished_recving + NIXL stats) ->
request_finished_all_groups.  Calls are interleaved request by request (wrapper, bare,
wrapper, ...) so both see the same machine noise.  The wrapper exports through
kvtrace.configure's BatchSpanProcessor into a discarding exporter.  ``--spans deferred`` (the
connector's default inside vLLM) applies spans on the recorder's background thread; the script
then reports how long that thread took to drain its backlog after the run.  ``--spans sync``
measures the synchronous recorder (the simulator's mode) for comparison.

Prints, per hook, the median ns of each and the added median (wrapper - bare).  Target: added
median <= 10 us per call.  Run with the vLLM venv:

    /opt/kvtrace-vllm/bin/python benchmarks/connector/bench_connector.py [--requests 3000] [--spans sync]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

HOOKS = ("on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
         "update_connector_output", "request_finished_all_groups")
BS = 16


class _Discard:
    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=0):
        return True


def _connectors(model_dir: Path, deferred: bool):
    import vllm_rig as rig
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector

    import kvtrace
    from kvtrace.vllm.connector import KVTraceNixlConnector

    extra = {"bidirectional_kv_xfer": True, "kvtrace": {"role": "prefill"}}
    cfg = rig.vllm_config(model_dir, extra=extra, block_size=BS)
    kvc = rig.kv_cache_config(BS, 100_000)
    provider = kvtrace.configure("bench-connector", traces_dir=None, otlp="off", handle_sigterm=False)
    provider.add_span_processor(BatchSpanProcessor(_Discard(), max_queue_size=65536))
    KVTraceNixlConnector.tracer_provider = provider
    KVTraceNixlConnector.deferred_spans = deferred
    wrapped = KVTraceNixlConnector(cfg, KVConnectorRole.SCHEDULER, kvc)
    bare = NixlConnector(cfg, KVConnectorRole.SCHEDULER, kvc)
    return wrapped, bare, provider


def _calls(i: int, conn_tag: str):
    """The hook sequence of synthetic request ``i`` (fresh objects per connector)."""
    import vllm_rig as rig
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import RequestStatus

    pull = i % 2 == 1
    prompt = [5 + (i + k) % 400 for k in range(256)]
    params = {"do_remote_decode": True, "do_remote_prefill": False}
    if pull:
        params.update(remote_block_ids=[list(range(16))], remote_engine_id="d", remote_request_id=f"d-{i}",
                      remote_host="127.0.0.1", remote_port=5601, tp_size=1, remote_num_tokens=250,
                      remote_blocks_expiry_time=time.perf_counter() + 300)
    req = rig.request(prompt, params=params, max_tokens=1, block_size=BS, request_id=f"chatcmpl-{conn_tag}{i}-abcd1234")
    local = 64
    ext = 250 - local if pull else 0
    blocks = KVCacheBlocks(([KVCacheBlock(b) for b in range(1000 + i * 20, 1000 + i * 20 + 16)],))
    stats = NixlKVConnectorStats()
    stats.data["transfer_duration"].append(0.002)
    stats.data["post_duration"].append(0.0005)
    stats.data["bytes_transferred"].append(12345)
    out = KVConnectorOutput(finished_recving={req.request_id} if pull else None, kv_connector_stats=stats if pull else None)
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
        ("request_finished_all_groups", finish),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--spans", choices=("deferred", "sync"), default="deferred")
    args = ap.parse_args(argv)
    import vllm_rig as rig

    model_dir = rig.make_tiny_model(Path(tempfile.mkdtemp()) / "model")
    wrapped, bare, provider = _connectors(model_dir, args.spans == "deferred")
    samples = {(tag, h): [] for tag in ("kvtrace", "bare") for h in HOOKS}
    clock = time.perf_counter_ns
    for i in range(args.requests):
        for tag, conn in (("kvtrace", wrapped), ("bare", bare)) if i % 2 else (("bare", bare), ("kvtrace", wrapped)):
            for hook, call in _calls(i, tag):
                t0 = clock()
                call(conn)
                samples[(tag, hook)].append(clock() - t0)
    t0 = clock()
    drained = wrapped._probe.recorder.flush(120)
    drain_ms = (clock() - t0) / 1e6
    provider.shutdown()
    warm = args.requests // 10
    print(f"spans={args.spans} requests={args.requests} (first {warm} dropped as warm-up); median ns per call")
    print(f"{'hook':30s} {'bare':>9s} {'kvtrace':>9s} {'added':>9s} {'ratio':>6s}")
    worst = 0.0
    for hook in HOOKS:
        b = statistics.median(samples[("bare", hook)][warm:])
        w = statistics.median(samples[("kvtrace", hook)][warm:])
        worst = max(worst, w - b)
        print(f"{hook:30s} {b:9.0f} {w:9.0f} {w - b:9.0f} {w / b if b else float('nan'):6.2f}")
    if args.spans == "deferred":
        print(f"span backlog after the run drained in {drain_ms:.1f} ms ({'ok' if drained else 'TIMED OUT'})")
    verdict = "OK" if worst <= 10_000 and drained else "OVER"
    print(f"worst added median: {worst / 1000:.2f} us per call (target <= 10 us): {verdict}")
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    raise SystemExit(main())
