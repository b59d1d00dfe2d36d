"""An answer that stops mid-stream for longer than the bench's request timeout (an overloaded fleet:
D's first token, then nothing while it waits for KV blocks) is a failed request of the run, as a
refused one is, and the run goes on; the worker whose reader left aborts the request without an error
in its log (vLLM's own handling of a client that hung up)."""

from __future__ import annotations

import glob
import json
import logging

import pyarrow.parquet as pq
import pytest

from kvtrace import semconv as sc
from kvtrace.sim import virtual

pytest.importorskip("aiohttp")
pytest.importorskip("openai")

# a 2,000-token answer decodes for about 40 model seconds on qwen3-32b; the workers send its first
# token, then the rest at once (the virtual arm's stream interval), so the client waits in silence
SCENARIO = {
    "filetype": "kvtrace_scenario",
    "name": "silent",
    "sessions": 2,
    "system_tokens": 300,
    "turns": [{"label": "ask", "repeat": 2, "user_tokens": 40, "steps": [{"llm": {"output_tokens": 2000}}]}],
}
TIMEOUT_S = 5.0


async def _arm(run_dir: str, scenario: str):
    from kvtrace.bench import inproc

    cfg = dict(input=scenario, seed=2, nonce="silent", clients=2, request_timeout_s=TIMEOUT_S)
    return await inproc.run_arm(run_dir, "qwen3-32b", True, True, "efa-3200", cfg, "A", 450.0)


def test_a_stream_silent_past_the_timeout_fails_its_request_and_the_run_goes_on(tmp_path, caplog):
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps(SCENARIO))
    with caplog.at_level(logging.ERROR):
        result = virtual.run(_arm(str(tmp_path / "run"), str(scenario)), seed=2)
    # each session's first answer times out; the session stops there, as after any failed call
    got = sorted((r.session, r.turn, r.error) for r in result.requests)
    assert got == [(f"silent-A0-silent-{i}", 0, "ReadTimeout") for i in range(2)]
    assert all(r.ttft_ms is not None and r.ttft_ms < TIMEOUT_S * 1e3 for r in result.requests)  # the first token came
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    files = glob.glob(f"{tmp_path}/run/**/*.parquet", recursive=True)
    rows = [r for path in files for r in pq.read_table(path).to_pylist()]
    decodes = [dict(r["SpanAttributes"]) for r in rows if r["SpanName"] == sc.SPAN_ENGINE_DECODE]
    assert [a.get(sc.ERROR_TYPE) for a in decodes] == [sc.ERROR_CLIENT_DISCONNECT] * 2
