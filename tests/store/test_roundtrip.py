"""Parquet store: exporter -> files -> DuckDB views round trip, errors, view contract, CLI."""

from __future__ import annotations

import json
import logging
import os

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, set_span_in_context

from kvtrace import cli
from kvtrace import semconv as sc
from kvtrace.store import files, reader, views
from kvtrace.store.exporter import ParquetSpanExporter

T0 = 1_780_000_000_123_456_789
EXPECTED_COLUMNS = {
    "requests": "trace_id span_id request_id session_id turn service_name start_time end_time start_ns end_ns ttft_ms "
    "latency_ms input_tokens output_tokens status_code http_status stream offered offer_reason fallback outcome "
    "pulled_tokens prefill_endpoint decode_endpoint routing prefill_route decode_route substrate",
    "proxy_legs": "trace_id span_id parent_span_id request_id session_id turn role endpoint http_status error_type "
    "unreachable failover retry offered ttft_ms pool_wait_ms service_name start_time end_time start_ns end_ns "
    "duration_ms status_code",
    "kv_decisions": "trace_id span_id request_id session_id turn engine_id engine_role direction outcome prompt_tokens "
    "local_hit_tokens remote_tokens pulled_tokens recomputed_tokens threshold expiry_remaining_s peer_engine_id "
    "verified verify_mode verified_tokens first_mismatch_token wrong_tokens "
    "start_time start_ns duration_ms service_name substrate",
    "kv_transfers": "trace_id span_id parent_span_id request_id session_id turn engine_id direction tokens blocks "
    "bytes status xfer_ms duration_ms start_time end_time start_ns end_ns peer_engine_id remote_request_id substrate",
    "kv_retention": "trace_id span_id request_id session_id turn engine_id blocks tokens bytes ttl_s outcome "
    "start_time end_time start_ns end_ns held_s byte_seconds substrate",
    "engine_requests": "trace_id span_id request_id session_id turn engine_id engine_role phase prompt_tokens "
    "output_tokens cached_tokens start_ns end_ns duration_ms substrate",
    "llm_calls": "trace_id span_id session_id turn request_id model input_tokens output_tokens ttft_ms tpot_ms outcome "
    "pulled_tokens start_ns end_ns duration_ms status_code",
    "tool_calls": "trace_id span_id session_id turn tool_name tool_call_id start_time end_time start_ns end_ns "
    "duration_ms status_code",
    "app_work": "trace_id span_id session_id turn work_name start_ns end_ns duration_ms",
    "turns": "trace_id span_id session_id turn start_time end_time start_ns end_ns duration_ms",
    "sessions": "trace_id session_id agent_name scenario start_time end_time start_ns end_ns wall_ms turns traces "
    "requests kv_gib_s",
    "continuity": "trace_id span_id request_id session_id turn start_ns agent_name scenario source continuity "
    "diverged_at reusable_tokens_lost offer_reason outcome prompt_tokens local_hit_tokens pulled_tokens "
    "recomputed_tokens prefill_ms ttft_ms",
    "vllm_requests": "trace_id span_id parent_span_id vllm_request_id request_id session_id turn leg proxy_span_id "
    "request_trace_id matched_by service_name model prompt_tokens completion_tokens queue_ms ttft_ms e2e_ms "
    "prefill_ms decode_ms inference_ms start_time end_time start_ns end_ns duration_ms status_code",
    "turn_gaps": "trace_id span_id session_id turn request_id engine_id agent_name scenario start_ns end_ns held_s "
    "blocks tokens bytes ttl_s retention_outcome time_scale next_trace_id next_span_id next_request_id next_turn "
    "next_engine_id next_start_ns gap_s expiry_gap_s entry_age_s offer_ttl_s offered offer_reason outcome "
    "pulled_tokens recomputed_tokens",
    "trace_sessions": "trace_id session_id agent_session_id proxy_session_id join_kind",
    "agent_llm_calls": "trace_id span_id name session_id convention model input_tokens output_tokens cached_tokens "
    "ttft_ms start_ns end_ns duration_ms status_code join_kind request_trace_id request_span_id "
    "request_id outcome pulled_tokens",
}
SPANS_DERIVED = (
    "trace_id span_id parent_span_id name kind service_name start_time end_time start_ns end_ns duration_ms "
    "status_code session_id request_id turn engine_id engine_role substrate"
).split()


def _provider(tmp_path, resource_attrs):
    exporter = ParquetSpanExporter(tmp_path / "traces")
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource(resource_attrs))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, exporter, memory


def _emit(provider):
    """A session with nested spans, every attribute type, events with attributes, a link, an error."""
    tracer = provider.get_tracer("kvtrace.test", "9.9")
    ids = {sc.SESSION_ID: "s-1", sc.TURN_INDEX: 3, sc.GEN_AI_REQUEST_ID: "req-7"}
    root = tracer.start_span(
        sc.SPAN_PROXY_REQUEST,
        kind=SpanKind.SERVER,
        start_time=T0,
        attributes={
            **ids,
            sc.REQUEST_STREAM: True,
            sc.PROXY_OFFER: False,
            sc.REQUEST_TTFT_MS: 12.25,
            sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop", "length"),
            sc.HTTP_RESPONSE_STATUS_CODE: 200,
            sc.KV_PULLED_TOKENS: 2**40,
            sc.KV_OUTCOME: sc.OUTCOME_PULLED,
        },
    )
    root.add_event(sc.EVENT_FIRST_TOKEN, {sc.SERVER_PORT: 8100, sc.ERROR_TYPE: "x"}, timestamp=T0 + 5)
    root.add_event(sc.EVENT_LAST_TOKEN, timestamp=T0 + 9)
    ctx = set_span_in_context(root)
    dec = tracer.start_span(
        sc.SPAN_KV_DECISION,
        context=ctx,
        start_time=T0 + 100,
        attributes={
            **ids,
            sc.KV_DIRECTION: sc.DIRECTION_D2P,
            sc.KV_OUTCOME: sc.OUTCOME_PULLED,
            sc.KV_PROMPT_TOKENS: 1000,
            sc.KV_LOCAL_HIT_TOKENS: 16,
            sc.KV_REMOTE_TOKENS: 900,
            sc.KV_PULLED_TOKENS: 900,
            sc.KV_RECOMPUTED_TOKENS: 84,
            sc.KV_THRESHOLD: 64,
            sc.KV_EXPIRY_REMAINING_S: 470.5,
            sc.KV_PEER_ENGINE_ID: "D0",
            sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
            sc.KV_VERIFY_MODE: sc.VERIFY_RECORD,
            sc.KV_VERIFIED_TOKENS: 512,
            sc.KV_VERIFY_MISMATCH_TOKEN: 512,
            sc.KV_VERIFY_WRONG_TOKENS: 372,
            sc.ENGINE_ROLE: sc.ROLE_DECODE,
        },
    )
    xfer = tracer.start_span(
        sc.SPAN_KV_TRANSFER,
        context=set_span_in_context(dec),
        start_time=T0 + 200,
        links=[Link(root.get_span_context(), {sc.KV_THRESHOLD: 64})],
        attributes={**ids, sc.KV_TRANSFER_BYTES: 5 << 20, sc.KV_TRANSFER_XFER_MS: 0.1},
    )
    xfer.set_status(Status(StatusCode.ERROR, "nixl said no"))
    xfer.end(T0 + 2_000_300)
    dec.end(T0 + 3_000_000)
    root.end(T0 + 9_000_000_000)
    tool = tracer.start_span(
        sc.SPAN_AGENT_TOOL_CALL,
        start_time=T0 + 10,
        attributes={
            sc.SESSION_ID: "s-1",
            sc.TURN_INDEX: 3,
            sc.GEN_AI_TOOL_NAME: "grep",
            sc.GEN_AI_TOOL_CALL_ID: "call-1",
        },
    )
    tool.set_status(Status(StatusCode.OK))
    tool.end(T0 + 1_000)


def _expected(span):
    attrs = dict(span.attributes)
    as_str = {
        k: (
            "true"
            if v is True
            else "false"
            if v is False
            else json.dumps(list(v), separators=(",", ":"))
            if isinstance(v, tuple)
            else str(v)
        )
        for k, v in attrs.items()
    }
    return {
        "trace_id": format(span.context.trace_id, "032x"),
        "span_id": format(span.context.span_id, "016x"),
        "parent_span_id": format(span.parent.span_id, "016x") if span.parent else "",
        "name": span.name,
        "kind": {SpanKind.SERVER: "SPAN_KIND_SERVER", SpanKind.INTERNAL: "SPAN_KIND_INTERNAL"}[span.kind],
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "Duration": span.end_time - span.start_time,
        "status_code": {
            StatusCode.UNSET: "STATUS_CODE_UNSET",
            StatusCode.OK: "STATUS_CODE_OK",
            StatusCode.ERROR: "STATUS_CODE_ERROR",
        }[span.status.status_code],
        "StatusMessage": span.status.description or "",
        "ScopeName": "kvtrace.test",
        "ScopeVersion": "9.9",
        "SpanAttributes": as_str,
        "SpanAttributesInt": {k: v for k, v in attrs.items() if type(v) is int},
        "SpanAttributesFloat": {k: v for k, v in attrs.items() if type(v) is float},
        "events": [(e.name, e.timestamp, {k: str(v) for k, v in e.attributes.items()}) for e in span.events],
        "links": [
            (
                format(lk.context.trace_id, "032x"),
                format(lk.context.span_id, "016x"),
                {k: str(v) for k, v in lk.attributes.items()},
            )
            for lk in span.links
        ],
    }


def _stored(con):
    cols = (
        "trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, Duration, status_code, StatusMessage, "
        "ScopeName, ScopeVersion, SpanAttributes, SpanAttributesInt, SpanAttributesFloat, "
        'list_transform("Events.Timestamp", lambda x: epoch_ns(x)), "Events.Name", "Events.Attributes", '
        '"Links.TraceId", "Links.SpanId", "Links.Attributes", '
        "ResourceAttributes, service_name, engine_id, engine_role, substrate"
    )
    out = {}
    for row in con.execute(f"SELECT {cols} FROM spans").fetchall():
        d = dict(
            zip(
                [
                    "trace_id",
                    "span_id",
                    "parent_span_id",
                    "name",
                    "kind",
                    "start_ns",
                    "end_ns",
                    "Duration",
                    "status_code",
                    "StatusMessage",
                    "ScopeName",
                    "ScopeVersion",
                    "SpanAttributes",
                    "SpanAttributesInt",
                    "SpanAttributesFloat",
                ],
                row[:15],
                strict=True,
            )
        )
        d["events"] = [(n, t, a) for t, n, a in zip(row[15], row[16], row[17], strict=True)]
        d["links"] = list(zip(row[18], row[19], row[20], strict=True))
        out[d["span_id"]] = (d, row[21:])
    return out


def test_round_trip_exact_values(tmp_path):
    resource = {
        sc.SERVICE_NAME: "svc-a",
        sc.ENGINE_ID: "P0",
        sc.ENGINE_ROLE: sc.ROLE_PREFILL,
        sc.SUBSTRATE: sc.SUBSTRATE_SIM,
    }
    provider, exporter, memory = _provider(tmp_path, resource)
    _emit(provider)
    assert provider.force_flush()
    con = reader.connect(tmp_path / "traces")
    stored = _stored(con)
    spans = memory.get_finished_spans()
    assert len(stored) == len(spans) == 4
    for span in spans:
        row, extra = stored[format(span.context.span_id, "016x")]
        assert row == _expected(span)
        role = sc.ROLE_DECODE if span.name == sc.SPAN_KV_DECISION else sc.ROLE_PREFILL  # span attr overrides resource
        assert extra == ({k: str(v) for k, v in resource.items()}, "svc-a", "P0", role, sc.SUBSTRATE_SIM)
    provider.shutdown()


def test_typed_views(tmp_path):
    provider, _, memory = _provider(tmp_path, {sc.SERVICE_NAME: "svc-a", sc.SUBSTRATE: sc.SUBSTRATE_VLLM})
    _emit(provider)
    provider.force_flush()
    con = reader.connect(tmp_path / "traces")
    by_name = {s.name: s for s in memory.get_finished_spans()}
    dec = con.execute("SELECT * FROM kv_decisions").fetchall()
    assert len(dec) == 1
    row = dict(zip(reader.view_columns(con)["kv_decisions"], dec[0], strict=True))
    row.pop("start_time")
    assert row == {
        "trace_id": format(by_name[sc.SPAN_KV_DECISION].context.trace_id, "032x"),
        "span_id": format(by_name[sc.SPAN_KV_DECISION].context.span_id, "016x"),
        "request_id": "req-7",
        "session_id": "s-1",
        "turn": 3,
        "engine_id": None,
        "engine_role": sc.ROLE_DECODE,
        "direction": sc.DIRECTION_D2P,
        "outcome": sc.OUTCOME_PULLED,
        "prompt_tokens": 1000,
        "local_hit_tokens": 16,
        "remote_tokens": 900,
        "pulled_tokens": 900,
        "recomputed_tokens": 84,
        "threshold": 64,
        "expiry_remaining_s": 470.5,
        "peer_engine_id": "D0",
        "verified": sc.VERIFIED_MISMATCH,
        "verify_mode": sc.VERIFY_RECORD,
        "verified_tokens": 512,
        "first_mismatch_token": 512,
        "wrong_tokens": 372,
        "start_ns": T0 + 100,
        "duration_ms": (3_000_000 - 100) / 1e6,
        "service_name": "svc-a",
        "substrate": sc.SUBSTRATE_VLLM,
    }
    req = con.execute(
        "SELECT ttft_ms, latency_ms, http_status, stream, offered, pulled_tokens, outcome FROM requests"
    ).fetchall()
    assert req == [(12.25, 9_000.0, 200, True, False, 2**40, sc.OUTCOME_PULLED)]
    assert con.execute("SELECT bytes, xfer_ms, status, end_ns - start_ns FROM kv_transfers").fetchall() == [
        (5 << 20, 0.1, None, 2_000_100)
    ]
    assert con.execute("SELECT tool_name, tool_call_id, status_code, duration_ms FROM tool_calls").fetchall() == [
        ("grep", "call-1", "STATUS_CODE_OK", 990 / 1e6)
    ]
    assert con.execute("SELECT session_id, turns, traces, requests, start_ns FROM sessions").fetchall() == [
        ("s-1", 1, 2, 1, T0)
    ]
    provider.shutdown()


def test_view_columns_are_the_contract():
    cols = reader.view_columns()
    assert {v.name for v in views.PUBLIC} == {"spans", "session_breakdown", "turn_breakdown", *EXPECTED_COLUMNS}
    for name, expected in EXPECTED_COLUMNS.items():
        assert cols[name] == expected.split() == list(views.BY_NAME[name].column_names), name
    assert cols["spans"][-len(SPANS_DERIVED) :] == SPANS_DERIVED


def test_every_view_works_on_empty_store(tmp_path):
    con = reader.connect(tmp_path / "missing", allow_empty=True)
    assert reader.view_columns(con) == reader.view_columns()
    for v in views.VIEWS:
        assert con.execute(f"SELECT count(*) FROM {v.name}").fetchone() == (0,)
    with pytest.raises(reader.StoreError, match="does not exist"):
        reader.connect(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(reader.StoreError, match="no trace files"):
        reader.connect(tmp_path / "empty")


def test_unwritable_directory_returns_failure_and_logs(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    exporter = ParquetSpanExporter(blocker / "traces")
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("t").start_span(sc.SPAN_AGENT_TURN).end()
    with caplog.at_level(logging.ERROR, logger="kvtrace.store.exporter"):
        assert exporter.export(memory.get_finished_spans()) is SpanExportResult.FAILURE
        assert exporter.export(memory.get_finished_spans()) is SpanExportResult.FAILURE
    # one line per episode of failures, not per batch (a full disk fails every batch)
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert "failed" in caplog.records[0].getMessage()
    assert (exporter.failure_reason, exporter.failed_spans) == (sc.DROP_WRITE_FAILED, 2)
    exporter.shutdown()


def test_shutdown_idempotent_merges_and_refuses_after(tmp_path):
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(30):
        tracer.start_span(sc.SPAN_AGENT_TURN, attributes={sc.TURN_INDEX: i}).end()
    spans = memory.get_finished_spans()
    exporter = ParquetSpanExporter(tmp_path, roll_bytes=10**12, roll_seconds=10**6, grace_seconds=0)
    for i in range(0, 30, 10):
        assert exporter.export(spans[i : i + 10]) is SpanExportResult.SUCCESS
    assert [files.parse_name(os.path.basename(p)).segment for p in files.list_files(tmp_path)] == [False] * 3
    exporter.shutdown()
    exporter.shutdown()
    listed = files.list_files(tmp_path)
    assert [os.path.basename(p) for p in listed] == [files.segment_name(exporter.writer, 1, 3)]
    assert exporter.export(spans[:1]) is SpanExportResult.FAILURE
    con = reader.connect(tmp_path)
    assert con.execute("SELECT count(DISTINCT span_id), count(*), sum(turn) FROM spans").fetchone() == (
        30,
        30,
        sum(range(30)),
    )


def test_list_files_drops_covered_batches_and_dot_files(tmp_path):
    part = tmp_path / "date=2026-01-01" / "hour=00"
    part.mkdir(parents=True)
    for name in [
        "w-1-a-b00000001.parquet",
        "w-1-a-b00000002.parquet",
        "w-1-a-b00000003.parquet",
        "w-1-a-s00000001-00000002.parquet",
        "w-2-b-b00000001.parquet",
        ".w-1-a-b00000004.parquet.tmp",
    ]:
        (part / name).write_bytes(b"")
    assert [os.path.basename(p) for p in files.list_files(tmp_path)] == [
        "w-1-a-b00000003.parquet",
        "w-1-a-s00000001-00000002.parquet",
        "w-2-b-b00000001.parquet",
    ]


def _cli(capsys, *argv):
    rc = cli.main(["query", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_errors_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KVTRACE_TRACES_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    for argv, needle in [
        (["SELECT 1", "--traces", str(tmp_path / "missing")], "does not exist"),
        (["SELECT 1", "--traces", str(tmp_path)], "no trace files"),
        (["SELECT 1"], "trace directory kvtrace-traces does not exist"),  # the default, as report/dashboard
    ]:
        rc, out, err = _cli(capsys, *argv)
        assert (rc, out) == (2, "")
        assert err.count("\n") == 1 and needle in err and "Traceback" not in err
    provider, _, _ = _provider(tmp_path, {sc.SERVICE_NAME: "svc"})
    _emit(provider)
    provider.force_flush()
    traces = str(tmp_path / "traces")
    for bad in ("SELEC oops", "SELECT nope FROM spans", "SELECT * FROM no_such_view"):
        rc, out, err = _cli(capsys, bad, "--traces", traces)
        assert (rc, out) == (2, "") and err.count("\n") == 1 and err.startswith("kvtrace query: error: ")
    rc, out, err = _cli(
        capsys,
        "SELECT name, turn FROM spans WHERE name = ? ORDER BY 1".replace("?", f"'{sc.SPAN_AGENT_TOOL_CALL}'"),
        "--traces",
        traces,
        "--format",
        "csv",
    )
    assert (rc, out) == (0, f"name,turn\n{sc.SPAN_AGENT_TOOL_CALL},3\n")
    rc, out, _ = _cli(capsys, "SELECT count(*) AS n FROM kv_decisions", "--traces", traces, "--format", "json")
    assert json.loads(out) == [{"n": 1}]
    rc, out, _ = _cli(capsys, "SELECT count(*) AS n FROM spans", "--traces", traces)
    assert out.splitlines() == ["n", "-", "4", "(1 row)"]
    rc, out, err = _cli(capsys, "SELECT 1", "--traces", traces, "--format", "parquet")
    assert rc == 2 and "--output" in err
    target = tmp_path / "o.parquet"
    assert (
        _cli(capsys, "SELECT * FROM requests", "--traces", traces, "--format", "parquet", "--output", str(target))[0]
        == 0
    )
    import pyarrow.parquet as pq

    assert pq.read_table(target).num_rows == 1
    provider.shutdown()
