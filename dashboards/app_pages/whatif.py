"""What-if: the recorded traffic replayed under other retention TTLs and recompute thresholds."""

import altair as alt
import pandas as pd
import streamlit as st

from kvtrace.analysis.whatif import summary as whatif_summary
from kvtrace.dashboards.common import chart, df, fmt_ms, no_data, q, sidebar, table

directory, filters, facets = sidebar()
st.title("What-if: retention TTL and recompute threshold")
st.caption(
    "Every recorded d2p decision decided again with vLLM's rules under another `decoder_kv_blocks_ttl` / "
    "`kv_recompute_threshold`, from its recorded prompt, local-hit and reusable tokens and the recorded gap "
    "since the session's previous turn; D's retention rebuilt under each TTL (`kvtrace whatif`). Model "
    "seconds. The replay covers the whole run: the sidebar filters apply to the gap distribution only."
)
if no_data(facets, directory):
    st.stop()

a = q(whatif_summary.advice, directory)
if a["error"]:
    st.warning(f"Nothing to replay: {a['error']}.")
    st.stop()
rows = pd.DataFrame(whatif_summary.pareto(a["rows"]))
recorded = rows[rows["recorded"]].iloc[0]
rc = a["recommendation"]

ttls = sorted(float(v) for v in rows["ttl_s"].dropna().unique())  # NaN: each D's own recorded TTL
thresholds = sorted(int(v) for v in rows["threshold"].unique())
left, right = st.columns(2)
ttl = left.select_slider("decoder_kv_blocks_ttl (s)", options=ttls, value=rc["ttl_s"], format_func=lambda v: f"{v:g}")
threshold = right.select_slider("kv_recompute_threshold (tokens)", options=thresholds, value=rc["threshold"])
sel = rows[(rows["ttl_s"] == ttl) & (rows["threshold"] == threshold)].iloc[0]


def delta(key: str, fmt) -> str:
    return f"recorded {fmt(recorded[key])}"


c = st.columns(5)
c[0].metric(
    "Mean TTFT", fmt_ms(sel["ttft_mean_ms"]), delta("ttft_mean_ms", fmt_ms), delta_color="off", delta_arrow="off"
)
c[1].metric(
    "KV held",
    f"{sel['gib_s_held']:,.1f} GiB·s",
    delta("gib_s_held", lambda v: f"{v:,.1f} GiB·s"),
    delta_color="off",
    delta_arrow="off",
)
c[2].metric(
    "Peak on one D",
    f"{sel['peak_gib_held']:,.2f} GiB",
    delta("peak_gib_held", lambda v: f"{v:,.2f} GiB"),
    delta_color="off",
    delta_arrow="off",
)
c[3].metric(
    "Pulled",
    f"{sel['pulled']:,} of {sel['decisions']:,}",
    delta("pulled", lambda v: f"{v:,}"),
    delta_color="off",
    delta_arrow="off",
)
c[4].metric(
    "Predicted failures",
    f"{sel['failures']:,}",
    f"{sel['expired']:,} offers of expired blocks",
    delta_color="off",
    delta_arrow="off",
)

st.markdown("\n".join(a["lines"]))

points = rows.assign(
    setting=rows.apply(
        lambda r: (
            f"TTL {'each D its own' if pd.isna(r['ttl_s']) else format(r['ttl_s'], 'g') + ' s'}, "
            f"threshold {r['threshold']}"
        ),
        axis=1,
    ),
    marker=rows.apply(
        lambda r: (
            "recorded"
            if r["recorded"]
            else ("selected" if r["ttl_s"] == ttl and r["threshold"] == threshold else "other")
        ),
        axis=1,
    ),
).dropna(subset=["ttft_mean_ms"])
if not points.empty:
    base = alt.Chart(points).encode(
        x=alt.X("gib_s_held:Q", title="KV held on D (GiB·s)"),
        y=alt.Y("ttft_mean_ms:Q", title="mean TTFT (ms)", scale=alt.Scale(zero=False)),
    )
    dots = base.mark_point(filled=True).encode(
        color=alt.Color("threshold:O", title="threshold"),
        shape=alt.Shape(
            "marker:N",
            title=None,
            scale=alt.Scale(domain=["other", "selected", "recorded"], range=["circle", "diamond", "cross"]),
        ),
        size=alt.Size(
            "marker:N", legend=None, scale=alt.Scale(domain=["other", "selected", "recorded"], range=[50, 220, 260])
        ),
        tooltip=[
            "setting",
            alt.Tooltip("gib_s_held:Q", format=",.1f"),
            alt.Tooltip("ttft_mean_ms:Q", format=",.1f"),
            alt.Tooltip("peak_gib_held:Q", format=",.3f"),
            "pulled",
            "expired",
            "failures",
            "pareto",
        ],
    )
    front = base.transform_filter(alt.datum.pareto).mark_line(strokeDash=[5, 3], color="gray")
    chart(
        st,
        alt.layer(front, dots).properties(
            title="Memory held vs TTFT per setting (dashed: settings no other beats on both)", height=340
        ),
    )

st.subheader("Gaps between turns")
g = df(q(whatif_summary.gaps, directory, filters))
if g.empty:
    st.caption("No session came back to D's blocks in these traces (or the filters exclude them).")
else:
    ttl_lines = pd.DataFrame({"gap_s": [a["recorded"]["ttl_s"], ttl], "label": ["TTL in force", "TTL selected"]})
    bars = (
        alt.Chart(g)
        .mark_bar(opacity=0.8)
        .encode(
            x=alt.X("gap_s:Q", bin=alt.Bin(maxbins=40), title="decode end on D → next d2p decision (s)"),
            y=alt.Y("count():Q", title="turns", stack="zero"),
            color=alt.Color("scenario:N", title="scenario / agent"),
            tooltip=["scenario", "count()"],
        )
    )
    rules = (
        alt.Chart(ttl_lines)
        .mark_rule(strokeDash=[6, 3])
        .encode(x="gap_s:Q", color=alt.value("black"), tooltip=["label", "gap_s"])
    )
    chart(st, alt.layer(bars, rules).properties(title="Turn gaps by scenario, with the TTL in force", height=260))

st.subheader("Every setting")
table(st, rows.drop(columns=["offer_margin_s"]))
