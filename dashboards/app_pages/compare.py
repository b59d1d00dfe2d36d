"""Run comparison: a baseline trace directory against the current one, per turn index."""

import altair as alt
import pandas as pd
import streamlit as st
from common import PART_LABELS, chart, config, fmt_ms, q, sidebar

from kvtrace.analysis import latency, reuse, sessions
from kvtrace.analysis.filters import Filters

directory, filters, facets = sidebar()
st.title("Run comparison")
baseline = st.text_input("Baseline trace directory", value=config()["compare"] or "",
                         help="e.g. DIR/baseline from `kvtrace demo`; the sidebar's directory is the candidate")
if not baseline:
    st.info("Enter a baseline directory (or start with `kvtrace dashboard --compare DIR2`).")
    st.stop()

# the session filter is run-specific; time/service/substrate apply to both runs
shared = Filters(start_ns=filters.start_ns, end_ns=filters.end_ns, service=filters.service,
                 substrate=filters.substrate)
base_turns, cand_turns = q(latency.by_turn, baseline, shared), q(latency.by_turn, directory, shared)
if base_turns.num_rows == 0 or cand_turns.num_rows == 0:
    st.info(f"Nothing to compare: baseline `{baseline}` has {base_turns.num_rows} turn indexes, "
            f"candidate `{directory}` has {cand_turns.num_rows}.")
    st.stop()
rows = pd.DataFrame(latency.compare(base_turns, cand_turns))

st.subheader("Per turn index (ratio = candidate / baseline; below 1 = candidate faster)")
ratios = rows.melt(id_vars=["turn"], value_vars=["ttft_p50_ms_ratio", "task_p50_ms_ratio"], var_name="metric",
                   value_name="ratio").dropna()
if not ratios.empty:
    bars = alt.Chart(ratios).mark_bar().encode(
        x=alt.X("turn:O", axis=alt.Axis(labelAngle=0)), xOffset="metric:N", y=alt.Y("ratio:Q"), color="metric:N",
        tooltip=["turn", "metric", alt.Tooltip("ratio:Q", format=".3f")])
    one = alt.Chart(pd.DataFrame({"ratio": [1.0]})).mark_rule(strokeDash=[4, 4]).encode(y="ratio:Q")
    chart(st, (bars + one).properties(height=280))
st.dataframe(rows, hide_index=True, width="stretch")

st.subheader("Totals")
b_tot, c_tot = q(sessions.totals, baseline, shared), q(sessions.totals, directory, shared)
b_reuse, c_reuse = q(reuse.summary, baseline, shared), q(reuse.summary, directory, shared)
summary = pd.DataFrame(
    [
        {"metric": "sessions", "baseline": b_tot["sessions"], "candidate": c_tot["sessions"]},
        *[{"metric": label, "baseline": fmt_ms(b_tot[k]), "candidate": fmt_ms(c_tot[k])}
          for k, label in PART_LABELS.items()],
        {"metric": "pulled tokens", "baseline": b_reuse["pulled_tokens"], "candidate": c_reuse["pulled_tokens"]},
        {"metric": "recomputed tokens", "baseline": b_reuse["recomputed_tokens"],
         "candidate": c_reuse["recomputed_tokens"]},
    ]
).astype(str)
st.dataframe(summary, hide_index=True, width="stretch")
