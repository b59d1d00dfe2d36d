"""Latency by turn index: TTFT and completed-task latency."""

import altair as alt
import streamlit as st
from common import chart, df, no_data, q, sidebar

from kvtrace.analysis import latency

directory, filters, facets = sidebar()
st.title("Latency by turn index")
st.caption("TTFT per LLM call (agent spans, else proxy requests) and completed-task latency "
           "(the turn's wall time). Reuse pays off in later turns.")
if no_data(facets, directory):
    st.stop()

table = df(q(latency.by_turn, directory, filters))
if table.empty:
    st.info("No turns match the filters.")
    st.stop()
left, right = st.columns(2)
ttft = table.melt(id_vars=["turn"], value_vars=["ttft_p50_ms", "ttft_p90_ms"], var_name="stat", value_name="ms")
chart(left, alt.Chart(ttft.dropna()).mark_line(point=True).encode(
    x=alt.X("turn:O", axis=alt.Axis(labelAngle=0)), y=alt.Y("ms:Q", title="TTFT ms"), color="stat:N",
    strokeDash="stat:N", tooltip=["turn", "stat", alt.Tooltip("ms:Q", format=",.1f")],
).properties(title="Time to first token", height=280))
task = table.melt(id_vars=["turn"], value_vars=["task_p50_ms", "task_p90_ms"], var_name="stat", value_name="ms")
chart(right, alt.Chart(task.dropna()).mark_line(point=True).encode(
    x=alt.X("turn:O", axis=alt.Axis(labelAngle=0)), y=alt.Y("ms:Q", title="turn ms"), color="stat:N",
    strokeDash="stat:N", tooltip=["turn", "stat", alt.Tooltip("ms:Q", format=",.1f")],
).properties(title="Completed-task latency", height=280))
st.dataframe(table, hide_index=True, width="stretch")
