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

# after tests/ is on the path: connector_rig imports the rig from there
from connector_rig import BS, HOOKS, d_side_calls, make_connectors, request_calls  # noqa: E402

# (verify mode, connector tag, digest version of its offers and of D's digest)
VERIFY_ARMS = (("record", "kvtrace", "v2"), ("enforce", "enforce", "v2"), ("record", "record_v1", "v1"))


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

    wrapped, _, provider = make_connectors(model_dir, deferred=True)
    captured = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(captured))
    i = 0
    while len(captured.get_finished_spans()) < batch:
        for _, call in request_calls(i, "kvtrace"):
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
            for _, call in request_calls(i, "kvtrace"):
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
    wrapped, bare, provider = make_connectors(model_dir, deferred, metrics=args.metrics != "off")
    conns = {"kvtrace": wrapped, "bare": bare}
    if args.metrics == "both":
        conns["metrics_off"] = make_connectors(model_dir, deferred, metrics=False)[0]
    if args.verify:
        unchecked = make_connectors(model_dir, deferred, metrics=args.metrics != "off")[0]
        unchecked._probe.verify = lambda request: None  # the same connector without the digest check
        conns["verify_off"] = unchecked
        conns["enforce"] = make_connectors(model_dir, deferred, metrics=args.metrics != "off", verify="enforce")[0]
        conns["record_v1"] = make_connectors(model_dir, deferred, metrics=args.metrics != "off")[0]
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
        digests = d_side_calls(i, wrapped._probe.hashing) if args.verify else None
        for tag, conn in order[i % len(order) :] + order[: i % len(order)]:  # rotate: same noise for each
            for hook, call in request_calls(i, tag, blocks):
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
