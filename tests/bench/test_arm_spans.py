"""An in-process arm exports every component's spans through one sink (kvtrace.bench.armspans):
the rows, and every view over them, are those of a provider and an exporter per component (what
``kvtrace sim`` + ``kvtrace proxy`` write), row for row, ids and timestamps included; only the
files differ (fewer)."""

from __future__ import annotations

import glob

import pyarrow.parquet as pq
import pytest

from kvtrace.bench import armspans, inproc
from kvtrace.bench.fleet import Fleet
from kvtrace.sim import virtual
from kvtrace.store import reader

pytest.importorskip("aiohttp")
pytest.importorskip("openai")


def _run(run_dir: str, monkeypatch, per_component: bool):
    cfg = dict(input="mooncake-conversation", sessions=12, nonce="s")
    with monkeypatch.context() as m:
        if per_component:
            m.setattr(armspans, "sink", armspans.PerComponent)
        main = inproc.run_arm(run_dir, "qwen3-32b", True, True, "efa-3200", cfg, "A", 450.0, None, Fleet(2, 2))
        return virtual.run(main, seed=5)


def _rows(run_dir: str) -> dict:
    out = {}
    for path in glob.glob(f"{run_dir}/**/*.parquet", recursive=True):
        for r in pq.read_table(path).to_pylist():
            key = (r["TraceId"], r["SpanId"])
            assert key not in out  # each span once
            out[key] = r
    return out


def _views(run_dir: str) -> dict:
    con = reader.connect(run_dir, scan_index=False)
    out = {}
    for name in reader.view_columns(con):
        rows = con.execute(f"SELECT * FROM {name}").fetchall()
        out[name] = sorted(rows, key=repr)
    return out


def test_one_sink_writes_the_rows_and_views_of_a_provider_per_component(tmp_path, monkeypatch):
    before, after = str(tmp_path / "per-component"), str(tmp_path / "one-sink")
    a_result = _run(before, monkeypatch, per_component=True)
    b_result = _run(after, monkeypatch, per_component=False)
    a, b = _rows(before), _rows(after)
    services = {r["ServiceName"] for r in a.values()}
    assert len(a) > 100 and len(services) >= 3  # proxy, bench, P and D workers
    assert a.keys() == b.keys()
    assert {k: v for k, v in a.items() if v != b[k]} == {}
    assert _views(before) == _views(after)
    assert [(r.session, r.call, r.latency_ms, r.error) for r in a_result.requests] == [
        (r.session, r.call, r.latency_ms, r.error) for r in b_result.requests
    ]
    # the sink's files: one per hour partition the arm's spans fall in (no batch file left behind)
    n_files = len(glob.glob(f"{after}/**/*.parquet", recursive=True))
    hours = {(r["Timestamp"].date(), r["Timestamp"].hour) for r in b.values()}
    assert n_files == len(hours) < len(glob.glob(f"{before}/**/*.parquet", recursive=True))


def test_the_workers_fast_spans_are_the_sdk_tracers_spans(tmp_path, monkeypatch):
    """The simulated workers' KV spans through kvtrace.telemetry.fastspans (SimCluster's default)
    are the SDK tracer's, row for row, on a 2P2D Mooncake arm."""
    from kvtrace.sim import cluster

    rows = {}
    for fast in (False, True):
        monkeypatch.setattr(cluster, "FAST_SPANS", fast)
        run_dir = str(tmp_path / f"fast-{fast}")
        _run(run_dir, monkeypatch, per_component=False)
        rows[fast] = _rows(run_dir)
    a, b = rows[False], rows[True]
    assert len(a) > 100 and a.keys() == b.keys()
    assert {k: v for k, v in a.items() if v != b[k]} == {}


def test_with_otlp_export_on_an_arm_keeps_an_exporter_per_component(monkeypatch, tmp_path):
    """The sink writes Parquet only: where spans also go to OTLP, every component keeps its own
    providers' exporters (kvtrace.configure's), as served."""
    monkeypatch.setenv("KVTRACE_OTLP", "off")
    assert isinstance(armspans.sink(str(tmp_path)), armspans.ArmSpans)
    monkeypatch.setenv("KVTRACE_OTLP", "on")
    assert isinstance(armspans.sink(str(tmp_path)), armspans.PerComponent)
