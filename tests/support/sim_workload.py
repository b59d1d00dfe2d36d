"""A small simulated multi-turn workload (SimCluster + kvtrace proxy), shared by the OTLP, Phoenix
and ClickHouse tests, plus helpers that read a trace directory back as rows."""

from __future__ import annotations

import asyncio
import os

import pyarrow.parquet as pq

import kvtrace
from kvtrace import semconv as sc
from kvtrace.store import files
from kvtrace.store.convert import table_to_rows
from kvtrace.store.schema import SCHEMA

PROXY_SERVICE = "kvtrace-proxy"


def _worker(url: str):
    from kvtrace.proxy.config import Worker

    host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
    return Worker(host, int(port))


async def _drive(factory, sessions: int, turns: int, prefix: str) -> list[dict]:
    import aiohttp

    from kvtrace.proxy import server as proxy_server
    from kvtrace.proxy.config import ProxyConfig
    from kvtrace.sim.cluster import SimCluster

    answers = []
    async with SimCluster(cost=False, tracer_provider_factory=factory) as cluster:
        config = ProxyConfig(
            prefill=[_worker(u) for u in cluster.prefill_urls], decode=[_worker(u) for u in cluster.decode_urls], port=0
        )
        running = await proxy_server.start(config, tracer_provider=factory(PROXY_SERVICE, {}), port=0)
        try:
            async with aiohttp.ClientSession() as http:
                for s in range(sessions):
                    messages: list[dict] = []
                    for turn in range(turns):
                        words = " ".join(f"s{s}t{turn}w{i}" for i in range(200))
                        messages.append({"role": "user", "content": words})
                        body = {"model": "sim", "messages": messages, "max_tokens": 96}
                        headers = {sc.HEADER_SESSION_ID: f"{prefix}session-{s}"}
                        async with http.post(running.url + "/v1/chat/completions", json=body, headers=headers) as r:
                            assert r.status == 200, await r.text()
                            answer = await r.json()
                        answers.append(answer)
                        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        finally:
            await running.close()
    return answers


def run_workload(*, traces_dir=None, otlp=None, sessions: int = 2, turns: int = 3, prefix: str = "") -> list[dict]:
    """Run ``sessions`` x ``turns`` chat requests through proxy + simulated P/D; every component
    gets its own provider from :func:`kvtrace.configure` (``traces_dir`` and/or ``otlp``), all
    shut down (flushed) before returning.  Session ids are ``{prefix}session-{i}``.  Returns the
    client-visible responses."""
    providers = []

    def factory(service_name: str, attributes: dict):
        provider = kvtrace.configure(
            service_name, traces_dir=traces_dir, otlp=otlp, resource_attributes=attributes, handle_sigterm=False
        )
        providers.append(provider)
        return provider

    try:
        return asyncio.run(_drive(factory, sessions, turns, prefix))
    finally:
        for provider in providers:
            provider.shutdown()


def read_rows(traces_dir) -> list[dict]:
    """Every span row of a trace directory, as dicts, sorted by (TraceId, SpanId)."""
    rows = []
    for path in files.list_files(traces_dir):
        rows += table_to_rows(pq.read_table(path, partitioning=None).select(SCHEMA.names).cast(SCHEMA))
    rows.sort(key=lambda r: (r["TraceId"], r["SpanId"]))
    return rows


def tmp_files(traces_dir) -> list[str]:
    return [n for _, _, names in os.walk(traces_dir) for n in names if n.startswith(".")]
