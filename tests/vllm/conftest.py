"""Fixtures of the vLLM tests.  vLLM is imported inside them only: the rig's own tests run
without it."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random-weight model directory (support.vllm_rig)."""
    from support import vllm_rig as rig

    return rig.make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture
def connector_cls(monkeypatch, tracer_provider):
    """KVTraceNixlConnector, its spans going to the test's in-memory exporter."""
    from kvtrace.vllm.connector import KVTraceNixlConnector

    monkeypatch.setattr(KVTraceNixlConnector, "tracer_provider", tracer_provider)
    return KVTraceNixlConnector
