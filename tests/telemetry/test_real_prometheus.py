"""Proof with a real Prometheus server: `kvtrace bench` through `kvtrace proxy` over `kvtrace sim`.

Processes (all on 127.0.0.1, Parquet traces into one directory): a zero-cost simulated 1 P + 1 D
cluster (time compressed 100x: decoder_kv_blocks_ttl 300 s = 3 s wall; kv_load_failure_policy
recompute), the kvtrace proxy, and Prometheus scraping the proxy and both workers every second.
Two bench runs of one session each: ``pause-resume`` (turn 1 pulls D's blocks; the resumed turn
comes after D's retention expired, so P's read is declined: outcome expired, P recomputes) and
``short-followups`` (below_threshold).

Once D holds nothing (every retention read or expired) and Prometheus has scraped every target
after that, the test checks that

- every PromQL expression of dashboards/grafana/kvtrace.json returns data;
- the counters equal the spans in the Parquet store (read after the processes flushed them):
  decisions by direction and outcome, prompt tokens by source, transfers by status, bytes
  pulled, retention ends by outcome, retained byte-seconds, proxy requests by status and offer
  reason, proxy TTFT observations by outcome.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kvtrace import semconv as sc

from support import prom_check as pc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
KV_CONFIG = {
    "kv_connector": "NixlConnector",
    "kv_role": "kv_both",
    "kv_load_failure_policy": "recompute",
    "kv_connector_extra_config": {"bidirectional_kv_xfer": True, "decoder_kv_blocks_ttl": 300},
}


def _spawn(args: list[str], log_dir, name: str) -> subprocess.Popen:
    log = open(log_dir / f"{name}.log", "wb")
    return subprocess.Popen(
        [sys.executable, "-m", "kvtrace.cli", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "KVTRACE_BATCH_DELAY_MS": "200"},
    )


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # SIGTERM flushes the spans
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("prom")
    traces = base / "traces"
    p_port, d_port, proxy_port = pc.free_port(), pc.free_port(), pc.free_port()
    sim = _spawn(
        [
            "sim",
            "--prefill-port",
            str(p_port),
            "--decode-port",
            str(d_port),
            "--time-scale",
            "100",
            "--no-cost",
            "--traces",
            str(traces),
            "--kv-transfer-config",
            json.dumps(KV_CONFIG),
        ],
        base,
        "sim",
    )
    proxy = _spawn(
        [
            "proxy",
            "--port",
            str(proxy_port),
            "--prefiller-host",
            "127.0.0.1",
            "--prefiller-port",
            str(p_port),
            "--decoder-host",
            "127.0.0.1",
            "--decoder-port",
            str(d_port),
            "--traces",
            str(traces),
        ],
        base,
        "proxy",
    )
    procs = [proxy, sim]
    prom = pc.Prometheus(
        base / "prometheus",
        {
            "kvtrace-proxy": [f"127.0.0.1:{proxy_port}"],
            "kvtrace-sim": [f"127.0.0.1:{p_port}", f"127.0.0.1:{d_port}"],
        },
    )
    out = {"traces": traces, "prom": prom, "base": base}
    try:
        urls = [f"http://127.0.0.1:{p}" for p in (p_port, d_port, proxy_port)]
        prom.wait_for(lambda: all(pc.healthy(u) for u in urls), 60, "sim and proxy up")
        prom.start()
        prom.wait_up()
        for scenario in ("pause-resume", "short-followups"):
            bench = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "kvtrace.cli",
                    "bench",
                    "--url",
                    urls[2],
                    "--scenario",
                    scenario,
                    "--sessions",
                    "1",
                    "--time-scale",
                    "0.01",
                    "--traces",
                    str(traces),
                    "--no-progress",
                    "--request-timeout",
                    "60",
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            out[scenario] = bench
            assert bench.returncode == 0, bench.stdout + bench.stderr
        # D holds nothing once every retention was read or expired (3 s TTL): nothing changes after
        prom.wait_scraped_after(time.time())
        prom.wait_for(lambda: prom.query(f"sum({sc.METRIC_KV_RETAINED_BLOCKS}) == 0"), 30, "D's retention ended")
        prom.wait_scraped_after(time.time())
        out["dashboard"] = pc.empty_queries(prom, pc.dashboard_queries())
        out["queries"] = {expr: prom.query(expr) for _, expr in pc.dashboard_queries()}
        got = pc.prometheus_totals(prom, proxy=True)  # before the targets go away (stale series)
        _stop(procs)  # flushes the spans
        out["totals"] = pc.comparable(got), pc.comparable(pc.span_totals(traces, proxy=True))
        yield out
    finally:
        _stop(procs)
        prom.stop()


def test_every_dashboard_query_returns_data(run):
    assert run["dashboard"] == []


def test_key_panels_show_the_workload(run):
    q = run["queries"]
    pulls = f'sum(rate({sc.METRIC_KV_DECISIONS}_total{{direction="d2p",outcome="pulled",model_name=~".*"}}[1m]))'
    assert q[pulls][0]["value"] > 0
    outcomes = next(v for k, v in q.items() if k.startswith("sum by (outcome) (rate(vllm:kvtrace_decisions_total"))
    seen = {r["metric"]["outcome"] for r in outcomes if r["value"] > 0}
    assert {sc.OUTCOME_PULLED, sc.OUTCOME_EXPIRED, sc.OUTCOME_BELOW_THRESHOLD, sc.OUTCOME_NO_REMOTE} <= seen
    ttft = [v for k, v in q.items() if k.startswith("histogram_quantile(0.99, sum by (le) (rate(kvtrace_proxy")]
    assert ttft and pc.finite(r["value"] for r in ttft[0]) and ttft[0][0]["value"] > 0


def test_counters_equal_spans(run):
    got, want = run["totals"]
    assert want["decisions"][(sc.DIRECTION_D2P, sc.OUTCOME_PULLED)] > 0  # the workload did what it should
    assert want["decisions"][(sc.DIRECTION_D2P, sc.OUTCOME_EXPIRED)] > 0
    assert want["retention_ends"][(sc.RETENTION_EXPIRED,)] > 0 and want["retention_ends"][(sc.RETENTION_READ,)] > 0
    assert want["proxy_requests"][("200", sc.OFFER_OFFERED)] > 0
    assert got == want
