"""Run comparison: a baseline trace directory against the current one, per turn index, with the
verdict rule of :mod:`kvtrace.analysis.compare` (the one ``kvtrace bench``, ``kvtrace demo`` and
``kvtrace report`` use)."""

import altair as alt
import pandas as pd
import streamlit as st

from kvtrace.analysis import compare, reuse, sessions
from kvtrace.analysis.filters import Filters
from kvtrace.dashboards.common import PART_LABELS, chart, checked_dir, config, fmt_ms, q, sidebar, table

directory, filters, facets = sidebar()
st.title("Run comparison")
baseline = st.text_input(
    "Baseline trace directory",
    value=config()["compare"] or "",
    help="e.g. DIR/baseline from `kvtrace demo`; the sidebar's directory is the candidate",
)
if not baseline:
    st.info("Enter a baseline directory (or start with `kvtrace dashboard --compare DIR2`).")
    st.stop()
baseline = checked_dir(baseline, "Baseline trace directory")

# the session filter is run-specific; time/service/substrate apply to both runs
shared = Filters(start_ns=filters.start_ns, end_ns=filters.end_ns, service=filters.service, substrate=filters.substrate)
base_values, cand_values = q(compare.store_values, baseline, shared), q(compare.store_values, directory, shared)
if not base_values or not cand_values:
    st.info(
        f"Nothing to compare: baseline `{baseline}` has {len(base_values)} values, "
        f"candidate `{directory}` has {len(cand_values)}."
    )
    st.stop()
rows = pd.DataFrame(compare.compare(base_values, cand_values)).rename(
    columns={"n_a": "n_baseline", "n_b": "n_candidate", "a_mean": "baseline_mean_ms", "b_mean": "candidate_mean_ms"}
)
rows["turn"] = rows["turn"].astype(str)

st.subheader("Per turn index (ratio = candidate / baseline of the means; below 1 = candidate faster)")
st.caption(
    "Bars: ratio; whiskers: bootstrap 95% interval. Verdict faster/slower when the interval excludes 1, "
    "within noise otherwise: the rule of `kvtrace demo`, `kvtrace bench` and `kvtrace report` "
    "(kvtrace.analysis.compare). Means in wall ms."
)
plotted = rows[rows["metric"].isin(["ttft_ms", "turn_latency_ms"]) & rows["ratio"].notna()]
if not plotted.empty:
    order = list(dict.fromkeys(plotted["turn"]))
    x = alt.X("turn:N", sort=order, axis=alt.Axis(labelAngle=0))
    bars = (
        alt.Chart(plotted)
        .mark_bar()
        .encode(
            x=x,
            xOffset="metric:N",
            y=alt.Y("ratio:Q", title="ratio (whiskers: 95% CI)"),
            color="metric:N",
            opacity=alt.condition(alt.datum.verdict == compare.WITHIN_NOISE, alt.value(0.35), alt.value(1.0)),
            tooltip=["turn", "metric", alt.Tooltip("ratio:Q", format=".3f"), "verdict"],
        )
    )
    whiskers = alt.Chart(plotted).mark_rule().encode(x=x, xOffset="metric:N", y="ci_low:Q", y2="ci_high:Q")
    one = alt.Chart(pd.DataFrame({"ratio": [1.0]})).mark_rule(strokeDash=[4, 4]).encode(y="ratio:Q")
    chart(st, (bars + whiskers + one).properties(height=280))
table(st, rows.drop(columns=["significant"]))

st.subheader("Totals")
b_tot, c_tot = q(sessions.totals, baseline, shared), q(sessions.totals, directory, shared)
b_reuse, c_reuse = q(reuse.summary, baseline, shared), q(reuse.summary, directory, shared)
summary = pd.DataFrame(
    [
        {"metric": "sessions", "baseline": f"{b_tot['sessions']:,}", "candidate": f"{c_tot['sessions']:,}"},
        *[
            {"metric": label, "baseline": fmt_ms(b_tot[k]), "candidate": fmt_ms(c_tot[k])}
            for k, label in PART_LABELS.items()
        ],
        {
            "metric": "pulled tokens",
            "baseline": f"{b_reuse['pulled_tokens']:,}",
            "candidate": f"{c_reuse['pulled_tokens']:,}",
        },
        {
            "metric": "recomputed tokens",
            "baseline": f"{b_reuse['recomputed_tokens']:,}",
            "candidate": f"{c_reuse['recomputed_tokens']:,}",
        },
    ]
).astype(str)
table(st, summary)
