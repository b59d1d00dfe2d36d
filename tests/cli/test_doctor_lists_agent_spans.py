"""``kvtrace doctor`` lists what the breakdown placed and what it ignored; ``kvtrace report`` warns
about sessions holding spans it could not place."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.cli import main
from kvtrace.testing.synth import SpanBuilder

OI = sc.OPENINFERENCE_SPAN_KIND


@pytest.fixture
def traces(tmp_path):
    b = SpanBuilder()
    root = b.span("agent", 0, 1000, attrs={OI: sc.OI_AGENT, sc.SESSION_ID: "s-oi"})
    llm = b.span("llm", 100, 400, parent=root, attrs={OI: sc.OI_LLM})
    b.request("s-oi", 0, "r-1", 110, 390, 50.0, parent=llm, outcome=sc.OUTCOME_PULLED)
    b.span("odd", 500, 520, parent=root, attrs={OI: sc.OI_UNKNOWN})
    b.span("odd", 530, 540, parent=root, attrs={OI: sc.OI_UNKNOWN})
    b.span("custom", 600, 700, parent=root, attrs={sc.GEN_AI_OPERATION_NAME: "plan_things"})
    b.span("orphan tool", 5000, 5100, attrs={sc.TRACELOOP_SPAN_KIND: sc.TL_TOOL})  # no session anywhere
    b.write(tmp_path / "agents")
    return tmp_path / "agents"


@pytest.fixture
def clean(tmp_path):
    b = SpanBuilder()
    run = b.span("invoke_agent a", 0, 500, attrs={sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.SESSION_ID: "s-g"})
    b.span("execute_tool t", 100, 200, parent=run, attrs={sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL})
    b.write(tmp_path / "clean")
    return tmp_path / "clean"


def _section(out: str, title: str) -> list[str]:
    block = out.split(f"## {title}\n", 1)[1].split("\n\n", 1)[0]
    return [" ".join(line.split()) for line in block.splitlines()]


def test_doctor_lists_placed_unplaced_and_sessionless_spans(traces, capsys):
    assert main(["doctor", "--traces", str(traces)]) == 1
    out = capsys.readouterr().out
    assert _section(out, "Agent-side spans placed, by convention and role") == [
        "convention role spans with_own_session_id",
        "openinference agent 1 1",
        "openinference llm_call 1 0",
        "openllmetry tool_wait 1 0",
    ]
    assert _section(out, "Seen but not placed (the session is flagged)") == [
        "name attribute spans traces",
        "odd openinference.span.kind=UNKNOWN 2 1",
        "custom gen_ai.operation.name=plan_things 1 1",
    ]
    assert _section(out, "Placed, but in no session (no session id in the trace, no proxy request)") == [
        "convention role spans traces",
        "openllmetry tool_wait 1 1",
    ]
    assert _section(out, "LLM calls and their proxy requests") == [
        "convention join_kind llm_calls with_kv_decision",
        "openinference trace 1 1",
    ]
    assert _section(out, "Sessions flagged") == ["session_id unplaced_spans turns wall_ms", "s-oi 3 1 1000.0"]
    assert out.rstrip().endswith("4 agent-side span(s) ignored")


def test_doctor_on_fully_understood_traces_exits_0(clean, capsys):
    assert main(["doctor", "--traces", str(clean)]) == 0
    out = capsys.readouterr().out
    assert _section(out, "Seen but not placed (the session is flagged)") == ["(none)"]
    assert out.rstrip().endswith("every agent-side span was placed")


def test_doctor_on_a_missing_directory_is_one_line(tmp_path, capsys):
    assert main(["doctor", "--traces", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvtrace doctor: error: ") and err.count("\n") == 1


def test_report_warns_about_flagged_sessions(traces, clean, capsys):
    assert main(["report", "--traces", str(traces), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert (
        "> **Warning:** 1 session(s) hold 3 agent-side span(s) the breakdown could not place (a convention's "
        "attribute with a value kvtrace does not map); their time counts as unattributed. "
        f"`kvtrace doctor --traces {traces}` lists them." in out
    )
    assert main(["report", "--traces", str(clean), "--no-plots"]) == 0
    assert "Warning:" not in capsys.readouterr().out
