"""The simulator keeps serving when its trace directory refuses writes, and says so on ``/health``:
``dropped_spans`` by reason (``write_failed`` here), the same counts as ``kvtrace_dropped_spans``.

The directory refuses writes because a file stands where the hour's partition directory must go
(an OSError from the filesystem on every write: no mount needed)."""

from __future__ import annotations

import time

import aiohttp

from kvtrace import semconv as sc
from kvtrace import telemetry
from kvtrace.sim.cluster import SimCluster
from kvtrace.store import writer


async def test_sim_answers_while_its_spans_cannot_be_written_and_counts_them_on_health(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTRACE_BATCH_DELAY_MS", "600000")
    traces = tmp_path / "t"
    part = traces / writer.partition_dir(time.time_ns() // writer.HOUR_NS)
    part.parent.mkdir(parents=True)
    part.write_text("a file where the hour's directory must go")
    provider = telemetry.configure("sim-full-disk", traces_dir=traces, otlp=False, handle_sigterm=False)
    (processor,) = provider._active_span_processor._span_processors
    before = telemetry.dropped_spans()
    async with SimCluster(0, 1, cost=False, tracer_provider=provider, model="sim-model") as c:
        async with aiohttp.ClientSession(base_url=c.decode_urls[0]) as http:
            for _ in range(3):
                async with http.post("/v1/completions", json={"prompt": [1, 2, 3, 4], "max_tokens": 2}) as r:
                    assert r.status == 200
            assert provider.force_flush(60_000)  # flushed (the export failed); nothing raised
            async with http.get("/health") as r:
                assert r.status == 200
                body = await r.json()
    failed = processor.span_exporter.failed_spans
    assert failed > 0 and processor.span_exporter.failure_reason == sc.DROP_WRITE_FAILED
    assert body == {
        "status": "ok",
        "dropped_spans": {**before, sc.DROP_WRITE_FAILED: before.get(sc.DROP_WRITE_FAILED, 0) + failed},
    }
    provider.shutdown()
