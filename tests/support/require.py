"""Optional dependencies the tests need: import them or skip (fail instead where CI demands them)."""

from __future__ import annotations

import importlib

import pytest

from kvtrace import settings


def require_vllm(module: str = "vllm"):
    """Import ``module`` or skip; under KVTRACE_REQUIRE_VLLM=1 a missing module fails the test."""
    if settings.REQUIRE_VLLM.get():
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} not importable (set KVTRACE_REQUIRE_VLLM=1 to fail instead)")
