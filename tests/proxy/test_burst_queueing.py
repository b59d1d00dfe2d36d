"""Bursts queue instead of failing: thousands of concurrent streams through the proxy over the
zero-cost simulator all get 200 (or, past the queue bound, a clean 503 with Retry-After), never a
502, and the proxy's descriptors return to their baseline afterwards."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import urllib.request

import aiohttp
import pytest

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.proxy.server import start
from kvtrace.sim.cluster import SimCluster
from kvtrace.testing.wait import free_port, wait_for

CHAT = "/v1/chat/completions"
STREAMS = 4000


def _body(i: int) -> dict:
    msg = {"role": "user", "content": f"agent {i}: what next?"}
    return {"model": "m", "messages": [msg], "max_tokens": 8, "stream": True, sc.BODY_CONVERSATION_ID: f"a{i}"}


async def _stream(http: aiohttp.ClientSession, url: str, i: int) -> tuple[int, str | None, bytes]:
    async with http.post(url + CHAT, json=_body(i)) as r:
        return r.status, r.headers.get("Retry-After"), await r.read()


async def _burst(url: str, n: int) -> list[tuple[int, str | None, bytes]]:
    connector = aiohttp.TCPConnector(limit=0)  # every stream at once, as n agents would
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=240)) as http:
        return await asyncio.gather(*(_stream(http, url, i) for i in range(n)))


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _settled_fds(pid: int) -> int:
    """The count once two readings 0.5 s apart agree (the proxy closes a finished connection's socket
    a moment after the client has its answer)."""
    seen: list[int] = []

    def steady() -> bool:
        seen.append(_fds(pid))
        return len(seen) > 1 and seen[-1] == seen[-2]

    wait_for(steady, 30, "the proxy's fd count to settle", interval=0.5)
    return seen[-1]


def _wait_fds(pid: int, ok, what: str) -> None:
    counts: list[int] = []
    try:
        wait_for(lambda: ok(counts.append(_fds(pid)) or counts[-1]), 90, what)
    except TimeoutError:
        raise AssertionError(f"{what}: {counts[-1]} open") from None


def _spawn(*argv: str) -> subprocess.Popen:
    env = {**os.environ, settings.TRACES_DIR.env: "", settings.OTLP.env: "off"}
    cli = "import sys; from kvtrace.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", cli, *argv], env=env, stdout=subprocess.DEVNULL)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:  # one connection, closed after
            return r.status == 200
    except OSError:
        return False


def _metric(text: str, name: str, role: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and s.labels.get(sc.LABEL_ROLE) == role:
                return s.value
    raise AssertionError(f"{name}{{role={role}}} not exposed")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_4000_concurrent_streams_through_kvtrace_proxy_all_get_200_and_its_fds_return_to_baseline():
    p_port, d_port, port = free_port(), free_port(), free_port()
    sim = _spawn("sim", "--no-cost", "--prefill-port", str(p_port), "--decode-port", str(d_port))
    proxy = _spawn(
        "proxy",
        "--port",
        str(port),
        "--prefiller-hosts",
        "127.0.0.1",
        "--prefiller-ports",
        str(p_port),
        "--decoder-hosts",
        "127.0.0.1",
        "--decoder-ports",
        str(d_port),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(f"http://127.0.0.1:{p_port}") and _healthy(f"http://127.0.0.1:{d_port}"), 60, "sim")
        wait_for(lambda: _healthy(url), 60, "proxy")
        baseline = _settled_fds(proxy.pid)

        results = asyncio.run(_burst(url, STREAMS))

        statuses = collections.Counter(status for status, _, _ in results)
        failures = collections.Counter(data[:160] for status, _, data in results if status != 200)
        assert statuses == {200: STREAMS}, failures.most_common(3)
        assert all(data.endswith(b"data: [DONE]\n\n") for _, _, data in results)
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        for role in (sc.ROLE_PREFILL, sc.ROLE_DECODE):
            assert _metric(text, sc.METRIC_PROXY_POOL_WAIT + "_count", role) == STREAMS
            assert _metric(text, sc.METRIC_PROXY_POOL_REJECTED + "_total", role) == 0
        # the clients are gone; what stays open is the pool: at most its connections to P and to D
        bound = baseline + 2 * settings.PROXY_MAX_WORKER_CONNECTIONS.default
        _wait_fds(proxy.pid, lambda n: n <= bound, f"proxy fds <= {bound}")
        _stop(sim)  # the workers close their ends: the proxy's pooled sockets close too
        _wait_fds(proxy.pid, lambda n: n == baseline, f"proxy fds back to {baseline}")
    finally:
        _stop(proxy)
        _stop(sim)


def _worker(url: str) -> Worker:
    host, port = url.rsplit("//", 1)[1].split(":")
    return Worker(host, int(port))


async def test_a_burst_past_the_queue_bound_gets_clean_503s_with_retry_after_and_never_a_502(
    tracer_provider, span_exporter
):
    n, limit, queue = 400, 4, 10
    async with SimCluster(1, 1, cost=False) as cluster:
        config = ProxyConfig(
            prefill=[_worker(u) for u in cluster.prefill_urls],
            decode=[_worker(u) for u in cluster.decode_urls],
            max_worker_connections=limit,
            max_worker_queue=queue,
        )
        proxy = await start(config, tracer_provider, port=0)
        try:
            results = await _burst(proxy.url, n)
        finally:
            await proxy.close()
    pool = proxy.proxy.pool
    statuses = collections.Counter(status for status, _, _ in results)
    refused = sum(g.rejected for role in (sc.ROLE_PREFILL, sc.ROLE_DECODE) for g in pool.gates(role))
    assert set(statuses) == {200, 503} and statuses[503] == refused
    for status, retry_after, data in results:
        if status == 503:
            body = json.loads(data)
            assert retry_after.isdigit() and int(retry_after) >= 1
            assert body["error"]["type"] == sc.ERROR_POOL_FULL and body["error"]["code"] == 503
            assert body["error"]["message"].startswith("worker http://127.0.0.1:")
        else:
            assert data.endswith(b"data: [DONE]\n\n")
    servers = [s for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_PROXY_REQUEST]
    assert len(servers) == n
    codes = collections.Counter(
        (s.attributes[sc.HTTP_RESPONSE_STATUS_CODE], s.attributes.get(sc.ERROR_TYPE)) for s in servers
    )
    assert codes == {(200, None): statuses[200], (503, sc.ERROR_POOL_FULL): statuses[503]}
    for role in (sc.ROLE_PREFILL, sc.ROLE_DECODE):
        assert [(g.in_use, g.queued) for g in pool.gates(role)] == [(0, 0)]
