"""SimCluster wiring (providers, resources, cost path) and the ``kvtrace sim`` command."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import urllib.request

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvtrace import cli
from kvtrace import semconv as sc
from kvtrace.sim.cluster import SimCluster
from kvtrace.sim.costmodel import CostModel
from kvtrace.telemetry import make_resource


async def test_one_provider_per_worker_with_sim_resource():
    made = []

    def factory(service, attrs):
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=make_resource(service, attrs))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        made.append((service, attrs, exporter))
        return provider

    async with SimCluster(2, 1, cost=False, time_scale=4.0, preset="glm5-fp8", tracer_provider_factory=factory) as c:
        assert len(c.prefill_urls) == 2 and len(c.decode_urls) == 1
        async with aiohttp.ClientSession() as s:
            async with s.post(c.prefill_urls[1] + "/v1/completions", json={"prompt": "hello ", "max_tokens": 1}) as r:
                assert r.status == 200
    assert [(svc, a[sc.ENGINE_ID], a[sc.ENGINE_ROLE]) for svc, a, _ in made] == [
        ("kvtrace-sim-prefill", "sim-prefill-0", sc.ROLE_PREFILL),
        ("kvtrace-sim-prefill", "sim-prefill-1", sc.ROLE_PREFILL),
        ("kvtrace-sim-decode", "sim-decode-0", sc.ROLE_DECODE),
    ]
    exported = made[1][2].get_finished_spans()
    assert {s.name for s in exported} == {sc.SPAN_ENGINE_PREFILL, sc.SPAN_KV_DECISION}
    res = dict(exported[0].resource.attributes)
    assert {
        k: res[k]
        for k in (
            sc.SERVICE_NAME,
            sc.SUBSTRATE,
            sc.ENGINE_ID,
            sc.ENGINE_ROLE,
            sc.SIM_TIME_SCALE,
            sc.SIM_PRESET,
            sc.SIM_CLOCK,
            sc.ENGINE_KV_POOL_BYTES,
        )
    } == {
        sc.SERVICE_NAME: "kvtrace-sim-prefill",
        sc.SUBSTRATE: sc.SUBSTRATE_SIM,
        sc.ENGINE_ID: "sim-prefill-1",
        sc.ENGINE_ROLE: sc.ROLE_PREFILL,
        sc.SIM_TIME_SCALE: 4.0,
        sc.SIM_PRESET: "glm5-fp8",
        sc.SIM_CLOCK: sc.CLOCK_WALL,
        sc.ENGINE_KV_POOL_BYTES: 65536 * 64 * 61_464,
    }  # capacity blocks x block size (glm5-fp8: 64, vLLM's sparse MLA) x glm5-fp8 bytes/token
    assert made[0][2].get_finished_spans() == ()


async def test_cost_mode_records_scaled_transfer_time(tracer_provider, span_exporter):
    scale = 10_000.0
    lease = {"kv_connector_extra_config": {"kv_lease_duration": 1e7}}  # 30 s / 10^4 would lapse in 3 ms
    async with (
        SimCluster(cost=True, time_scale=scale, tracer_provider=tracer_provider, link="tcp-100", kv_config=lease) as c,
        aiohttp.ClientSession() as s,
    ):
        prompt = list(range(1, 101))
        body = {"prompt": prompt, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        async with s.post(c.prefill_urls[0] + "/v1/completions", json=body, headers={"X-Request-Id": "x"}) as r:
            p = (await r.json())["kv_transfer_params"]
        body = {"prompt": prompt, "max_tokens": 3, "kv_transfer_params": p}
        async with s.post(c.decode_urls[0] + "/v1/completions", json=body, headers={"X-Request-Id": "x"}) as r:
            assert r.status == 200
    t = [sp for sp in span_exporter.get_finished_spans() if sp.name == sc.SPAN_KV_TRANSFER]
    assert len(t) == 1
    nbytes = math.ceil(100 / 16) * 16 * 262_144
    assert t[0].attributes[sc.KV_TRANSFER_BYTES] == nbytes
    expect_ms = round(CostModel("qwen3-32b", "tcp-100").transfer_s(nbytes) / scale * 1000, 3)
    assert t[0].attributes[sc.KV_TRANSFER_XFER_MS] == expect_ms


def test_cli_rejects_bad_config(capsys):
    assert cli.main(["sim", "--kv-transfer-config", "{bad"]) == 2
    assert "--kv-transfer-config is not valid JSON" in capsys.readouterr().err
    assert cli.main(["sim", "--prefill", "0", "--decode", "0"]) == 2
    assert cli.main(["sim", "--time-scale", "0"]) == 2


@pytest.mark.parametrize("env", [False, True])
def test_cli_refuses_an_unwritable_trace_directory_before_starting(tmp_path, capsys, monkeypatch, env):
    """--traces (or KVTRACE_TRACES_DIR) through a regular file: one line, exit 2, no worker started."""
    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "traces"
    monkeypatch.setattr("kvtrace.cli.sim._serve", lambda *a: pytest.fail("workers started"))
    if env:
        monkeypatch.setenv("KVTRACE_TRACES_DIR", str(target))
    assert cli.main(["sim", *([] if env else ["--traces", str(target)])]) == 2
    assert capsys.readouterr().err == f"kvtrace sim: error: cannot write traces to {target}: Not a directory\n"


def test_cli_serves_until_sigint():
    env = {**os.environ, "KVTRACE_OTLP": "off"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "sim",
            "--no-cost",
            "--prefill-port",
            "0",
            "--decode-port",
            "0",
            "--decode",
            "2",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        urls = [line.split()[-1] for line in lines[1:]]
        assert [line.split()[0] for line in lines[1:]] == ["prefill", "decode", "decode"]
        for url in urls:
            with urllib.request.urlopen(url + "/health", timeout=10) as resp:
                assert resp.status == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        assert "stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
