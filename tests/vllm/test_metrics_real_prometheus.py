"""Real vLLM (CPU build, NIXL) behind the kvtrace proxy, scraped by a real Prometheus.

A small P/D pair (tests/support/vllm_pd.py's Server: the kvtrace connector, bidirectional, threshold 64)
and ``kvtrace proxy`` in front; Prometheus scrapes both vLLM servers' own /metrics and the
proxy's every second.  One conversation, three non-streaming turns through the proxy:

  turn 0: 300 prompt tokens, D generates 100 (P: no_remote; D retains 399 tokens);
  turn 1: turn 0 + 99 + 122 new tokens: P holds 256 locally, D offers 399 -> P pulls 143;
  turn 2: turn 1 + 19 + 30 new tokens: P holds 512, D offers 540 -> 28 < 64 -> below_threshold.

Then (deadline-bounded polls, no sleeps): Prometheus shows all six decisions and D holding only
turn 2's blocks; every PromQL expression of dashboards/grafana/kvtrace.json returns data; and
the counters equal the spans the servers exported to Parquet (polled until the export caught
up).  vLLM's /metrics is scraped with prom_check.VLLM_COLON_FIX (prometheus_client's OpenMetrics
output drops the colon of vllm:* sample names; see README "Metrics").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from kvtrace import semconv as sc
from kvtrace.testing.wait import wait_for

from support.require import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]
require_vllm()
require_vllm("nixl")

from support import prom_check as pc  # noqa: E402
from support import vllm_pd as pd  # noqa: E402
from support import vllm_rig as rig  # noqa: E402

CONVERSATION = "conv-metrics"


def _ids(seed: int, n: int) -> list[int]:
    return [5 + (seed * 131 + i * 37) % 500 for i in range(n)]


def _turn(proxy_url: str, prompt: list[int], max_tokens: int) -> dict:
    body = {
        "model": pd.MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "conversation_id": CONVERSATION,
    }
    req = urllib.request.Request(
        proxy_url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("vllm-metrics")
    model = rig.make_tiny_model(base / "model")
    traces = base / "traces"
    p = pd.Server("p", "prefill", model, traces, base)
    d = pd.Server("d", "decode", model, traces, base)
    proxy_port = pc.free_port()
    prom = pc.Prometheus(
        base / "prometheus",
        {"vllm": [f"127.0.0.1:{p.port}", f"127.0.0.1:{d.port}"], "kvtrace-proxy": [f"127.0.0.1:{proxy_port}"]},
        fix_vllm_colons={"vllm"},
    )
    proxy = None
    out = {"traces": traces}
    servers = pd.Rig([p, d])
    try:
        servers.start(deadline_s=600)  # start-up takes minutes when the shared cores are busy
        proxy = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvtrace.cli",
                "proxy",
                "--port",
                str(proxy_port),
                "--prefiller-host",
                "127.0.0.1",
                "--prefiller-port",
                str(p.port),
                "--decoder-host",
                "127.0.0.1",
                "--decoder-port",
                str(d.port),
                "--traces",
                str(traces),
                # the turns are token ids whose "answers" are made up: the proxy's identity check would
                # (rightly) refuse to offer them; this test is about counters, so it offers by id alone
                "--no-prefix-match",
                "--read-timeout",
                "300",
            ],
            stdout=open(base / "proxy.log", "wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "KVTRACE_BATCH_DELAY_MS": "200"},
        )
        servers.wait_for(lambda: pc.healthy(f"http://127.0.0.1:{proxy_port}"), deadline_s=60, what="kvtrace proxy")
        prom.start()
        prom.wait_up()
        url = f"http://127.0.0.1:{proxy_port}"
        a0 = _ids(1, 300)
        out["t0"] = _turn(url, a0, 100)
        a1 = a0 + _ids(9, 99) + _ids(2, 122)
        out["t1"] = _turn(url, a1, 20)
        a2 = a1 + _ids(10, 19) + _ids(3, 30)
        out["t2"] = _turn(url, a2, 4)
        held = out["t2"][sc.RESPONSE_KV_TRANSFER][sc.KVT_RETAINED_BLOCKS]
        # all six decisions reached vLLM's /metrics, and D holds turn 2's blocks only
        prom.wait_for(
            lambda: (
                prom.query(f"sum({sc.METRIC_KV_DECISIONS}_total) == 6")
                and prom.query(f"sum({sc.METRIC_KV_RETAINED_BLOCKS}) == {held}")
            ),
            120,
            "vLLM's connector metrics in Prometheus",
        )
        prom.wait_scraped_after(time.time())
        # the queries with no data, until none: a ``rate(...[1m])`` needs two samples of a series in its
        # window, and a series born at a request's end may have had one scrape since
        out["dashboard"] = _settled(lambda: pc.empty_queries(prom, pc.dashboard_queries()), lambda e: not e, 60)
        got = pc.comparable(pc.prometheus_totals(prom, proxy=True))
        out["got"] = got
        # spans reach Parquet in batches: poll until the store says the same (or the deadline)
        out["want"] = _settled(lambda: pc.comparable(pc.span_totals(traces, proxy=True)), lambda w: w == got, 90)
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(30)
        servers.stop()
        prom.stop()
    return out


def _settled(fetch, done, deadline_s: float):
    """``fetch()`` polled until ``done`` of it (or the deadline); the last value, which the test then
    checks and reports."""
    last = []

    def settled() -> bool:
        last[:] = [fetch()]
        return done(last[0])

    try:
        wait_for(settled, deadline_s, "settled values", interval=0.5)
    except TimeoutError:
        pass  # the test's own assertion on the last value says what differs
    return last[0]


def test_the_turns_did_what_the_metrics_must_show(run):
    outcomes = [run[t][sc.RESPONSE_KV_TRANSFER][sc.KVT_DECISION] for t in ("t0", "t1", "t2")]
    assert outcomes == [sc.OUTCOME_NO_REMOTE, sc.OUTCOME_PULLED, sc.OUTCOME_BELOW_THRESHOLD]
    assert run["got"]["decisions"][(sc.DIRECTION_D2P, sc.OUTCOME_PULLED)] == 1
    assert (
        run["got"]["tokens"][(sc.DIRECTION_D2P, sc.SOURCE_PULLED)]
        == run["t1"][sc.RESPONSE_KV_TRANSFER][sc.KVT_PULLED_TOKENS]
        >= 64
    )


def test_counters_equal_spans(run):
    assert run["got"] == run["want"]


def test_every_dashboard_query_returns_data(run):
    assert run["dashboard"] == []
