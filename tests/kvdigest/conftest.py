"""Every digest test runs under both implementations of the tags: the C extension
(``kvtrace.kvdigest._ctags``, what an install with a compiler uses) and the Python reference
(``kvtrace.kvdigest._pytags``, what an install without one uses).  They must give the same bytes,
the same verdicts and the same errors."""

from __future__ import annotations

import pytest

from kvtrace import kvdigest
from kvtrace.kvdigest import _pytags


def _c_tags():
    from support.require import require_vllm

    # the README's test command (KVTRACE_REQUIRE_VLLM=1) builds the extension: fail there, skip elsewhere
    return require_vllm("kvtrace.kvdigest._ctags")


@pytest.fixture(params=["c", "python"], autouse=True)
def implementation(request, monkeypatch):
    """The tags' implementation this test runs under (its keyed states are its own: reset)."""
    impl = _c_tags() if request.param == "c" else _pytags
    monkeypatch.setattr(kvdigest, "_impl", impl)
    monkeypatch.setattr(kvdigest, "_STATES", {})
    return impl
