"""The proxy's /metrics over the zero-cost simulator (in process): counters equal the proxy's
spans, and no family grows with the number of sessions (1,000 distinct conversations)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtrace import semconv as sc
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.proxy.server import start
from kvtrace.sim.cluster import SimCluster
from kvtrace.telemetry import exposition

CHAT = "/v1/chat/completions"


def _worker(url: str) -> Worker:
    host, port = url.rsplit("//", 1)[1].split(":")
    return Worker(host, int(port))


@pytest.fixture
async def stack(tracer_provider):
    async with SimCluster(1, 1, cost=False, tracer_provider=tracer_provider, model="m") as cluster:
        # prefix matching off: these "turns" replace the message instead of extending the conversation
        config = ProxyConfig(
            prefill=[_worker(u) for u in cluster.prefill_urls],
            decode=[_worker(u) for u in cluster.decode_urls],
            prefix_match=False,
        )
        proxy = await start(config, tracer_provider, port=0)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            try:
                yield cluster, proxy, http
            finally:
                await proxy.close()


async def _chat(http, url, text, conv=None, stream=True, max_tokens=80, raw=None):
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "stream": stream}
    if conv is not None:
        body[sc.BODY_CONVERSATION_ID] = conv
    kwargs = {"data": raw, "headers": {"Content-Type": "application/json"}} if raw is not None else {"json": body}
    async with http.post(url + CHAT, **kwargs) as r:
        await r.read()
        return r.status


async def _scrape(http, url) -> dict[str, list]:
    """family name -> samples (prometheus_client parser), as Prometheus asks for them."""
    async with http.get(url + "/metrics", headers={"Accept": exposition.OPENMETRICS}) as r:
        assert r.status == 200 and r.headers["Content-Type"] == exposition.OPENMETRICS_CONTENT_TYPE
        text = await r.text()
    async with http.get(url + "/metrics") as r:  # classic text, same families
        classic = await r.text()
    return {f.name: f.samples for f in text_string_to_metric_families(classic)} | {"__openmetrics__": [text]}


def _values(samples, name, *labels) -> dict[tuple, float]:
    return {tuple(s.labels.get(lb) for lb in labels): s.value for s in samples if s.name == name and s.value}


async def test_proxy_counters_equal_its_spans(stack, span_exporter):
    cluster, proxy, http = stack
    long = "please summarise the plot of a short story about a lighthouse keeper " * 12
    assert await _chat(http, proxy.url, long, conv="c1") == 200  # no_entry
    assert await _chat(http, proxy.url, long + " and now the sequel", conv="c1", stream=False) == 200  # offered
    assert await _chat(http, proxy.url, "no conversation id here") == 200  # no_conversation_id
    assert await _chat(http, proxy.url, "", raw=b"{not json") == 400
    fams = await _scrape(http, proxy.url)
    spans = [s.attributes for s in span_exporter.get_finished_spans() if s.name == sc.SPAN_PROXY_REQUEST]
    assert len(spans) == 4
    want = {}
    for a in spans:
        key = (str(a[sc.HTTP_RESPONSE_STATUS_CODE]), a.get(sc.PROXY_OFFER_REASON))
        want[key] = want.get(key, 0) + 1
    got = _values(
        fams[sc.METRIC_PROXY_REQUESTS], f"{sc.METRIC_PROXY_REQUESTS}_total", sc.LABEL_STATUS, sc.LABEL_OFFER_REASON
    )
    assert {(s, r or None): v for (s, r), v in got.items()} == want
    assert want == {
        ("200", sc.OFFER_NO_ENTRY): 1,
        ("200", sc.OFFER_OFFERED): 1,
        ("200", sc.OFFER_NO_CONVERSATION_ID): 1,
        ("400", None): 1,
    }
    ttft = _values(fams[sc.METRIC_PROXY_TTFT], f"{sc.METRIC_PROXY_TTFT}_count", sc.LABEL_OUTCOME)
    outcomes = [a.get(sc.KV_OUTCOME) or sc.OUTCOME_UNKNOWN for a in spans if sc.REQUEST_TTFT_MS in a]
    assert ttft == {(o,): float(outcomes.count(o)) for o in outcomes}
    assert sum(ttft.values()) == 3
    sums = _values(fams[sc.METRIC_PROXY_TTFT], f"{sc.METRIC_PROXY_TTFT}_sum", sc.LABEL_OUTCOME)
    assert sum(sums.values()) == pytest.approx(
        sum(a[sc.REQUEST_TTFT_MS] for a in spans if sc.REQUEST_TTFT_MS in a) / 1e3
    )
    latency = _values(fams[sc.METRIC_PROXY_LATENCY], f"{sc.METRIC_PROXY_LATENCY}_count", sc.LABEL_OUTCOME)
    assert sum(latency.values()) == 3  # requests answered 200
    assert _values(fams[sc.METRIC_PROXY_CONVERSATIONS], sc.METRIC_PROXY_CONVERSATIONS) == {(): 1.0}
    assert _values(fams[sc.METRIC_PROXY_CONVERSATIONS_OFFERABLE], sc.METRIC_PROXY_CONVERSATIONS_OFFERABLE) == {(): 1.0}
    assert sc.METRIC_PROXY_EVICTIONS in fams and sc.METRIC_DROPPED_SPANS in fams
    assert f"{sc.METRIC_PROXY_REQUESTS}_total{{" in fams["__openmetrics__"][0]


async def test_metrics_off(monkeypatch, tracer_provider):
    monkeypatch.setenv("KVTRACE_METRICS", "0")
    proxy = await start(
        ProxyConfig(prefill=[Worker("127.0.0.1", 9)], decode=[Worker("127.0.0.1", 9)]), tracer_provider, port=0
    )
    try:
        assert proxy.proxy.metrics is None
        async with aiohttp.ClientSession() as http, http.get(proxy.url + "/metrics") as r:
            assert r.status == 404
    finally:
        await proxy.close()


def _series(fams: dict) -> dict[str, set]:
    """family -> its distinct label sets (histogram buckets folded into their series)."""
    return {
        name: {tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")) for s in samples}
        for name, samples in fams.items()
        if not name.startswith("__")
    }


@pytest.mark.timeout(300)
async def test_label_values_stay_bounded_over_1000_sessions(stack):
    cluster, proxy, http = stack
    urls = [proxy.url, *cluster.prefill_urls, *cluster.decode_urls]
    sem = asyncio.Semaphore(32)

    async def session(i: int, turns: int) -> None:
        async with sem:
            conv = f"sess-{i:04d}"
            text = f"session {i}: summarise the story of lighthouse number {i} in detail please " * 8
            for turn in range(turns):
                assert (
                    await _chat(http, proxy.url, text + " and then?" * turn, conv=conv, stream=False, max_tokens=8)
                    == 200
                )

    await asyncio.gather(*(session(i, 2) for i in range(10)))  # every kind of turn: first, offered
    early = [_series(await _scrape(http, u)) for u in urls]
    await asyncio.gather(*(session(i, 1) for i in range(10, 1000)))  # 990 more session ids
    late_fams = [await _scrape(http, u) for u in urls]
    late = [_series(f) for f in late_fams]
    assert late == early  # 990 more sessions, not one more series
    text = "".join(f["__openmetrics__"][0] for f in late_fams)
    assert "sess-" not in text
    for fams in late:
        for name, series in fams.items():
            assert len(series) <= 2 * 6 * 2, (name, len(series))  # largest: decisions, 2 directions x 6 outcomes
            for labels in series:
                for label, value in labels:
                    allowed = set(sc.LABEL_VALUES.get(label, ()))
                    if label == sc.LABEL_STATUS:
                        assert value in allowed or value.isdigit(), (name, label, value)
                    elif label == sc.LABEL_ENDPOINT:  # the configured workers' URLs, whatever the traffic
                        assert value.startswith("http://127.0.0.1:"), (name, label, value)
                    elif label not in (sc.LABEL_MODEL_NAME, sc.LABEL_ENGINE):
                        assert value in allowed, (name, label, value)
    proxy_requests = late[0][sc.METRIC_PROXY_REQUESTS]
    assert {dict(lbls)[sc.LABEL_OFFER_REASON] for lbls in proxy_requests if lbls} <= set(sc.OFFER_REASONS)
