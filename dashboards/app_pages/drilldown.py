"""Session drill-down: the turn breakdown and a waterfall of every span of one session."""

import altair as alt
import streamlit as st

from kvtrace.analysis import sessions
from kvtrace.analysis.filters import Filters
from kvtrace.dashboards.common import (
    MIN_BAR,
    PART_LABELS,
    chart,
    df,
    fmt_ms,
    no_data,
    part_colours,
    q,
    ranked,
    sidebar,
    table,
    waterfall,
)

MAX_SPANS = 2000
ROW_PX, MAX_PX = 16, 12000  # waterfall: one 16 px row per span, plot at most 12000 px tall

directory, filters, facets = sidebar()
st.title("Session drill-down")
if no_data(facets, directory):
    st.stop()

if filters.session_id:
    session_id = filters.session_id
else:
    choices = q(sessions.list_sessions, directory, filters, limit=500)
    if not choices:
        st.info("No session matches the filters.")
        st.stop()
    session_id = st.selectbox("Session (the 500 longest; type an id in the sidebar for any other)", choices)

info = q(sessions.session_info, directory, session_id)
if not info:
    st.warning(f"No session `{session_id}`.")
    st.stop()
c = st.columns(4)
c[0].metric("Wall time", fmt_ms(info["wall_ms"]))
c[1].metric("Turns", info["turns"])
c[2].metric("Traces", info["traces"])
c[3].metric("Requests", info["requests"])
if info.get("scenario"):
    st.caption(f"agent: {info.get('agent_name')} · scenario: {info['scenario']}")

turns = df(q(sessions.turns, directory, Filters(session_id=session_id)))
if not turns.empty:
    st.subheader("Turns")
    long = turns.melt(id_vars=["turn"], value_vars=list(PART_LABELS), var_name="part", value_name="ms")
    long["part"] = long["part"].map(PART_LABELS)
    parts = list(PART_LABELS.values())
    chart(
        st,
        alt.Chart(ranked(long, "part", parts))
        .mark_bar()
        .encode(
            x=alt.X("turn:O", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("ms:Q", stack="zero"),
            color=alt.Color("part:N", sort=parts, scale=part_colours()),
            order=alt.Order("rank:Q"),
            tooltip=["turn", "part", alt.Tooltip("ms:Q", format=",.1f")],
        )
        .properties(height=220),
    )
    table(st, turns.drop(columns=["session_id", "end_ns"]))

spans = q(sessions.spans_of_session, directory, session_id, limit=MAX_SPANS, clip_ns=info["end_ns"])
st.subheader(f"Spans ({len(spans)}{'+, first ' + str(MAX_SPANS) if len(spans) >= MAX_SPANS else ''})")
if spans:
    frame = waterfall(spans)
    dense = ROW_PX * len(frame) > MAX_PX  # then thin out the labels rather than stack them
    chart(
        st,
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("start_ms:Q", title="ms since the session's first span"),
            x2="bar_end_ms:Q",
            y=alt.Y(
                "label:N",
                sort=None,
                title=None,
                axis=alt.Axis(labelLimit=320, labelOverlap="greedy" if dense else False),
            ),
            color=alt.Color("lane:N", title="lane"),
            tooltip=[
                "name",
                "service_name",
                "engine_id",
                "turn",
                "request_id",
                alt.Tooltip("duration_ms:Q", format=",.2f"),
                "status_code",
                "clipped",
            ],
        )
        .properties(height=MAX_PX if dense else alt.Step(ROW_PX)),
    )
    st.caption(
        "Retention spans still held after the session ended are cut at its end (clipped). Bars shorter than "
        f"{MIN_BAR:.1%} of the session (KV transfers, decisions) are drawn at that width so they stay visible; "
        "their tooltip has the real duration."
    )
