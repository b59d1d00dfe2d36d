"""A hand-built store with known what-if answers, for the replay tests (and the ClickHouse command
tests, which replay it from chDB).

Two sessions through one P and one D (times in s from the store's start, time scale 1; the
proxy ran with --conversation-ttl 450 s, D with decoder_kv_blocks_ttl 480 s, threshold 64; P
computes 10 tokens per ms):

- A: turn 0 at 0 (nothing to reuse); D retains 1104 tokens at 1; turn 1 at 11 pulls 112 of them
  (gap 10 s); D retains 1408 at 12; turn 2 at 112 pulls 112 (gap 100 s); D retains 1600 at 113,
  released at shutdown (200).
- B: turn 0 at 5; D retains 544 at 6; turn 1 at 8 has 48 to pull: below threshold, D releases at
  8; D retains 576 at 9, released at shutdown.
"""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.testing.synth import PROXY, SIM_D, SIM_P, SpanBuilder

S = 1000.0  # ms per s
BPT = 1024  # KV bytes per token
BS = 16
POOL = 1 << 30
END_S = 200.0
RESOURCE = {sc.SUBSTRATE: sc.SUBSTRATE_SIM, sc.SIM_TIME_SCALE: 1.0}

# (session, turn, decision at s, prompt, local hit, remote offered, outcome, pulled, xfer ms, TTFT ms, entry age s,
#  retention start s, retained tokens, retention end s, retention outcome)
TURNS = [
    ("A", 0, 0.0, 1000, 0, 0, sc.OUTCOME_NO_REMOTE, 0, 0.0, 200.0, None, 1.0, 1104, 11.005, sc.RETENTION_READ),
    ("A", 1, 11.0, 1300, 992, 1104, sc.OUTCOME_PULLED, 112, 5.0, 60.0, 9.9, 12.0, 1408, 112.004, sc.RETENTION_READ),
    (
        "A",
        2,
        112.0,
        1500,
        1296,
        1408,
        sc.OUTCOME_PULLED,
        112,
        4.0,
        50.0,
        99.9,
        113.0,
        1600,
        END_S,
        sc.RETENTION_RELEASED,
    ),
    ("B", 0, 5.0, 500, 0, 0, sc.OUTCOME_NO_REMOTE, 0, 0.0, 80.0, None, 6.0, 544, 8.0, sc.RETENTION_RELEASED),
    ("B", 1, 8.0, 560, 496, 544, sc.OUTCOME_BELOW_THRESHOLD, 0, 0.0, 30.0, 1.9, 9.0, 576, END_S, sc.RETENTION_RELEASED),
]


def build(directory, time_scale: float = 1.0, b_ttl: float | None = None, unverified: int | None = None) -> None:
    """The store above; with ``b_ttl`` session B ran on a second D, ``d1``, whose
    decoder_kv_blocks_ttl is ``b_ttl``: its last blocks expire ``b_ttl`` s after they were retained.
    With ``unverified``, P ran verify=enforce and D's digest proved only that many of A turn 1's
    tokens: 1000 - 992 = 8 to pull, below the threshold: recorded ``unverified``, nothing pulled."""
    b = SpanBuilder()
    res = {**RESOURCE, sc.SIM_TIME_SCALE: time_scale}
    p_res = {**res, sc.ENGINE_ID: "p0", sc.ENGINE_ROLE: sc.ROLE_PREFILL, sc.ENGINE_KV_POOL_BYTES: POOL}
    prev_ret = {}
    for sess, turn, at, prompt, hit, remote, outcome, pulled, xfer, ttft, age, r0, tokens, r1, r_out in TURNS:
        enforced = unverified is not None and (sess, turn) == ("A", 1)
        if enforced:
            outcome, pulled, xfer = sc.OUTCOME_UNVERIFIED, 0, 0.0
        d_id, ttl = ("d1", b_ttl) if sess == "B" and b_ttl is not None else ("d0", 480.0)
        d_res = {**res, sc.ENGINE_ID: d_id, sc.ENGINE_ROLE: sc.ROLE_DECODE, sc.ENGINE_KV_POOL_BYTES: POOL}
        if r1 == END_S and ttl < END_S - r0:
            r1, r_out = r0 + ttl, sc.RETENTION_EXPIRED
        rid = f"{sess}-{turn}"
        ident = {sc.GEN_AI_REQUEST_ID: rid, sc.SESSION_ID: sess, sc.TURN_INDEX: turn}
        t = at * S - 1.0  # the proxy's request starts 1 ms before P decides
        offered = remote > 0
        req_attrs = {
            **ident,
            sc.REQUEST_TTFT_MS: ttft,
            sc.PROXY_OFFER: offered,
            sc.PROXY_OFFER_REASON: sc.OFFER_OFFERED if offered else sc.OFFER_NO_ENTRY,
            sc.PROXY_CONVERSATION_TTL_S: 450.0 / time_scale,
        }
        if age is not None:
            req_attrs[sc.PROXY_ENTRY_AGE_S] = age / time_scale
        req = b.span(sc.SPAN_PROXY_REQUEST, t, t + ttft + 100, service=PROXY, kind="SERVER", attrs=req_attrs)
        computed = prompt - hit - pulled
        p_span = b.span(
            sc.SPAN_ENGINE_PREFILL,
            t + 0.5,
            t + 0.5 + xfer + computed / 10,
            parent=req,
            service=SIM_P,
            resource=p_res,
            attrs={**ident, sc.KV_PROMPT_TOKENS: prompt, sc.REQUEST_CACHED_TOKENS: hit + pulled},
        )
        d_attrs = {
            **ident,
            sc.KV_DIRECTION: sc.DIRECTION_D2P,
            sc.KV_OUTCOME: outcome,
            sc.KV_PROMPT_TOKENS: prompt,
            sc.KV_LOCAL_HIT_TOKENS: hit,
            sc.KV_REMOTE_TOKENS: remote,
            sc.KV_PULLED_TOKENS: pulled,
            sc.KV_RECOMPUTED_TOKENS: prompt - hit - pulled,
            sc.KV_THRESHOLD: 64,
            sc.KV_LOAD_FAILURE_POLICY: "fail",
        }
        if enforced:
            d_attrs.update(
                {
                    sc.KV_VERIFIED: sc.VERIFIED_MISMATCH,
                    sc.KV_VERIFY_MODE: sc.VERIFY_ENFORCE,
                    sc.KV_VERIFIED_TOKENS: unverified,
                    sc.KV_VERIFY_MISMATCH_TOKEN: unverified,
                    sc.KV_VERIFY_WRONG_TOKENS: remote - unverified,
                }
            )
        if offered:
            gap = (at - prev_ret[sess]) * time_scale  # model s
            d_attrs.update({sc.KV_PEER_ENGINE_ID: d_id, sc.KV_EXPIRY_REMAINING_S: ttl - gap})
        dec = b.span(
            sc.SPAN_KV_DECISION, at * S, at * S + xfer, parent=p_span, service=SIM_P, resource=p_res, attrs=d_attrs
        )
        if pulled:
            b.span(
                sc.SPAN_KV_TRANSFER,
                at * S,
                at * S + xfer,
                parent=dec,
                service=SIM_P,
                resource=p_res,
                attrs={
                    **ident,
                    sc.KV_DIRECTION: sc.DIRECTION_D2P,
                    sc.KV_TRANSFER_TOKENS: pulled,
                    sc.KV_TRANSFER_BLOCKS: pulled // BS,
                    sc.KV_TRANSFER_BYTES: pulled * BPT,
                    sc.KV_TRANSFER_STATUS: sc.TRANSFER_OK,
                },
            )
        d_span = b.span(
            sc.SPAN_ENGINE_DECODE,
            t + 20,
            r0 * S,
            parent=req,
            service=SIM_D,
            resource=d_res,
            attrs={**ident, sc.KV_PROMPT_TOKENS: prompt},
        )
        b.span(
            sc.SPAN_KV_RETENTION,
            r0 * S,
            r1 * S,
            parent=d_span,
            service=SIM_D,
            resource=d_res,
            attrs={
                **ident,
                sc.KV_RETENTION_BLOCKS: tokens // BS,
                sc.KV_RETENTION_TOKENS: tokens,
                sc.KV_RETENTION_BYTES: tokens * BPT,
                sc.KV_RETENTION_TTL_S: ttl,
                sc.KV_RETENTION_OUTCOME: r_out,
            },
        )
        prev_ret[sess] = r0
    b.write(directory)
