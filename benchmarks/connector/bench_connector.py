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
median <= 10 us per call.  ``--metrics`` (default ``both``) also runs a third connector with
kvtrace's metrics off (``kvtrace.metrics: false``), interleaved with the other two, and prints the
cost of the metrics: per hook the median with metrics on vs off, including
``get_kv_connector_stats`` (the scheduler drains the counters there every step), and the API
server's side, ``observe()`` of the collected payloads into vllm:kvtrace_* (plus NIXL's families)
vs NIXL's families alone.  Run from the repository root with the project venv (it has vLLM's CPU
build; ``tests/`` holds the rig):

    PYTHONPATH=$PWD:$PWD/tests HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
        python benchmarks/connector/bench_connector.py [--requests 3000] [--spans sync] [--metrics both|on|off]

``--verify`` (default on; ``--no-verify`` skips it) also runs, interleaved with the others, a kvtrace
connector whose digest check is switched off (its probe's ``verify`` a no-op) and one with
``verify: enforce``, and prints per mode (``record``, the default, and ``enforce``) the cost of
verified reuse: P's check = check on - check off, the medians over the pulling requests of each
request's hook total (and of ``get_num_new_matched_tokens`` alone, where the check runs, in the hook,
in both modes: the verdict feeds the decision, its span and P's response entry), and D's
digest = the median of what ``request_finished`` adds on a retaining D (the probe's ``_digest`` over
a vLLM ``Request``'s ``all_token_ids``, timed right after each request's hooks, so as cold as in the
hook; the same in both modes).  Offers and D's digest are v2 (over the rig ``Request``'s vLLM block
hashes); a third arm, ``record_v1``, gets v1 offers and times D's v1 digest, for comparison.  Target
<= 5 us each, against the baseline in the same run.  The
offers match (D's digest of the prompt's first 250 tokens): ``enforce`` trims nothing.

``--export-stall STEPS [--batch 2048] [--writer-process]`` measures instead what an export running in
the engine process does to the scheduler: step time (one request's hooks) with and without a
Parquet export of a 2048-span batch running on the exporter's thread, p50 / p99 / max.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

# (verify mode, connector tag, digest version of its offers and of D's digest)
VERIFY_ARMS = (("record", "kvtrace", "v2"), ("enforce", "enforce", "v2"), ("record", "record_v1", "v1"))
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


class _Discard:
    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=0):
        return True


def _connectors(model_dir: Path, deferred: bool, metrics: bool = True, verify: str = "record"):
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
    provider.add_span_processor(BatchSpanProcessor(_Discard(), max_queue_size=65536))
    KVTraceNixlConnector.tracer_provider = provider
    KVTraceNixlConnector.deferred_spans = deferred
    wrapped = KVTraceNixlConnector(cfg, KVConnectorRole.SCHEDULER, kvc)
    bare = NixlConnector(cfg, KVConnectorRole.SCHEDULER, kvc)
    return wrapped, bare, provider


def _calls(i: int, conn_tag: str, block_config):
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


def _d_side(i: int, hashing):
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


def _observe_cost(model_dir: Path, payloads: list) -> tuple[float, float]:
    """Median ns of one observe() in the API server: vllm:kvtrace_* + vllm:nixl_* vs vllm:nixl_* alone."""
    from functools import partial

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlPromMetrics

    from kvtrace.vllm.metrics import NIXL_KEYS, KVTracePromMetrics

    from support import vllm_rig as rig

    cfg = rig.vllm_config(model_dir, extra={}, block_size=BS)
    medians = []
    for cls in (KVTracePromMetrics, NixlPromMetrics):
        reg = CollectorRegistry()
        types = {t: partial(t, registry=reg) for t in (Gauge, Counter, Histogram)}
        prom = cls(cfg, types, ["model_name", "engine"], {0: ["m", "0"]})
        times = []
        for data in payloads:
            if cls is NixlPromMetrics:  # what NixlConnector's own stats would carry: the NIXL part alone
                data = {key: data.get(key) or [] for key in NIXL_KEYS}
            t0 = time.perf_counter_ns()
            prom.observe(data, 0)
            times.append(time.perf_counter_ns() - t0)
        medians.append(statistics.median(times))
    return medians[0], medians[1]


def _export_stall(model_dir: Path, steps: int, batch: int, writer_process: bool) -> None:
    """Scheduler-step time while kvtrace's Parquet export of a ``batch``-span batch runs on its
    thread in the same process (as the BatchSpanProcessor does inside vLLM's EngineCore), beside
    the same steps with no export running, alternating blocks of steps so both see the same machine
    noise.  A step = one request's scheduler hooks on the kvtrace connector.  The batch is the
    connector's own spans (captured first).  With ``writer_process`` the exporter hands the columns
    to kvtrace's writer process (KVTRACE_WRITER_PROCESS=1) instead of writing in this process."""
    import threading

    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from kvtrace.store.exporter import ParquetSpanExporter

    wrapped, _, provider = _connectors(model_dir, deferred=True)
    captured = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(captured))
    i = 0
    while len(captured.get_finished_spans()) < batch:
        for _, call in _calls(i, "kvtrace"):
            call(wrapped)
        i += 1
        wrapped._probe.recorder.flush(30)
    spans = list(captured.get_finished_spans())[:batch]
    if writer_process:
        from kvtrace.store.writer_process import WriterProcessExporter

        exporter = WriterProcessExporter(tempfile.mkdtemp())
    else:
        exporter = ParquetSpanExporter(tempfile.mkdtemp())
    exporting = threading.Event()
    stop = threading.Event()
    exports = []

    def exporter_loop():
        while not stop.is_set():
            exporting.wait()
            if stop.is_set():
                break
            t0 = time.perf_counter_ns()
            exporter.export(spans)
            exports.append(time.perf_counter_ns() - t0)

    thread = threading.Thread(target=exporter_loop, daemon=True)
    thread.start()
    quiet, busy = [], []
    block = 50
    for k in range(steps // block):
        on = k % 2 == 1
        (exporting.set if on else exporting.clear)()
        for _ in range(block):
            t0 = time.perf_counter_ns()
            for _, call in _calls(i, "kvtrace"):
                call(wrapped)
            (busy if on else quiet).append(time.perf_counter_ns() - t0)
            i += 1
    stop.set()
    exporting.set()
    thread.join(60)
    exporter.shutdown()
    provider.shutdown()

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] / 1000

    mode = "writer process" if writer_process else "in-process Parquet export"
    print(
        f"scheduler step while exporting {batch}-span batches ({mode}; {len(exports)} exports, median "
        f"{statistics.median(exports) / 1e6 if exports else float('nan'):.1f} ms each), {steps} steps, us:"
    )
    print(f"  {'':12s} {'p50':>8s} {'p99':>8s} {'max':>9s}")
    for name, xs in (("no export", quiet), ("exporting", busy)):
        print(f"  {name:12s} {pct(xs, 0.5):8.1f} {pct(xs, 0.99):8.1f} {max(xs) / 1000:9.1f}")
    print(
        f"  added: p50 {pct(busy, 0.5) - pct(quiet, 0.5):+.1f} us, p99 {pct(busy, 0.99) - pct(quiet, 0.99):+.1f} us, "
        f"max {(max(busy) - max(quiet)) / 1000:+.1f} us (target: no stall, p99 added <= 2 ms)"
    )


def _print_verify(samples: dict, d_sides: dict[str, float], warm: int) -> None:
    """Verified reuse per mode: P's check (pulling requests) and D's digest, with the target verdict."""

    def per_request(tag: str) -> float:  # median over the pulling requests (odd i) of their hooks' total
        totals = [sum(col) for col in zip(*(samples[(tag, h)] for h in HOOKS), strict=True)]
        return statistics.median(totals[warm + (warm % 2 == 0) :: 2])

    def in_hook(tag: str) -> float:
        return statistics.median(samples[(tag, "get_num_new_matched_tokens")][warm + (warm % 2 == 0) :: 2])

    off, off_hook = per_request("verify_off"), in_hook("verify_off")
    print(
        "verified reuse, us per request (target <= 5 us each): P = check on - off on the pulling requests "
        "(median of each request's hook total; the check's own hook), D = digest in request_finished (250 tokens)"
    )
    for mode, tag, version in VERIFY_ARMS:
        check, hook = per_request(tag) - off, in_hook(tag) - off_hook
        d_side = d_sides[version]
        verdicts = " ".join(f"{who} {'OK' if ns <= 5000 else 'OVER'}" for who, ns in (("P", check), ("D", d_side)))
        print(
            f"  {version} {mode:8s} P's check {check / 1000:+6.1f} (get_num_new_matched_tokens {hook / 1000:+6.1f}), "
            f"D's digest {d_side / 1000:5.1f}: {verdicts}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--spans", choices=("deferred", "sync"), default="deferred")
    ap.add_argument(
        "--metrics",
        choices=("both", "on", "off"),
        default="both",
        help="kvtrace metrics in the measured connector; both = also a metrics-off connector",
    )
    ap.add_argument(
        "--export-stall",
        type=int,
        default=0,
        metavar="STEPS",
        help="instead: scheduler-step time with and without a Parquet export running (STEPS steps)",
    )
    ap.add_argument("--batch", type=int, default=2048, help="--export-stall: spans per export (default 2048)")
    ap.add_argument("--writer-process", action="store_true", help="--export-stall: export via the writer process")
    ap.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure the digest check (a connector with it off) and D's digest",
    )
    args = ap.parse_args(argv)
    from support import vllm_rig as rig

    model_dir = rig.make_tiny_model(Path(tempfile.mkdtemp()) / "model")
    if args.export_stall:
        _export_stall(model_dir, args.export_stall, args.batch, args.writer_process)
        return 0
    deferred = args.spans == "deferred"
    wrapped, bare, provider = _connectors(model_dir, deferred, metrics=args.metrics != "off")
    conns = {"kvtrace": wrapped, "bare": bare}
    if args.metrics == "both":
        conns["metrics_off"] = _connectors(model_dir, deferred, metrics=False)[0]
    if args.verify:
        unchecked = _connectors(model_dir, deferred, metrics=args.metrics != "off")[0]
        unchecked._probe.verify = lambda request: None  # the same connector without the digest check
        conns["verify_off"] = unchecked
        conns["enforce"] = _connectors(model_dir, deferred, metrics=args.metrics != "off", verify="enforce")[0]
        conns["record_v1"] = _connectors(model_dir, deferred, metrics=args.metrics != "off")[0]
    samples = {(tag, h): [] for tag in conns for h in HOOKS}
    d_digest: dict[str, list[int]] = {"v2": [], "v1": []}
    rig.request([1])  # NONE_HASH, as EngineCore initialises it before the first request
    blocks = wrapped._probe.hashing.config()
    if blocks is None:
        raise SystemExit("the connector has no block-hash configuration: digest v2 cannot be measured")
    payloads = []
    clock = time.perf_counter_ns
    order = list(conns.items())
    for i in range(args.requests):
        digests = _d_side(i, wrapped._probe.hashing) if args.verify else None
        for tag, conn in order[i % len(order) :] + order[: i % len(order)]:  # rotate: same noise for each
            for hook, call in _calls(i, tag, blocks):
                t0 = clock()
                result = call(conn)
                samples[(tag, hook)].append(clock() - t0)
                if hook == "get_kv_connector_stats" and tag == "kvtrace" and result is not None:
                    payloads.append(result.to_dict())
            if digests is not None and tag in ("kvtrace", "record_v1"):  # each right after a connector's hooks
                version = "v2" if tag == "kvtrace" else "v1"
                t0 = clock()
                digests[version]()
                d_digest[version].append(clock() - t0)
    t0 = clock()
    drained = wrapped._probe.recorder.flush(120)
    drain_ms = (clock() - t0) / 1e6
    provider.shutdown()
    warm = args.requests // 10
    print(
        f"spans={args.spans} metrics={args.metrics} requests={args.requests} (first {warm} dropped as warm-up); "
        "median ns per call"
    )
    med = {k: statistics.median(v[warm:]) for k, v in samples.items()}
    extra = f" {'off':>9s} {'on-off':>8s} {'on/off':>6s}" if "metrics_off" in conns else ""
    print(f"{'hook':30s} {'bare':>9s} {'kvtrace':>9s} {'added':>9s} {'ratio':>6s}{extra}")
    worst = 0.0
    for hook in HOOKS:
        b, w = med[("bare", hook)], med[("kvtrace", hook)]
        worst = max(worst, w - b)
        line = f"{hook:30s} {b:9.0f} {w:9.0f} {w - b:9.0f} {w / b if b else float('nan'):6.2f}"
        if "metrics_off" in conns:
            off = med[("metrics_off", hook)]
            line += f" {off:9.0f} {w - off:8.0f} {w / off if off else float('nan'):6.2f}"
        print(line)
    if "metrics_off" in conns:
        on = sum(med[("kvtrace", h)] for h in HOOKS)
        off = sum(med[("metrics_off", h)] for h in HOOKS)
        print(f"metrics cost per request (sum of hook medians): {on - off:.0f} ns ({on / off:.3f}x of metrics off)")
    if args.verify:
        _print_verify(samples, {v: statistics.median(ns[warm:]) for v, ns in d_digest.items()}, warm)
    if payloads:
        with_kv, nixl_only = _observe_cost(model_dir, payloads)
        print(
            f"API server observe() per stats payload: {with_kv:.0f} ns with vllm:kvtrace_* vs {nixl_only:.0f} ns "
            f"NIXL only ({with_kv / nixl_only:.2f}x; {len(payloads)} payloads)"
        )
    if deferred:
        print(f"span backlog after the run drained in {drain_ms:.1f} ms ({'ok' if drained else 'TIMED OUT'})")
    verdict = "OK" if worst <= 10_000 and drained else "OVER"
    print(f"worst added median: {worst / 1000:.2f} us per call (target <= 10 us): {verdict}")
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    raise SystemExit(main())
