"""Store benchmark: Parquet export throughput on one core and bytes/span, against OTLP.

    python benchmarks/store/bench_store.py [--spans 200000] [--batch 512]

Generates realistic kvtrace spans with the real SDK (see gen_spans.py), then times
``ParquetSpanExporter.export`` over batches of ``--batch`` spans (what BatchSpanProcessor hands
it; conversion + Parquet write + rename all inside the timed call) and the final ``shutdown``
(which merges batch files into segments).  Baselines, measured in the same run on the
same spans: OTLP JSON (the SDK's OTLP encoder + protobuf's MessageToJson) and OTLP protobuf,
for size; for speed, the OpenTelemetry SDK's own OTLP protobuf encoder (``encode_spans`` +
``SerializeToString``, what ``OTLPSpanExporter`` does before the network) timed on the same
batches, in rounds alternating with the exporter's.  Also timed: what the writer-process exporter
(``KVTRACE_WRITER_PROCESS``) costs the exporting process (stage one + pickle of each slice; the
conversion and write then run in the writer process).
Targets (issue #14): export >= 4x the OTLP protobuf encoder's spans/s, <= 60 B/span on disk; and
>= 200,000 spans/s exported.

A process's first export pays one-time costs (pyarrow lazily imports pandas on the first
``pa.array`` call, ~0.2-0.4 s CPU); the benchmark pays them in an untimed warm-up export, prints
them, and times steady state.  Rolls (merging batch files into segments) run on the export
thread when a partition's batch files reach KVTRACE_ROLL_BYTES or KVTRACE_ROLL_SECONDS; the
"incl. final roll/merge" line charges that work to the spans too.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gen_spans import generate  # noqa: E402

from kvtrace.store.exporter import ParquetSpanExporter  # noqa: E402
from kvtrace.store.files import list_files  # noqa: E402

TARGET_SPANS_S = 200_000
TARGET_BYTES = 60.0


def _dir_bytes(directory: str) -> int:
    return sum(os.path.getsize(p) for p in list_files(directory))


def _otlp_sizes(spans) -> tuple[int, int]:
    from google.protobuf.json_format import MessageToJson
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    proto = json_len = 0
    for i in range(0, len(spans), 512):
        msg = encode_spans(spans[i : i + 512])
        proto += len(msg.SerializeToString())
        json_len += len(MessageToJson(msg, indent=None).encode())
    return proto, json_len


def _export_run(spans, batch: int, directory: str) -> dict:
    exporter = ParquetSpanExporter(directory)  # default roll settings: no roll inside the timed loop
    batches = [spans[i : i + batch] for i in range(0, len(spans), batch)]
    gc.collect()
    t0 = time.process_time()
    for b in batches:
        exporter.export(b)
    t_export = time.process_time() - t0
    batch_bytes = _dir_bytes(directory)
    t1 = time.process_time()
    exporter.shutdown()
    t_roll = time.process_time() - t1
    return {
        "export_s": t_export,
        "roll_s": t_roll,
        "batch_bytes": batch_bytes,
        "segment_bytes": _dir_bytes(directory),
        "files": len(list_files(directory)),
    }


def _otlp_encode_s(spans, batch: int) -> float:
    """CPU seconds the SDK's OTLP protobuf encoder takes for ``spans`` in batches of ``batch``."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    batches = [spans[i : i + batch] for i in range(0, len(spans), batch)]
    gc.collect()
    t0 = time.process_time()
    for b in batches:
        encode_spans(b).SerializeToString()
    return time.process_time() - t0


def _handoff_s(spans, batch: int) -> float:
    """CPU seconds of the exporting process's part of the writer-process export (no writer)."""
    from kvtrace.store.writer_process import SLICE_SPANS, WriterProcessExporter

    exporter = WriterProcessExporter(tempfile.gettempdir())
    gc.collect()
    t0 = time.process_time()
    for i in range(0, len(spans), batch):
        b = spans[i : i + batch]
        for lo in range(0, len(b), SLICE_SPANS):
            exporter._encode(b[lo : lo + SLICE_SPANS])
    return time.process_time() - t0


def _warm_up(spans) -> float:
    """CPU seconds of a first export in this process (one-time imports), in a throwaway dir."""
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-warm-") as d:
        t0 = time.process_time()
        exporter = ParquetSpanExporter(d)
        exporter.export(spans[:64])
        exporter.shutdown()
        return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--batch", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (OTLP, export); the best of each")
    args = ap.parse_args(argv)
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}) if hasattr(os, "sched_setaffinity") else None
    spans = generate(args.spans)
    n = len(spans)
    proto, json_len = _otlp_sizes(spans)
    print(f"{n} spans, 11 per trace, pinned to one core; CPU time (process_time) of the export calls\n")
    print(f"{'measure':44} {'value':>12} {'vs OTLP JSON':>13}")
    print(f"{'OTLP JSON bytes/span (baseline)':44} {json_len / n:12.1f} {1.0:13.3f}")
    print(f"{'OTLP protobuf bytes/span':44} {proto / n:12.1f} {proto / json_len:13.3f}")
    print(f"{'first export in a process, one-time CPU ms':44} {_warm_up(spans) * 1e3:12.1f}")
    verdicts = []
    for batch in args.batch:
        export_s, roll_s, otlp_s, r = [], [], [], None
        for _ in range(args.rounds):  # alternating rounds: both see the same machine load
            otlp_s.append(_otlp_encode_s(spans, batch))
            with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as d:
                r = _export_run(spans, batch, d)
            export_s.append(r["export_s"])
            roll_s.append(r["roll_s"])
        best, best_otlp = min(export_s), min(otlp_s)
        rate, otlp_rate = n / best, n / best_otlp
        rate_all = n / (best + min(roll_s))
        seg = r["segment_bytes"] / n
        handoff = n / _handoff_s(spans, batch)
        print(f"{f'batch {batch}: OTLP protobuf encoder spans/s':44} {otlp_rate:12,.0f}")
        print(f"{f'batch {batch}: export spans/s (convert+write)':44} {rate:12,.0f}   {rate / otlp_rate:.2f}x OTLP")
        print(
            f"{f'batch {batch}: spans/s incl. final roll/merge':44} {rate_all:12,.0f}   "
            f"{rate_all / otlp_rate:.2f}x OTLP"
        )
        print(
            f"{f'batch {batch}: writer-process handoff spans/s':44} {handoff:12,.0f}   {handoff / otlp_rate:.2f}x OTLP"
        )
        print(
            f"{f'batch {batch}: batch files bytes/span':44} {r['batch_bytes'] / n:12.1f} "
            f"{r['batch_bytes'] / json_len:13.3f}"
        )
        print(f"{f'batch {batch}: rolled segments bytes/span':44} {seg:12.1f} {r['segment_bytes'] / json_len:13.3f}")
        verdicts.append((batch, rate, rate_all, seg, rate / otlp_rate, r["batch_bytes"] / n))
    print()
    for batch, rate, _rate_all, seg, ratio, batch_b in verdicts:
        print(
            f"batch {batch}: export {ratio:.2f}x the OTLP protobuf encoder (>= 4x): "
            f"{'HOLDS' if ratio >= 4 else 'MISSED'}; on disk {seg:.1f} B/span rolled, {batch_b:.1f} B/span in batch "
            f"files (<= {TARGET_BYTES:.0f}): {'HOLDS' if seg <= TARGET_BYTES else 'MISSED'} "
            f"({'HOLDS' if batch_b <= TARGET_BYTES else 'MISSED'}); "
            f"{TARGET_SPANS_S:,} spans/s: {'HOLDS' if rate >= TARGET_SPANS_S else 'MISSED'} ({rate:,.0f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
