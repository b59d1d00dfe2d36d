"""The agent API replaces a session id that is not a valid id (a newline, a NUL, too long) with a
fresh one and counts it: the bad text reaches no span, header, body field or baggage."""

from __future__ import annotations

import logging

import pytest
from opentelemetry import baggage

from kvtrace import semconv as sc
from kvtrace.agent import api
from kvtrace.agent.api import Agent
from kvtrace.agent.context import extra_body


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("s1\n| forged |", "holds a non-printable character (U+000A)"),
        ("\x00\n\ufffd", "holds a non-printable character (U+0000)"),
        ("x" * 257, "is longer than 256 bytes"),
    ],
)
def test_an_invalid_session_id_is_replaced_and_counted(tracer_provider, span_exporter, caplog, given, problem):
    agent = Agent(tracer_provider)
    before = api.REPLACED_SESSION_IDS.value
    with caplog.at_level(logging.WARNING, logger="kvtrace.agent.api"):
        with agent.session(given) as state:
            sid = state.session_id
            assert baggage.get_baggage(sc.BAGGAGE_SESSION_ID) == sid
            assert extra_body() == {sc.BODY_CONVERSATION_ID: sid}
    assert len(sid) == 32 and int(sid, 16) >= 0 and sid != given
    assert api.REPLACED_SESSION_IDS.value == before + 1
    (span,) = span_exporter.get_finished_spans()
    assert span.attributes[sc.SESSION_ID] == sid and span.attributes[sc.GEN_AI_CONVERSATION_ID] == sid
    assert [r.getMessage() for r in caplog.records] == [f"kvtrace agent: session id {problem}; using {sid} instead"]


def test_a_valid_session_id_is_kept_and_not_counted(tracer_provider, span_exporter):
    before = api.REPLACED_SESSION_IDS.value
    with Agent(tracer_provider).session("conv <1> | é") as state:
        assert state.session_id == "conv <1> | é"
    assert api.REPLACED_SESSION_IDS.value == before
