"""The four arms of ``kvtrace bench --arms`` from one recorded run, no servers: P prefix cache
{off, on} x bidirectional transfer {off, on} as counterfactual rows of the operator's own traffic.

Every recorded P request (its d2p ``kvtrace.kv.decision`` span, with the proxy's request span for
its TTFT) is decided again in each arm with vLLM's rules (:mod:`kvtrace.kvrules`):

- **P's local hit**: as recorded where P ran the arm's prefix caching; 0 with the cache off; with
  the cache on where P ran without it, the full blocks of the session's previous prompt (P's
  cache holds every prompt it computed or pulled; eviction is not modelled) and, on a session's
  first turn, what D's prefix cache found for it (its p2d decision: prefixes shared across
  sessions) if P had finished a longer prompt of another session by then; at most the prompt's
  full blocks but its last token;
- **D's offer**: as recorded where the run was bidirectional (its tokens and whether the proxy
  offered them); where it was not, D would hold the session's previous prompt and output
  (``prompt + output - 1`` tokens), offered to every later turn; none with bidirectional off;
- **the decision**: ``count = min(offer, prompt) - local hit``, pulled when it reaches
  ``kv_recompute_threshold`` (:func:`kvrules.d2p_outcome`).

TTFT per request = the recorded TTFT - the recorded P cost + the arm's, each priced by the
calibration of the same run (:mod:`kvtrace.analysis.calibrate`): the prefill of the tokens P
computes at its fitted rates (fixed + per token + per causal pair) and the transfer of the pulled
blocks (fixed + per byte).  The arm the traces ran is that TTFT exactly (its ``recorded`` row).
KV memory: the recorded retention spans (GiB x model s, and the peak on one D) where the run was
bidirectional; else, for the bidirectional arms, each turn's KV held from its end to the
session's next request (the estimate the recording allows).  Requests without a recorded TTFT
are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvtrace import kvrules
from kvtrace import semconv as sc
from kvtrace.analysis.arms_table import ARMS, arm_label
from kvtrace.analysis.calibrate import Calibration, calibrate, causal_pairs
from kvtrace.analysis.common import rows, table
from kvtrace.store.sql import float_attr as _f
from kvtrace.store.sql import int_attr as _i
from kvtrace.store.sql import literal as _q
from kvtrace.store.sql import str_attr as _s
from kvtrace.store.sql import time_scale
from kvtrace.store.units import GIB

_RES = "ResourceAttributes[{}]"
REQUESTS_SQL = f"""
WITH q AS (
    SELECT trace_id, request_id, arg_min({_f(sc.REQUEST_TTFT_MS)}, start_ns) AS ttft_ms,
           arg_min({_i(sc.GEN_AI_USAGE_OUTPUT_TOKENS)}, start_ns) AS output_tokens, min(start_ns) AS req_start_ns,
           max(end_ns) AS req_end_ns
    FROM spans WHERE name = $request AND request_id IS NOT NULL GROUP BY trace_id, request_id
),
dd AS (
    SELECT trace_id, request_id, arg_min({_i(sc.KV_LOCAL_HIT_TOKENS)}, start_ns) AS d_local_hit_tokens
    FROM spans WHERE name = $decision AND {_s(sc.KV_DIRECTION)} = $p2d AND request_id IS NOT NULL
    GROUP BY trace_id, request_id
),
pe AS (
    SELECT trace_id, request_id, max(end_ns) AS p_end_ns FROM spans WHERE name = $prefill_span
    GROUP BY trace_id, request_id
)
SELECT d.session_id, d.start_ns, {_i(sc.KV_PROMPT_TOKENS)} AS prompt_tokens,
       coalesce({_i(sc.KV_LOCAL_HIT_TOKENS)}, 0) AS local_hit_tokens,
       coalesce({_i(sc.KV_REMOTE_TOKENS)}, 0) AS remote_tokens,
       coalesce({_i(sc.KV_PULLED_TOKENS)}, 0) AS pulled_tokens, {_s(sc.KV_OUTCOME)} AS outcome,
       coalesce({_i(sc.KV_THRESHOLD)}, $default_threshold) AS threshold,
       {time_scale()} AS time_scale,
       {_RES.format(_q(sc.ENGINE_PREFIX_CACHING))} AS prefix_caching,
       {_RES.format(_q(sc.KV_BIDIRECTIONAL))} AS bidirectional,
       q.ttft_ms, coalesce(q.output_tokens, 0) AS output_tokens, q.req_start_ns, q.req_end_ns,
       coalesce(dd.d_local_hit_tokens, 0) AS d_local_hit_tokens, pe.p_end_ns
FROM spans d LEFT JOIN q ON q.trace_id = d.trace_id AND q.request_id = d.request_id
LEFT JOIN dd ON dd.trace_id = d.trace_id AND dd.request_id = d.request_id
LEFT JOIN pe ON pe.trace_id = d.trace_id AND pe.request_id = d.request_id
WHERE d.name = $decision AND {_s(sc.KV_DIRECTION)} = $d2p AND d.engine_role = $prefill
ORDER BY d.session_id NULLS LAST, d.start_ns, d.request_id, d.span_id
"""

RETENTION_SQL = f"""
SELECT start_ns, end_ns, {_i(sc.KV_RETENTION_BYTES)} AS bytes,
       Duration / 1e9 * {time_scale()} AS held_model_s
FROM spans WHERE name = $retention
"""

COLUMNS = (
    "arm",
    "prefix_caching",
    "bidirectional",
    "recorded",
    "requests",
    "pulled",
    "pulled_tokens",
    "computed_tokens",
    "max_computed_tokens",
    "ttft_mean_ms",
    "ttft_turns_ge1_mean_ms",
    "kv_gib_s",
    "kv_peak_gib",
)


class ArmsError(ValueError):
    """The traces cannot give the four arms (one line)."""


@dataclass
class Arms:
    rows: list  # one dict per arm (COLUMNS), ARMS order
    recorded: tuple  # (prefix caching, bidirectional) the traces ran
    calibration: Calibration
    requests: int

    def row(self, prefix_caching: bool, bidirectional: bool) -> dict:
        key = (prefix_caching, bidirectional)
        return next(r for r in self.rows if (r["prefix_caching"], r["bidirectional"]) == key)

    def summary(self) -> dict:
        """What reverse transfer saved on this deployment (its P cache as recorded), what it would
        show with P's cache off (the published setup), and the KV it held for that."""
        cache = self.recorded[0]
        out = {}
        for key, pc in (("this_deployment", cache), ("published_setup", False)):
            off, on = self.row(pc, False), self.row(pc, True)
            a, b = off["ttft_mean_ms"], on["ttft_mean_ms"]
            out[key] = {
                "prefix_caching": pc,
                "ttft_off_ms": a,
                "ttft_on_ms": b,
                "saved_ms": None if a is None or b is None else a - b,
                "gain": a / b if a and b else None,
                "kv_gib_s": on["kv_gib_s"],
                "kv_peak_gib": on["kv_peak_gib"],
            }
        return out

    def to_dict(self) -> dict:
        return {
            "recorded": {"prefix_caching": self.recorded[0], "bidirectional": self.recorded[1]},
            "requests": self.requests,
            "arms": self.rows,
            "summary": self.summary(),
            "calibration": self.calibration.to_dict(),
        }

    def lines(self) -> list[str]:
        s = self.summary()
        here, pub = s["this_deployment"], s["published_setup"]
        cache = "on" if here["prefix_caching"] else "off"
        out = []
        lo, hi = self.calibration.prefill.range or (0, 0)
        most = max(r["max_computed_tokens"] for r in self.rows)
        if most > 1.5 * hi:
            out.append(
                f"Note: an arm computes up to {most:,} new tokens in one prefill; the recorded prefills the "
                f"costs were fitted to computed {lo:,}-{hi:,}: its TTFT is an extrapolation."
            )
        return out + [
            f"Reverse transfer on this traffic (P prefix cache {cache}, as recorded): mean TTFT "
            f"{_ms(here['ttft_off_ms'])} without it, {_ms(here['ttft_on_ms'])} with it: saved {_ms(here['saved_ms'])} "
            f"per request ({_gain(here['gain'])}), holding {here['kv_gib_s']:,.2f} GiB·s of KV on D "
            f"(peak {here['kv_peak_gib']:,.3f} GiB).",
            f"In the published setup (P prefix cache off) it would show {_gain(pub['gain'])}: "
            f"{_ms(pub['ttft_off_ms'])} -> {_ms(pub['ttft_on_ms'])}.",
        ]


def _ms(v) -> str:
    return "–" if v is None else f"{v:,.1f} ms"


def _gain(v) -> str:
    return "–" if v is None else f"x{v:.2f}"


def _flag(values, default: bool) -> bool:
    found = {str(v).lower() for v in values if v is not None}
    if len(found) > 1:
        raise ArmsError("the traces mix P workers with different settings; give the arms one run at a time")
    return default if not found else found.pop() == "true"


def load_requests(con) -> dict:
    params = {
        "decision": sc.SPAN_KV_DECISION,
        "d2p": sc.DIRECTION_D2P,
        "p2d": sc.DIRECTION_P2D,
        "prefill": sc.ROLE_PREFILL,
        "prefill_span": sc.SPAN_ENGINE_PREFILL,
        "request": sc.SPAN_PROXY_REQUEST,
        "default_threshold": 64,
    }
    tbl = table(con, REQUESTS_SQL, params)
    if tbl.num_rows == 0:
        raise ArmsError("no d2p decisions (kvtrace.kv.decision spans on P) in these traces: no requests to replay")
    out = {name: tbl.column(name).to_pylist() for name in tbl.column_names}
    return out


def _prev(session: list, values: np.ndarray) -> np.ndarray:
    """Each request's session's previous request's value (-1: the session's first, or no session)."""
    prev = np.full(len(values), -1, dtype=values.dtype)
    for i in range(1, len(values)):
        if session[i] is not None and session[i] == session[i - 1]:
            prev[i] = values[i - 1]
    return prev


def _shared(q: dict, n: np.ndarray, d_local: np.ndarray) -> np.ndarray:
    """A first turn's prefix P's cache could hold from other sessions: what D's prefix cache found
    for it (its p2d decision), at most the longest prompt of another session P had finished by then."""
    start = np.array(q["start_ns"], dtype=np.int64)
    end = np.array([np.iinfo(np.int64).max if v is None else v for v in q["p_end_ns"]], dtype=np.int64)
    session = q["session_id"]
    out = np.zeros(len(n), dtype=np.int64)
    for i in np.flatnonzero(d_local > 0):
        done = (end <= start[i]) & np.array([s != session[i] for s in session])
        out[i] = min(int(d_local[i]), int(n[done].max())) if done.any() else 0
    return out


def counterfactual(con) -> Arms:
    """The four arms of the store's recorded run (:class:`ArmsError` / CalibrationError when it
    cannot give them)."""
    cal = calibrate(con)
    q = load_requests(con)
    pcache = _flag(q["prefix_caching"], True)
    bidir = _flag(q["bidirectional"], True)
    keep = np.array([t is not None and not math.isnan(t) for t in q["ttft_ms"]])
    n = np.array(q["prompt_tokens"], dtype=np.int64)
    local = np.array(q["local_hit_tokens"], dtype=np.int64)
    remote = np.array(q["remote_tokens"], dtype=np.int64)
    pulled = np.array(q["pulled_tokens"], dtype=np.int64)
    d_local = np.array(q["d_local_hit_tokens"], dtype=np.int64)
    out_tok = np.array(q["output_tokens"], dtype=np.int64)
    threshold = np.array(q["threshold"], dtype=np.int64)
    scale = np.array(q["time_scale"], dtype=float)
    ttft = np.array([np.nan if t is None else t for t in q["ttft_ms"]], dtype=float) * scale
    session = q["session_id"]
    prev_prompt = _prev(session, n)
    prev_out = _prev(session, out_tok)
    bs = cal.block_size
    recorded_pulled = np.array([o == sc.OUTCOME_PULLED for o in q["outcome"]])
    cost_rec = _cost(cal, n - local - np.where(recorded_pulled, pulled, 0), n, np.where(recorded_pulled, pulled, 0))
    rows_out = []
    held = _memory(con, cal, q, bidir, prev_prompt, prev_out)  # what D holds with reverse transfer on
    for arm_cache, arm_bidir in ARMS:
        if arm_cache == pcache:
            a_local = local
        elif not arm_cache:
            a_local = np.zeros_like(local)
        else:  # the session's previous prompt; a first turn: a prefix shared with other sessions
            own = np.where(prev_prompt > 0, prev_prompt, _shared(q, n, d_local))
            a_local = np.minimum(own // bs, (n - 1) // bs) * bs
        if not arm_bidir:
            offer, offered = np.zeros_like(remote), np.zeros(len(n), dtype=bool)
        elif bidir:
            offer, offered = remote, remote > 0
        else:
            offer = np.where(prev_prompt > 0, prev_prompt + prev_out - 1, 0)
            offered = prev_prompt > 0
        count = kvrules.pull_count(offer, n, a_local)
        code = kvrules.d2p_outcome(offered, count, a_local, threshold)
        a_pulled = np.where(code == kvrules.PULLED, count, 0)
        computed = np.maximum(n - a_local - a_pulled, 0)
        same = (arm_cache, arm_bidir) == (pcache, bidir)
        a_ttft = ttft if same else ttft - cost_rec + _cost(cal, computed, n, a_pulled)
        later = keep & (prev_prompt >= 0)
        rows_out.append(
            {
                "arm": arm_label(arm_cache, arm_bidir),
                "prefix_caching": arm_cache,
                "bidirectional": arm_bidir,
                "recorded": same,
                "requests": int(keep.sum()),
                "pulled": int((code[keep] == kvrules.PULLED).sum()),
                "pulled_tokens": int(a_pulled[keep].sum()),
                "computed_tokens": int(computed[keep].sum()),
                "max_computed_tokens": int(computed[keep].max()) if keep.any() else 0,
                "ttft_mean_ms": _mean(a_ttft[keep]),
                "ttft_turns_ge1_mean_ms": _mean(a_ttft[later]),
                **(held if arm_bidir else {"kv_gib_s": 0.0, "kv_peak_gib": 0.0}),
            }
        )
    return Arms(rows_out, (pcache, bidir), cal, int(keep.sum()))


def _mean(values: np.ndarray) -> float | None:
    # exactly rounded: the same numbers give the same mean whatever order a query returned them in
    return math.fsum(values.tolist()) / len(values) if len(values) else None


def _cost(cal: Calibration, computed: np.ndarray, ctx: np.ndarray, pulled: np.ndarray) -> np.ndarray:
    """P's fitted cost (model ms) of computing ``computed`` of ``ctx`` tokens after pulling ``pulled``."""
    c = cal.cost_numbers()
    new = np.maximum(computed, 0).astype(float)
    pre = np.where(
        new > 0,
        c["prefill_fixed_s"] + c["prefill_per_token_s"] * new + c["prefill_per_pair_s"] * causal_pairs(new, ctx),
        0.0,
    )
    nbytes = -(-pulled // cal.block_size) * cal.block_size * cal.bytes_per_token
    xfer = np.where(pulled > 0, c["transfer_fixed_s"] + c["transfer_per_byte_s"] * nbytes, 0.0)
    return (pre + xfer) * 1e3


def _memory(con, cal, q, recorded_bidir: bool, prev_prompt, prev_out) -> dict:
    if recorded_bidir:
        ret = rows(con, RETENTION_SQL, {"retention": sc.SPAN_KV_RETENTION})
        gib_s = math.fsum((r["bytes"] or 0) * (r["held_model_s"] or 0.0) for r in ret) / GIB
        return {"kv_gib_s": gib_s, "kv_peak_gib": _peak([(r["start_ns"], r["end_ns"], r["bytes"] or 0) for r in ret])}
    # not recorded: each turn's KV (prompt + output - 1 tokens) from its end to the session's next request
    holds = []
    ends = q["req_end_ns"]
    starts = q["req_start_ns"]
    scale = q["time_scale"]
    gib_s = 0.0
    for i, prev in enumerate(prev_prompt):
        if prev <= 0 or ends[i - 1] is None or starts[i] is None:
            continue
        nbytes = -(-int(prev + prev_out[i] - 1) // cal.block_size) * cal.block_size * cal.bytes_per_token
        held_s = max(starts[i] - ends[i - 1], 0) / 1e9 * scale[i]
        gib_s += nbytes * held_s / GIB
        holds.append((ends[i - 1], starts[i], nbytes))
    return {"kv_gib_s": gib_s, "kv_peak_gib": _peak(holds)}


def _peak(holds: list) -> float:
    """The most bytes held at once (GiB) over (start, end, bytes) intervals (all D engines together)."""
    events = sorted([(s, b) for s, _, b in holds if s is not None] + [(e, -b) for _, e, b in holds if e is not None])
    level = peak = 0
    for _, delta in events:  # sorted by (time, delta): a release before an acquisition at the same time
        level += delta
        peak = max(peak, level)
    return peak / GIB
