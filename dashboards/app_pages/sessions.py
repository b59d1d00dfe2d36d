"""Sessions overview: where agent time goes (input processing, generation, tool waits, app work,
user pauses)."""

import altair as alt
import pandas as pd
import streamlit as st

from kvtrace.analysis import sessions
from kvtrace.dashboards.common import PART_LABELS, chart, df, fmt_ms, no_data, part_colours, q, ranked, sidebar, table
from kvtrace.store.views.breakdown import PRECEDENCE

directory, filters, facets = sidebar()
st.title("Sessions")
st.caption(
    "Each session's wall time split into five parts that add up to it. Overlaps are counted once, "
    f"by precedence {' > '.join(PRECEDENCE)}; app work includes unattributed time; user pauses are "
    "the spans the agent marks as waiting for its user (think time, pause-resume gaps)."
)
if no_data(facets, directory):
    st.stop()

cols = st.columns(7)  # the totals, filled in below: one query computes them with the table's rows
left, mid, right = st.columns([2, 1, 1])
order = left.selectbox(
    "Sort by",
    list(sessions.SORTABLE),
    index=list(sessions.SORTABLE).index("wall_ms"),
    format_func=lambda column: column.replace("_", " "),
)
descending = mid.toggle("Descending", value=True)
limit = right.number_input("Rows", min_value=10, max_value=100_000, value=500, step=100)
overview = q(sessions.overview, directory, filters, order=order, descending=descending, limit=int(limit))
tot, rows = overview["totals"], df(overview["rows"])

if tot.get("flagged_sessions"):  # agent spans of a convention kvtrace could not place
    st.warning(
        f"{tot['flagged_sessions']:,} session(s) hold {tot['unplaced_spans']:,} agent-side span(s) the breakdown "
        "could not place; their time counts as unattributed (column `unplaced_spans`). "
        f"`kvtrace doctor --traces {directory}` lists them."
    )
cols[0].metric("Sessions", f"{tot['sessions']:,}")
cols[1].metric("Turns", f"{tot['turns']:,}")
for col, (key, label) in zip(cols[2:], PART_LABELS.items(), strict=True):
    share = tot[key] / tot["wall_ms"] if tot["wall_ms"] else 0
    col.metric(label.capitalize(), f"{share:.0%}", fmt_ms(tot[key]), delta_color="off", delta_arrow="off")

top = rows.head(50)
parts = list(PART_LABELS.values())
if not top.empty:
    long = top.melt(id_vars=["session_id"], value_vars=list(PART_LABELS), var_name="part", value_name="ms")
    long["part"] = long["part"].map(PART_LABELS)
    chart(
        st,
        alt.Chart(ranked(long, "part", parts))
        .mark_bar()
        .encode(
            y=alt.Y("session_id:N", sort=list(top["session_id"]), title=None, axis=alt.Axis(labelLimit=240)),
            x=alt.X("ms:Q", stack="zero", title="ms"),
            color=alt.Color("part:N", sort=parts, title="part", scale=part_colours()),
            order=alt.Order("rank:Q"),
            tooltip=["session_id", "part", alt.Tooltip("ms:Q", format=",.1f")],
        )
        .properties(height=alt.Step(20), title=f"First {len(top)} sessions by {order.replace('_', ' ')}"),
    )

totals = pd.DataFrame({"part": parts, "ms": [tot[k] for k in PART_LABELS]})
chart(
    st,
    alt.Chart(ranked(totals, "part", parts))
    .mark_bar()
    .encode(
        x=alt.X("ms:Q", stack="normalize", title="share of all wall time", axis=alt.Axis(format="%")),
        color=alt.Color(
            "part:N",
            sort=parts,
            title=None,
            scale=part_colours(),
            legend=alt.Legend(orient="bottom", direction="horizontal"),
        ),  # five entries: taller than the bar
        order=alt.Order("rank:Q"),
        tooltip=["part", alt.Tooltip("ms:Q", format=",.1f")],
    )
    .properties(height=40, title="All sessions"),
)
table(st, rows.drop(columns=["end_ns"]))
