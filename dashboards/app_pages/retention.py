"""Retention: KV bytes decode workers hold for next turns, expiries, blocks never read."""

import altair as alt
import pandas as pd
import streamlit as st

from kvtrace.analysis import retention
from kvtrace.dashboards.common import chart, df, fmt_bytes, no_data, q, sidebar, table
from kvtrace.store.units import GIB

directory, filters, facets = sidebar()
st.title("Retention on decode workers")
if no_data(facets, directory):
    st.stop()

tot = q(retention.totals, directory, filters)
c = st.columns(3) + st.columns(3)  # counts, then bytes
c[0].metric("Retained requests", f"{tot['retained']:,}")
c[1].metric("Read by the next turn", f"{tot['read']:,}")
c[2].metric("Expired unread", f"{tot['expired']:,}")
c[3].metric(
    "Peak held",
    fmt_bytes(tot["peak_bytes_sum"]),
    "at one time",
    delta_color="off",
    delta_arrow="off",
    help="The most KV each decode engine held at one time, summed over the engines.",
)
c[4].metric(
    "Never read (run total)",
    fmt_bytes(tot["bytes_never_read"]),
    f"{tot['blocks_never_read']:,} blocks",
    delta_color="off",
    delta_arrow="off",
    help="Every retention no next turn read, added up over the whole run: what was held in vain, not an "
    "amount held at one time (compare Peak held).",
)
c[5].metric("Byte·seconds", f"{tot['byte_seconds'] / GIB:,.1f} GiB·s")
t0, t1 = filters.start_ns or facets["start_ns"], filters.end_ns or facets["end_ns"]
span_s = (t1 - t0) / 1e9 if t0 is not None and t1 is not None and t1 > t0 else None
st.caption(
    "Never read adds up over the run; Peak held is the most held at one time."
    + (
        f" Over these {span_s:,.0f} s (wall) that is {fmt_bytes(tot['bytes_never_read'] / span_s)} per second "
        "never read."
        if span_s
        else ""
    )
)

series = df(q(retention.series, directory, filters, max_points=1500))
if not series.empty:
    series["time"] = pd.to_datetime(series["t"], unit="ns", utc=True)
    series["GiB held"] = series["bytes_held"] / GIB
    chart(
        st,
        alt.Chart(series)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("time:T", title="time (UTC)"),
            y=alt.Y("GiB held:Q"),
            color=alt.Color("engine_id:N", title="D engine"),
            tooltip=["engine_id", "time:T", alt.Tooltip("GiB held:Q", format=",.3f"), "blocks_held"],
        )
        .properties(title="KV held on D over time (bucket maxima)", height=300),
    )
st.subheader("Per decode engine")
table(st, pd.DataFrame(q(retention.summary, directory, filters)))
st.subheader("Expiries")
exp = df(q(retention.expiries, directory, filters, limit=1000))
if exp.empty:
    st.caption("No retained blocks expired unread.")
else:
    table(st, exp)
