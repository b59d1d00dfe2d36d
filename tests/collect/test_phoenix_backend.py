"""Proven against a real OTel backend: Arize Phoenix (from PyPI, extra ``phoenix``) receives a
simulated P/D workload over OTLP gRPC and HTTP/protobuf; its REST and GraphQL APIs then show
every span, its parent link and the session ids.

Skipped when Phoenix is not installed, except under CI=true where that is a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.testing.wait import free_port, wait_for

from support.sim_workload import read_rows, run_workload

pytestmark = pytest.mark.slow
STARTUP_S = 120.0
INGEST_S = 60.0


def _require_phoenix() -> str:
    """The ``phoenix`` command: KVTRACE_PHOENIX_BIN (scripts/test.sh installs Phoenix in its own
    venv, since its pins clash with vLLM's), else the one beside an importable ``phoenix``."""
    if settings.PHOENIX_BIN.get():
        return settings.PHOENIX_BIN.get()
    if importlib.util.find_spec("phoenix") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("arize-phoenix is not installed (pip install -e '.[phoenix]' or set KVTRACE_PHOENIX_BIN)")
        pytest.skip("arize-phoenix not installed (pip install -e '.[phoenix]' or set KVTRACE_PHOENIX_BIN)")
    exe = shutil.which("phoenix", path=os.path.dirname(sys.executable)) or shutil.which("phoenix")
    assert exe, "phoenix is importable but its 'phoenix' command is missing"
    return exe


def _get(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=10) as resp:
        return json.load(resp)


def _graphql(base: str, query: str) -> dict:
    req = urllib.request.Request(
        base + "/graphql", data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = json.load(resp)
    assert not body.get("errors"), body
    return body["data"]


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    exe = _require_phoenix()
    http_port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(http_port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": str(tmp_path_factory.mktemp("phoenix")),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = open(tmp_path_factory.mktemp("phoenix-log") / "phoenix.log", "w+")
    proc = subprocess.Popen([exe, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{http_port}"

    def healthy():
        assert proc.poll() is None, f"phoenix exited: {open(log.name).read()[-3000:]}"
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=10) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    try:
        wait_for(healthy, STARTUP_S, "phoenix to start")
        yield {"base": base, "grpc": f"http://127.0.0.1:{grpc_port}", "http": f"{base}/v1/traces"}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()


def _phoenix_spans(base: str) -> list[dict]:
    spans, cursor = [], None
    while True:
        page = _get(base, "/v1/projects/default/spans?limit=1000" + (f"&cursor={cursor}" if cursor else ""))
        spans += page["data"]
        cursor = page.get("next_cursor")
        if not cursor:
            return spans


def test_phoenix_receives_spans_parents_and_sessions(phoenix, tmp_path, monkeypatch):
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "KVTRACE_TRACES_DIR"):
        monkeypatch.delenv(var, raising=False)
    for protocol, endpoint in (("grpc", phoenix["grpc"]), ("http/protobuf", phoenix["http"])):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
        run_workload(traces_dir=tmp_path / "parquet", otlp="on", sessions=2, turns=2, prefix=f"{protocol}-")

    expected = read_rows(tmp_path / "parquet")
    assert len(expected) >= 2 * 2 * 2 * 9
    got = wait_for(
        lambda: (s := _phoenix_spans(phoenix["base"])) and len(s) >= len(expected) and s,
        INGEST_S,
        "phoenix to ingest every span",
    )

    def key(trace_id, span_id, parent, name, session):
        return (trace_id, span_id, parent or "", name, session)

    assert sorted(
        key(
            s["context"]["trace_id"],
            s["context"]["span_id"],
            s["parent_id"],
            s["name"],
            s["attributes"].get(sc.SESSION_ID),
        )
        for s in got
    ) == sorted(
        key(r["TraceId"], r["SpanId"], r["ParentSpanId"], r["SpanName"], r["SpanAttributes"].get(sc.SESSION_ID))
        for r in expected
    )
    decisions = [s for s in got if s["name"] == sc.SPAN_KV_DECISION]
    assert decisions and all(s["attributes"][sc.KV_OUTCOME] in sc.OUTCOMES for s in decisions)
    assert all(isinstance(s["attributes"][sc.KV_PROMPT_TOKENS], int) for s in decisions)

    data = _graphql(
        phoenix["base"],
        "{ projects { edges { node { name sessions(first: 100) { edges { node { sessionId numTraces } } } } } } }",
    )
    sessions = {
        e["node"]["sessionId"]: e["node"]["numTraces"]
        for p in data["projects"]["edges"]
        for e in p["node"]["sessions"]["edges"]
    }
    requests = [r for r in expected if r["SpanName"] == sc.SPAN_PROXY_REQUEST]
    assert sessions == {
        sid: sum(r["SpanAttributes"][sc.SESSION_ID] == sid for r in requests)
        for sid in {r["SpanAttributes"][sc.SESSION_ID] for r in requests}
    }
    assert set(sessions) == {f"{p}-session-{i}" for p in ("grpc", "http/protobuf") for i in range(2)}
