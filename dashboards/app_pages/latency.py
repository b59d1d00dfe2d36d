"""Latency by turn index: TTFT and completed-task latency."""

import altair as alt
import streamlit as st

from kvtrace.analysis import latency
from kvtrace.dashboards.common import chart, df, no_data, q, sidebar, table

directory, filters, facets = sidebar()
st.title("Latency by turn index")
st.caption(
    "TTFT per LLM call (agent spans, else proxy requests) and completed-task latency "
    "(the turn's wall time). Reuse pays off in later turns."
)
if no_data(facets, directory):
    st.stop()

by_turn = df(q(latency.by_turn, directory, filters))
if by_turn.empty:
    st.info("No turns match the filters.")
    st.stop()
left, right = st.columns(2)
ttft = by_turn.melt(id_vars=["turn"], value_vars=["ttft_p50_ms", "ttft_p90_ms"], var_name="stat", value_name="ms")
chart(
    left,
    alt.Chart(ttft.dropna())
    .mark_line(point=True)
    .encode(
        x=alt.X("turn:O", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("ms:Q", title="TTFT ms"),
        color="stat:N",
        strokeDash="stat:N",
        tooltip=["turn", "stat", alt.Tooltip("ms:Q", format=",.1f")],
    )
    .properties(title="Time to first token", height=280),
)
task = by_turn.melt(id_vars=["turn"], value_vars=["task_p50_ms", "task_p90_ms"], var_name="stat", value_name="ms")
chart(
    right,
    alt.Chart(task.dropna())
    .mark_line(point=True)
    .encode(
        x=alt.X("turn:O", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("ms:Q", title="turn ms"),
        color="stat:N",
        strokeDash="stat:N",
        tooltip=["turn", "stat", alt.Tooltip("ms:Q", format=",.1f")],
    )
    .properties(title="Completed-task latency", height=280),
)
table(st, by_turn)
