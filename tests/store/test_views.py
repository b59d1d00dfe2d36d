"""The view registry is the contract: declared columns are what DuckDB returns, docs/query.md is
generated from it, every documented value finds rows; and the reader: explicit file lists (glob
characters in names), junk files skipped, runs never merged, one default directory for every
command, swept files re-listed."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from kvtrace import semconv as sc
from kvtrace.cli import main
from kvtrace.collect.otlp_convert import request_to_table
from kvtrace.store import connect, files, reader, views
from kvtrace.store.schema import SPAN_KIND_UNSPECIFIED
from kvtrace.store.views.docs import render
from kvtrace.testing.synth import PROXY, SpanBuilder, sample_store, write_table

ROOT = Path(__file__).resolve().parents[2]


def test_declared_columns_are_what_duckdb_returns():
    con = connect("/nonexistent-kvtrace-dir", allow_empty=True)
    for view in views.VIEWS:
        described = [(r[0], r[1]) for r in con.execute(f"DESCRIBE {view.name}").fetchall()]
        assert described == [(c.name, c.type) for c in view.columns], view.name


def test_docs_query_md_is_generated_from_the_registry():
    assert (ROOT / "docs" / "query.md").read_text(encoding="utf-8") == render(), (
        "regenerate: python -m kvtrace.store.views > docs/query.md"
    )
    for view in views.VIEWS:
        assert f"`{view.name}`" in render()


# -- every documented enumerated value, used as a filter, finds rows ---------------------------
SPAN_OF_VIEW = {
    "spans": sc.SPAN_AGENT_TURN,
    "requests": sc.SPAN_PROXY_REQUEST,
    "proxy_legs": sc.SPAN_PROXY_PREFILL,
    "kv_decisions": sc.SPAN_KV_DECISION,
    "kv_transfers": sc.SPAN_KV_TRANSFER,
    "kv_retention": sc.SPAN_KV_RETENTION,
    "engine_requests": sc.SPAN_ENGINE_PREFILL,
    "llm_calls": sc.SPAN_AGENT_LLM_CALL,
    "tool_calls": sc.SPAN_AGENT_TOOL_CALL,
    "vllm_requests": sc.SPAN_VLLM_LLM_REQUEST,
    "continuity": sc.SPAN_PROXY_REQUEST,
}
ATTRIBUTE_OF_COLUMN = {
    "direction": sc.KV_DIRECTION,
    "status": sc.KV_TRANSFER_STATUS,
    "offer_reason": sc.PROXY_OFFER_REASON,
    "fallback": sc.PROXY_FALLBACK,
    "engine_role": sc.ENGINE_ROLE,
    "substrate": sc.SUBSTRATE,
    "source": sc.SESSION_SOURCE,
    "continuity": sc.SESSION_CONTINUITY,
    "verified": sc.KV_VERIFIED,
    "verify_mode": sc.KV_VERIFY_MODE,
    "routing": sc.ROUTE_POLICY,
    "prefill_route": sc.ROUTE_PREFILL_REASON,
    "decode_route": sc.ROUTE_DECODE_REASON,
}


def _one_span_per_value(b: SpanBuilder) -> None:
    """For every view and enumerated column, a span of that view holding each documented value the
    way a writer records it (attribute, span name, kind or status); vLLM spans continuing proxy legs."""
    t = 0.0
    for view in views.PUBLIC:
        if view.name in ("trace_sessions", "agent_llm_calls"):
            continue  # see _agent_calls()
        name = SPAN_OF_VIEW.get(view.name)
        for column in view.columns:
            for value in column.values:
                t += 10
                kw: dict = {"attrs": {sc.SESSION_ID: "enum"}}
                if view.name == "continuity":  # its rows are the checked turns
                    kw["attrs"][sc.SESSION_CONTINUITY] = sc.CONTINUITY_EXTENDS
                span_name = name
                if column.name in ("kind", "SpanKind"):
                    if value == SPAN_KIND_UNSPECIFIED:
                        continue  # only OTLP senders have it: see _unspecified_kind()
                    kw["kind"] = value.removeprefix("SPAN_KIND_")
                elif column.name in ("status_code", "StatusCode"):
                    kw["error"], kw["ok"] = value.endswith("ERROR"), value.endswith("_OK")
                elif column.name == "phase":
                    span_name = sc.SPAN_ENGINE_PREFILL if value == sc.ROLE_PREFILL else sc.SPAN_ENGINE_DECODE
                elif column.name == "role":  # proxy_legs: which leg's span
                    span_name = sc.SPAN_PROXY_PREFILL if value == sc.ROLE_PREFILL else sc.SPAN_PROXY_DECODE
                elif column.name == "outcome":
                    key = sc.KV_RETENTION_OUTCOME if view.name == "kv_retention" else sc.KV_OUTCOME
                    kw["attrs"][key] = value
                elif column.name in ("leg", "matched_by"):
                    continue  # see _vllm_legs()
                else:
                    kw["attrs"][ATTRIBUTE_OF_COLUMN[column.name]] = value
                b.span(span_name, t, t + 5, **kw)
    _vllm_legs(b, t + 100)
    _agent_calls(b, t + 200)


def _agent_calls(b: SpanBuilder, t: float) -> None:
    """LLM calls of every convention and join kind, and kvtrace's own with every outcome."""
    for i, outcome in enumerate(sc.OUTCOMES):
        call = b.llm_call("enum-agent", 0, t + 10 * i, t + 10 * i + 8, 1.0, request_id=f"ag-{i}")
        b.request("enum-agent", 0, f"ag-{i}", t + 10 * i + 1, t + 10 * i + 7, 1.0, parent=call, outcome=outcome)
    t += 100
    run = b.span("invoke_agent w", t, t + 20, attrs={sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT})
    chat = b.span("chat m", t + 1, t + 10, parent=run, kind="CLIENT", attrs={sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT})
    b.request(None, None, "genai-0", t + 2, t + 9, 1.0, parent=chat)  # trace
    root = b.span("Agent", t + 30, t + 50, attrs={sc.OPENINFERENCE_SPAN_KIND: sc.OI_AGENT, sc.SESSION_ID: "oi"})
    b.span("llm", t + 31, t + 40, parent=root, attrs={sc.OPENINFERENCE_SPAN_KIND: sc.OI_LLM})
    b.request(None, None, "oi-0", t + 32, t + 39, 1.0)  # a root: session_time
    flow = b.span("wf", t + 60, t + 80, attrs={sc.TRACELOOP_SPAN_KIND: sc.TL_WORKFLOW})
    b.span("openai.chat", t + 61, t + 70, parent=flow, attrs={sc.LLM_REQUEST_TYPE: sc.OP_CHAT})  # none


def _vllm_legs(b: SpanBuilder, t: float) -> None:
    req = b.request("enum", 0, "req-enum", t, t + 50, 10.0)
    for leg in (sc.SPAN_PROXY_PREFILL, sc.SPAN_PROXY_DECODE):
        parent = b.span(leg, t + 1, t + 40, parent=req, service=PROXY, kind="CLIENT")
        b.span(
            sc.SPAN_VLLM_LLM_REQUEST,
            t + 2,
            t + 30,
            parent=parent,
            service="vllm",
            kind="SERVER",
            attrs={sc.GEN_AI_REQUEST_ID: "cmpl-req-enum-0"},
        )
    b.span(
        sc.SPAN_VLLM_LLM_REQUEST,
        t + 60,
        t + 70,
        service="vllm",
        kind="SERVER",
        attrs={sc.GEN_AI_REQUEST_ID: "chatcmpl-req-enum-1"},
    )  # no trace context: matched by request id


def _unspecified_kind(directory: Path) -> None:
    req = ExportTraceServiceRequest()
    span = (
        req.resource_spans.add()
        .scope_spans.add()
        .spans.add(
            name="from-otlp",
            kind=0,
            start_time_unix_nano=1_767_225_600_000_000_000,
            end_time_unix_nano=1_767_225_600_000_001_000,
        )
    )
    span.trace_id, span.span_id = (7).to_bytes(16, "big"), (7).to_bytes(8, "big")
    table, _, _ = request_to_table(req)
    write_table(table, directory, writer="otlp")


@pytest.fixture(scope="module")
def enum_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("enums")
    sample_store(root)  # a demo-like workload: agent, proxy, P/D engines, reuse, retention
    b = SpanBuilder(base_ns=1_767_232_800_000_000_000)
    _one_span_per_value(b)
    b.write(root, writer="enums")
    _unspecified_kind(root)
    return connect(root)


def test_every_documented_value_finds_rows(enum_store):
    checked = 0
    for view in views.PUBLIC:
        for column in view.columns:
            for value in column.values:
                ((n,),) = enum_store.execute(
                    f'SELECT count(*) FROM {view.name} WHERE "{column.name}" = $v', {"v": value}
                ).fetchall()
                assert n > 0, f"{view.name}.{column.name} = {value!r} finds nothing"
                checked += 1
    assert checked >= 90  # kinds, statuses, outcomes, directions, roles, substrates, reasons, legs, ...
    # the one spelling: raw and derived columns agree; the short OTel spellings are not stored
    assert enum_store.execute(
        "SELECT count(*) FROM spans WHERE kind <> SpanKind OR status_code <> StatusCode"
    ).fetchall() == [(0,)]
    assert enum_store.execute(
        "SELECT count(*) FROM spans WHERE status_code IN ('Error', 'Ok', 'Unset') "
        "OR kind IN ('Server', 'Client', 'Internal')"
    ).fetchall() == [(0,)]


# -- the reader ---------------------------------------------------------------------------------
def _batch(tmp_path: Path) -> Path:
    """One small trace file in ``tmp_path/src``."""
    b = SpanBuilder()
    for i in range(3):
        b.turn("s", i, i * 10, i * 10 + 5)
    (path,) = write_table(_table(b), tmp_path / "src")
    return Path(path)


def _table(b: SpanBuilder):
    from kvtrace.store.convert import spans_to_table

    return spans_to_table(list(b.exporter.get_finished_spans()))


def test_glob_characters_in_file_names_are_read_literally(tmp_path):
    src = _batch(tmp_path)
    part = tmp_path / "t" / "date=2026-01-01" / "hour=00"
    part.mkdir(parents=True)
    for name in ("x1.parquet", "x*.parquet", "x?.parquet", "y[1].parquet", "y1.parquet"):
        shutil.copy(src, part / name)
    con = connect(tmp_path / "t")
    assert con.execute("SELECT count(*) FROM spans").fetchall() == [(15,)]  # 5 files x 3 spans, each once


def test_a_junk_parquet_file_is_skipped_with_a_warning(tmp_path, caplog):
    src = _batch(tmp_path)
    part = tmp_path / "t" / "date=2026-01-01" / "hour=00"
    part.mkdir(parents=True)
    shutil.copy(src, part / "good.parquet")
    (part / "junk.parquet").write_text("this is not parquet, but it is long enough to have a tail")
    (part / "tiny.parquet").write_bytes(b"PAR1")
    truncated = src.read_bytes()
    (part / "cut.parquet").write_bytes(truncated[: len(truncated) // 2])
    with caplog.at_level(logging.WARNING, logger="kvtrace.store.reader"):
        con = connect(tmp_path / "t")
    assert con.execute("SELECT count(*) FROM spans").fetchall() == [(3,)]
    warned = sorted(os.path.basename(r.args[0]) for r in caplog.records)
    assert warned == ["cut.parquet", "junk.parquet", "tiny.parquet"]
    assert all("not a Parquet file" in r.getMessage() for r in caplog.records)


def test_a_connection_relists_when_a_listed_file_is_swept(tmp_path):
    b = SpanBuilder()
    for i in range(4):
        b.turn("s", i, i, i + 1)
    table = _table(b)
    part = tmp_path / "date=2026-01-01" / "hour=00"
    part.mkdir(parents=True)
    pq.write_table(table.slice(0, 2), part / files.batch_name("w", 1))
    pq.write_table(table.slice(2, 2), part / files.batch_name("w", 2))
    con = connect(tmp_path)
    # a writer rolls both batch files into a segment and sweeps them: the listing is stale
    pq.write_table(table, part / files.segment_name("w", 1, 2))
    os.unlink(part / files.batch_name("w", 1))
    os.unlink(part / files.batch_name("w", 2))
    assert reader.query(con, "SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 4}]
    assert reader.query(con.cursor(), "SELECT count(DISTINCT span_id) AS n FROM spans").to_pylist() == [{"n": 4}]


# -- runs -----------------------------------------------------------------------------------------
@pytest.fixture
def two_runs(tmp_path):
    root = tmp_path / "kvtrace-traces"
    sample_store(root / "bidir", sessions=1, turns=2)
    sample_store(root / "baseline", sessions=1, turns=2, pull=False)
    return root


def test_several_runs_are_refused_and_named(two_runs, tmp_path):
    with pytest.raises(reader.StoreError) as err:
        connect(two_runs)
    msg = str(err.value)
    assert f"{two_runs} holds 2 runs" in msg and "kvtrace does not merge" in msg
    assert f"{two_runs / 'baseline'}, {two_runs / 'bidir'}" in msg and f"--traces {two_runs / 'baseline'}" in msg
    connect(two_runs / "bidir")  # one run: fine
    # a lone run below the directory asked for is still one run
    lone = tmp_path / "lone"
    sample_store(lone / "only", sessions=1, turns=1)
    assert connect(lone).execute("SELECT count(DISTINCT session_id) FROM sessions").fetchall() == [(1,)]
    # partitions of its own beside a run in a subdirectory: two runs
    sample_store(two_runs / "bidir" / "nested", sessions=1, turns=1)
    with pytest.raises(reader.StoreError, match=r"holds 2 runs.*\(its own date=/hour= partitions\)"):
        connect(two_runs / "bidir")


@pytest.mark.parametrize("command", [["query", "SELECT count(*) FROM spans"], ["report"], ["dashboard"]])
def test_query_report_and_dashboard_share_the_default_and_refuse_blending(two_runs, monkeypatch, capsys, command):
    monkeypatch.delenv("KVTRACE_TRACES_DIR", raising=False)
    monkeypatch.chdir(two_runs.parent)
    launched = []
    monkeypatch.setattr("kvtrace.dashboards.launch.launch", lambda directory, **kw: launched.append(directory) or 0)
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(
        f"kvtrace {command[0]}: error: kvtrace-traces holds 2 runs, which kvtrace does not merge: "
        "kvtrace-traces/baseline, kvtrace-traces/bidir. Pick one with --traces"
    )
    monkeypatch.setenv("KVTRACE_TRACES_DIR", "kvtrace-traces/bidir")
    assert main(command) == 0
    capsys.readouterr()
    assert launched == (["kvtrace-traces/bidir"] if command == ["dashboard"] else [])
