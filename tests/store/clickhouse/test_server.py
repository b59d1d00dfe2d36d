"""kvtrace's views on a ClickHouse *server*, through clickhouse-connect: the equivalence test of
``test_views_match_duckdb`` with the spans inserted over HTTP.  Needs a server (ClickHouse 25 or
newer): ``KVTRACE_TEST_CLICKHOUSE_URL=http://default:@127.0.0.1:8123``; skipped without one.

None runs on the development machines: Debian ships clickhouse-server 18.16.1, which cannot create
the exporter's table (no ``CODEC``/``Map``/``DateTime64``) and which clickhouse-connect cannot talk
to; no PyPI package ships a server; chDB's embedded ClickHouse refuses to start listeners
(docs/clickhouse.md, "Servers")."""

from __future__ import annotations

import os

import pytest

from kvtrace import settings

URL = settings.TEST_CLICKHOUSE_URL.get()
pytestmark = pytest.mark.skipif(not URL, reason="no ClickHouse server: set KVTRACE_TEST_CLICKHOUSE_URL")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from kvtrace.store.clickhouse import load
    from kvtrace.store.clickhouse.backend import ServerBackend
    from kvtrace.store.clickhouse.store import ClickHouseStore
    from kvtrace.testing.synth import sample_store

    traces = tmp_path_factory.mktemp("server") / "traces"
    sample_store(traces, sessions=3, turns=4)
    backend = ServerBackend(URL)
    table = f"kvtrace_test.otel_traces_{os.getpid()}"
    load.load(traces, backend, table)
    yield traces, ClickHouseStore(backend, table)
    backend.command(f"DROP TABLE IF EXISTS {table}")
    backend.close()


def test_every_view_is_equal_over_http(server):
    from support import clickhouse_check

    traces, store = server
    counts = clickhouse_check.check_views(traces, store)
    assert counts["sessions"] == 3 and counts["session_breakdown"] == 3


def test_parameters_are_bound_by_the_server(server):
    _, store = server
    rows = store.query("SELECT session_id FROM sessions WHERE session_id = $s", {"s": "session-1"}).to_pylist()
    assert rows == [{"session_id": "session-1"}]


def test_the_breakdown_runs_staged_in_a_session_of_its_own(server):
    """The stages' temporary tables live in one HTTP session per query (staged.py): made, read, and
    gone afterwards; no fallback to the single statement."""
    _, store = server
    before = store.backend.fallbacks
    rows = store.query("SELECT session_id FROM session_breakdown ORDER BY session_id").to_pylist()
    assert len(rows) == 3 and store.backend.fallbacks == before
    left = store.backend.query("SELECT name FROM system.tables WHERE is_temporary").to_pylist()
    assert left == []
