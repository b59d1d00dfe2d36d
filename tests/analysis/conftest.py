"""Fixtures shared by the analysis tests."""

from __future__ import annotations

import pytest

from kvtrace.analysis import pushdown

from support import session_queries


@pytest.fixture
def whole(monkeypatch):
    """Run a session-scoped named query without any pushdown: what it answers over the whole store."""

    def run(query, con, filters):
        with monkeypatch.context() as m:
            m.setattr(pushdown.duck_bounds, "bounded", lambda con, lo, hi: con)
            return session_queries.SESSION_QUERIES[query](con, filters)

    return run
