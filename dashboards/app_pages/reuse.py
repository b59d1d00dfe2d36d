"""KV reuse: offers of other tokens' KV first, then decision mix, tokens by source, transfer time against
recompute time, continuity breaks."""

import altair as alt
import pandas as pd
import streamlit as st

from kvtrace import semconv as sc
from kvtrace.analysis import continuity, instances, palette, reuse
from kvtrace.dashboards.common import chart, df, fmt_bytes, fmt_ms, no_data, q, ranked, sidebar, source_colours, table

directory, filters, facets = sidebar()
st.title("KV reuse")
st.caption(
    f"P's `{sc.DIRECTION_D2P}` decisions: the next turn's prefill pulling D's retained blocks "
    "instead of recomputing them."
)
if no_data(facets, directory):
    st.stop()

# first: offers whose KV belongs to other tokens than the prompt (P's check of D's digest)
checked = df(q(reuse.verification, directory, filters))
if not checked.empty:
    st.subheader("Offered KV checked against the prompt")
    if (checked["verified"] == sc.VERIFIED_MISMATCH).any():
        st.caption(
            "d2p decisions whose offer failed P's check of D's digest (`verified` = mismatch): the prompt "
            "differs from the tokens D's blocks hold from `first_mismatch_token` on (a digest chunk's start); "
            "`wrong_tokens` would have been loaded from other KV (under `verify: record` vLLM loads them). "
            "`cause` where the kvtrace proxy forwarded the request: "
            f"{', '.join(reuse.CAUSES)}; – where no kvtrace proxy saw it."
        )
        wrong = df(q(reuse.mismatches, directory, filters, limit=500))
        wrong["cause"] = wrong["cause"].fillna("–")
        table(st, wrong)
    table(st, checked)

s = q(reuse.summary, directory, filters)
c = st.columns(5)
c[0].metric(
    "Pull rate",
    "–" if s["pull_rate"] is None else f"{s['pull_rate']:.0%}",
    f"{s['pulled_requests']:,} of {s['decisions']:,}",
    delta_color="off",
    delta_arrow="off",
)
c[1].metric(
    "Pulled tokens",
    f"{s['pulled_tokens']:,}",
    f"of {s['reusable_tokens']:,} reusable",
    delta_color="off",
    delta_arrow="off",
)
c[2].metric("Moved", fmt_bytes(s["bytes"]))
c[3].metric("Recompute avoided (est.)", fmt_ms(s["saved_ms"]))
c[4].metric("Break-even", "–" if s["break_even_tokens"] is None else f"{s['break_even_tokens']:,.0f} tokens")
st.caption(
    f"Recompute avoided = {fmt_ms(s['recompute_est_ms'])} estimated to recompute the pulled tokens − "
    f"{fmt_ms(s['transfer_ms'])} measured to transfer them (wall time). Break-even: the pulled-token count "
    "above which pulling is cheaper than recomputing."
)

left, right = st.columns(2)
mix = df(q(reuse.decision_mix, directory, filters))
if not mix.empty:
    chart(
        left,
        alt.Chart(mix)
        .mark_bar()
        .encode(
            x=alt.X("decisions:Q"),
            y=alt.Y("direction:N", title=None),
            color=alt.Color("outcome:N"),
            tooltip=["direction", "outcome", "decisions", "pulled_tokens", "recomputed_tokens"],
        )
        .properties(title="Decision mix", height=alt.Step(28)),
    )
offers = df(q(reuse.offer_mix, directory, filters))
if not offers.empty:
    chart(
        right,
        alt.Chart(offers)
        .mark_bar()
        .encode(
            x=alt.X("requests:Q"),
            y=alt.Y("offer_reason:N", sort="-x", title=None),
            tooltip=["offer_reason", "requests"],
        )
        .properties(title="Proxy: offered D's blocks to P?", height=alt.Step(28)),
    )

tokens = df(q(reuse.tokens_by_source, directory, filters))
if not tokens.empty:
    long = tokens.melt(
        id_vars=["turn"],
        value_vars=["local_hit_tokens", "pulled_tokens", "computed_tokens"],
        var_name="source",
        value_name="tokens",
    )
    long["source"] = long["source"].map({col: label for col, (label, _) in palette.SOURCES.items()})
    sources = palette.labels(palette.SOURCES)
    chart(
        st,
        alt.Chart(ranked(long, "source", sources))
        .mark_bar()
        .encode(
            x=alt.X("turn:O", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("tokens:Q", stack="zero"),
            color=alt.Color("source:N", sort=sources, scale=source_colours()),
            order=alt.Order("rank:Q"),
            tooltip=["turn", "source", alt.Tooltip("tokens:Q", format=",")],
        )
        .properties(title="P's prompt tokens by source, per turn index", height=260),
    )

reqs = df(q(reuse.requests, directory, filters, limit=5000))
pulled = reqs[reqs["outcome"] == sc.OUTCOME_PULLED] if not reqs.empty else reqs
if not pulled.empty:
    points = pd.concat(
        [
            pulled.assign(kind="transfer (measured)", ms=pulled["transfer_ms"]),
            pulled.assign(kind="recompute (estimated)", ms=pulled["recompute_est_ms"]),
        ]
    )[["request_id", "session_id", "turn", "pulled_tokens", "kind", "ms"]].dropna()
    layers = [
        alt.Chart(points)
        .mark_circle(size=50)
        .encode(
            x=alt.X("pulled_tokens:Q", title="pulled tokens"),
            y=alt.Y("ms:Q", title="ms"),
            color=alt.Color("kind:N", title=None),
            tooltip=["request_id", "session_id", "turn", "pulled_tokens", alt.Tooltip("ms:Q", format=",.2f")],
        )
    ]
    if s["break_even_tokens"] is not None:
        rule = pd.DataFrame({"tokens": [s["break_even_tokens"]], "label": ["break-even"]})
        layers.append(alt.Chart(rule).mark_rule(strokeDash=[6, 3]).encode(x="tokens:Q", tooltip=["label", "tokens"]))
    chart(st, alt.layer(*layers).properties(title="Transfer vs recompute per pulled request (wall ms)", height=320))
    st.caption(
        "Recompute estimate = pulled tokens ÷ the P worker's observed prefill rate. The dashed line is "
        "the break-even token count: above it pulling is cheaper than recomputing."
    )

st.subheader("Per request")
table(st, reqs.head(1000))
st.subheader("Transfer cost and break-even per P engine")
per_engine = pd.DataFrame(q(reuse.break_even, directory))
if not per_engine.empty:  # the pooled row (all P engines together) has engine_id NULL
    per_engine["engine_id"] = per_engine["engine_id"].fillna("(all engines)")
table(st, per_engine)

# continuity (#13): turns whose messages no longer extend what the proxy served to the session
breaks = df(q(continuity.summary, directory, filters))
if not breaks.empty:
    st.subheader("Continuity breaks")
    st.caption(
        "A turn breaks continuity when its messages no longer extend the session's last served turn "
        "(reasoning dropped, history rewritten or cut, system prompt re-rendered): D's blocks cannot be "
        "used and P recomputes. Share of checked turns per agent / scenario, and what the breaks cost."
    )
    breaks["group"] = breaks["agent_name"].fillna("–") + " / " + breaks["scenario"].fillna("–")
    chart(
        st,
        alt.Chart(breaks)
        .mark_bar()
        .encode(
            x=alt.X(
                "broken_share:Q",
                title="share of turns that broke continuity",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),
            y=alt.Y("group:N", title=None, sort="-x"),
            tooltip=[
                "agent_name",
                "scenario",
                "turns_checked",
                "diverged",
                alt.Tooltip("broken_share:Q", format=".1%"),
                alt.Tooltip("reusable_tokens_lost:Q", format=","),
                alt.Tooltip("recomputed_tokens:Q", format=","),
                alt.Tooltip("prefill_ms:Q", format=",.1f"),
            ],
        )
        .properties(title="Turns that broke continuity", height=max(60, 28 * len(breaks))),
    )  # one bar: not collapsed
    table(st, breaks.drop(columns=["group"]))
    worst = df(q(continuity.breaks, directory, filters, limit=200))
    if not worst.empty:
        table(st, worst)

# a fleet (several P or D): where the proxy's routing sent the turns, and what each instance reused
fleet = q(instances.per_instance, directory, filters)
if instances.is_fleet(fleet.to_pylist()):
    st.subheader("Reuse per instance")
    st.caption(
        "The proxy's routing over the fleet (`requests`: each turn's P and D and why: "
        f"{', '.join(sc.ROUTE_REASONS)}), each instance's own decisions (P's pulls from D, D's from P; "
        "local hits in its own prefix cache) and the proxy's legs to it (`proxy_legs`): sent, failed, "
        "unreachable (the worker never got the request; the leg went on to another worker) and the ms "
        "the failed ones took."
    )
    table(st, df(fleet))
