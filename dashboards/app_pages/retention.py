"""Retention: KV bytes decode workers hold for next turns, expiries, blocks never read."""

import altair as alt
import pandas as pd
import streamlit as st
from common import chart, df, fmt_bytes, no_data, q, sidebar

from kvtrace.analysis import retention

directory, filters, facets = sidebar()
st.title("Retention on decode workers")
if no_data(facets, directory):
    st.stop()

tot = q(retention.totals, directory, filters)
c = st.columns(5)
c[0].metric("Retained requests", f"{tot['retained']:,}")
c[1].metric("Read by the next turn", f"{tot['read']:,}")
c[2].metric("Expired unread", f"{tot['expired']:,}")
c[3].metric("Never read", fmt_bytes(tot["bytes_never_read"]), f"{tot['blocks_never_read']:,} blocks",
            delta_color="off", delta_arrow="off")
c[4].metric("Byte·seconds", f"{tot['byte_seconds'] / 2**30:,.1f} GiB·s")

series = df(q(retention.series, directory, filters, max_points=1500))
if not series.empty:
    series["time"] = pd.to_datetime(series["t"], unit="ns", utc=True)
    series["GiB held"] = series["bytes_held"] / 2**30
    chart(st, alt.Chart(series).mark_line(interpolate="step-after").encode(
        x=alt.X("time:T", title="time (UTC)"), y=alt.Y("GiB held:Q"), color=alt.Color("engine_id:N", title="D engine"),
        tooltip=["engine_id", "time:T", alt.Tooltip("GiB held:Q", format=",.3f"), "blocks_held"],
    ).properties(title="KV held on D over time (bucket maxima)", height=300))
st.subheader("Per decode engine")
st.dataframe(pd.DataFrame(q(retention.summary, directory, filters)), hide_index=True, width="stretch")
st.subheader("Expiries")
exp = df(q(retention.expiries, directory, filters, limit=1000))
if exp.empty:
    st.caption("No retained blocks expired unread.")
else:
    st.dataframe(exp, hide_index=True, width="stretch")
