"""A chDB backend used after ``ChdbBackend.shutdown()`` says so in one line (BackendError), instead
of failing inside chDB's missing connection."""

from __future__ import annotations

import pytest

pytest.importorskip("sqlglot")
pytest.importorskip("chdb")

from kvtrace.store.clickhouse.backend import BackendError, ChdbBackend  # noqa: E402


def test_a_backend_used_after_shutdown_raises_a_backend_error(tmp_path):
    ChdbBackend.shutdown()  # whatever an earlier module left open: this test opens its own directory
    backend = ChdbBackend(str(tmp_path))
    try:
        assert backend.query("SELECT 1 AS x").column("x").to_pylist() == [1]
        ChdbBackend.shutdown()
        with pytest.raises(BackendError, match="^chDB was shut down in this process; open the backend again$"):
            backend.query("SELECT 1")
        with pytest.raises(BackendError, match="^chDB was shut down in this process"):
            backend.command("SELECT 1")
    finally:
        ChdbBackend.shutdown()
