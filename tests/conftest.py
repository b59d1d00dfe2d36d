"""Shared fixtures: an in-memory span exporter and a provider that exports to it synchronously."""

from __future__ import annotations

import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@pytest.fixture
def span_exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer_provider(span_exporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    yield provider
    provider.shutdown()


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """``kvtrace demo --traces ROOT/kvtrace-traces --sessions 2`` run once per session (two short-followups
    sessions: a below-threshold turn): (exit status, printed output, ROOT/kvtrace-traces)."""
    pytest.importorskip("aiohttp")
    pytest.importorskip("openai")
    import contextlib
    import io

    from kvtrace.cli import main

    traces = tmp_path_factory.mktemp("demo") / "kvtrace-traces"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["demo", "--traces", str(traces), "--sessions", "2"])
    return rc, buf.getvalue(), traces


@pytest.fixture(autouse=True, scope="module")
def _release_chdb():
    """chDB opens one database directory per process: close it after each module that used
    kvtrace's chDB backend, so the next module (or a plain ``chdb.query``) can open its own."""
    yield
    backend = sys.modules.get("kvtrace.store.clickhouse.backend")
    if backend is not None:
        backend.ChdbBackend.shutdown()


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs at tmp_path/disk, unmounted after the test (skipped where mounting is refused:
    the fault-injection tests of each writer cover the same paths)."""
    from support.disk import tmpfs

    with tmpfs(tmp_path / "disk") as disk:
        if isinstance(disk, str):
            pytest.skip(f"cannot mount a tmpfs here ({disk})")
        yield disk
