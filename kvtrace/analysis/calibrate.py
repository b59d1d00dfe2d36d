"""Fit the simulator's costs to a recorded trace directory (real vLLM through kvtrace's connector,
or a simulator run): ``kvtrace sim --calibrate-from DIR`` and ``kvtrace bench --arms --calibrate-from DIR``.

Three least-squares fits over the recorded spans, every time in model seconds (wall x the
``kvtrace.sim.time_scale`` resource attribute of a simulator's spans, wall on vLLM):

- **transfer** (``kvtrace.kv.transfer`` spans that ended ``ok``, both directions):
  ``t = fixed + per_byte * bytes``, ``t`` the transport time the worker measured
  (``kvtrace.kv.transfer.xfer_ms``; the span's duration where it recorded none): the rest of the
  span is the worker's own bookkeeping, which the simulator has its own of;
- **decode step** (``kvtrace.engine.decode`` spans on D): a span holds its KV loads, one
  per-request cost and ``output_tokens`` steps, each step reading the KV of every request decoding
  on that worker at the time (continuous batching), so
  ``span - loads = request + steps * fixed + per_ctx_token * sum of the batch's context over the steps``,
  the other requests' context counted by their overlap with this one (when every span generated
  the same number of tokens the per-request cost cannot be told from the steps': it is held at 0
  and the steps carry it);
- **prefill** (``kvtrace.engine.prefill`` spans on P that computed tokens): a prefill waits for the
  one before it on the same worker (prefills run one at a time, FIFO), so its own time runs from
  the later of its start (plus its KV loads) and the end of the worker's previous span; minus P's
  one decode step (the fitted step at its context),
  ``t = fixed + per_new_token * new + per_pair * causal pairs`` where ``new`` = prompt - cached
  tokens and the pairs are causal attention's (query, key) pairs over the new tokens
  (:func:`causal_pairs`).

Each worker's first prefill and decode span is left out (its warm-up: one-time costs of a fresh
process).  A coefficient the data would make negative is held at 0 and the rest refitted, and so is
one the samples do not support: among the non-negative fits over subsets of the terms, the one with
the smallest AICc (the residual plus a price per term; :func:`nonneg_lstsq`), so samples from a
narrow range (alike prompts) are not read as a large fixed cost that would price a short prefill as
a long one.  For the same reason the prefill's fixed cost is held at 0 when the samples' new-token
counts lie within a factor :data:`FIXED_SPAN` (2) of each other (a note says so).  Samples more
than :data:`OUTLIER_MADS` robust deviations off that fit (a span delayed by a busy host) are left
out of a second fit, and counted.  Each fit reports the spans and sample counts behind it and its
residual (root mean square, model ms).  KV bytes per token come from the transfers (bytes per
block / tokens per block).  Too few samples for a fit (fewer than its terms
+ 1) raise :class:`CalibrationError` naming the spans that are missing.

The result is plain numbers (:meth:`Calibration.cost_numbers`); :mod:`kvtrace.sim.fitted` runs the
simulator at them (the analysis layer does not import the simulator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvtrace import semconv as sc
from kvtrace.analysis.common import table
from kvtrace.analysis.fitting import CalibrationError, Fit, least_squares
from kvtrace.store.sql import float_attr as _f
from kvtrace.store.sql import int_attr as _i
from kvtrace.store.sql import str_attr as _s
from kvtrace.store.sql import time_scale

_SCALE = time_scale()

# every KV load (any status: its time is in the engine span) per request and engine, wall ms
TRANSFERS_SQL = f"""
SELECT engine_id, request_id, {_s(sc.KV_DIRECTION)} AS direction, {_s(sc.KV_TRANSFER_STATUS)} AS status,
       {_i(sc.KV_TRANSFER_BYTES)} AS bytes, {_i(sc.KV_TRANSFER_TOKENS)} AS tokens,
       {_i(sc.KV_TRANSFER_BLOCKS)} AS blocks, coalesce({_f(sc.KV_TRANSFER_XFER_MS)}, duration_ms) AS duration_ms,
       {_SCALE} AS time_scale
FROM spans WHERE name = $transfer
ORDER BY start_ns, engine_id, request_id, span_id
"""

ENGINE_SQL = f"""
WITH x AS (
    SELECT engine_id, request_id, sum(duration_ms) AS xfer_ms
    FROM spans WHERE name = $transfer GROUP BY engine_id, request_id
)
SELECT e.engine_id, e.name = $prefill AS prefill, e.start_ns, e.end_ns, e.duration_ms,
       {_i(sc.KV_PROMPT_TOKENS)} AS prompt_tokens, coalesce({_i(sc.REQUEST_CACHED_TOKENS)}, 0) AS cached_tokens,
       coalesce({_i(sc.GEN_AI_USAGE_OUTPUT_TOKENS)}, 0) AS output_tokens, coalesce(x.xfer_ms, 0.0) AS xfer_ms,
       {_SCALE} AS time_scale, e.substrate
FROM spans e LEFT JOIN x ON x.engine_id = e.engine_id AND x.request_id = e.request_id
WHERE e.name IN ($prefill, $decode) AND e.status_code <> $error AND {_i(sc.KV_PROMPT_TOKENS)} IS NOT NULL
ORDER BY e.start_ns, e.engine_id, e.request_id, e.span_id
"""

PARAMS = {
    "transfer": sc.SPAN_KV_TRANSFER,
    "prefill": sc.SPAN_ENGINE_PREFILL,
    "decode": sc.SPAN_ENGINE_DECODE,
    "error": "STATUS_CODE_ERROR",
}


# prefill samples whose new-token counts lie within this factor of each other cannot tell a fixed
# cost from a per-token one (both fit them alike, and a fixed one prices a short prefill as a long one)
FIXED_SPAN = 2.0


def causal_pairs(new: np.ndarray, ctx: np.ndarray) -> np.ndarray:
    """(query, key) pairs of causal attention when the last ``new`` of ``ctx`` tokens attend to
    themselves and every token before them (the simulator's :func:`kvtrace.sim.costmodel.causal_pairs`
    without a window)."""
    new = np.asarray(new, dtype=float)
    ctx = np.asarray(ctx, dtype=float)
    return np.where(new > 0, (2 * ctx - new + 1) * new / 2, 0.0)


@dataclass
class Calibration:
    """The fitted costs; :meth:`cost_numbers` is what the simulator takes."""

    prefill: Fit
    transfer: Fit
    decode: Fit
    bytes_per_token: int
    block_size: int
    substrate: str
    time_scale: float
    source: str = ""
    notes: list = field(default_factory=list)

    def cost_numbers(self) -> dict:
        """Plain numbers for :class:`kvtrace.sim.fitted.FittedCostModel` (seconds, tokens, bytes)."""
        p, t, d = self.prefill.terms, self.transfer.terms, self.decode.terms
        return {
            "prefill_fixed_s": p["fixed_s"],
            "prefill_per_token_s": p["per_new_token_s"],
            "prefill_per_pair_s": p["per_pair_s"],
            "transfer_fixed_s": t["fixed_s"],
            "transfer_per_byte_s": t["per_byte_s"],
            "decode_fixed_s": d["per_step_s"],
            "decode_per_ctx_token_s": d["per_ctx_token_s"],
            "bytes_per_token": int(self.bytes_per_token),
            "block_size": int(self.block_size),
        }

    def to_dict(self) -> dict:
        fits = {
            f.name: {
                "terms": dict(f.terms),
                "spans": dict(f.spans),
                "samples": f.samples,
                "residual_ms": f.residual_ms,
                "mean_ms": f.mean_ms,
                "held_at_zero": list(f.held_at_zero),
                "outliers": f.outliers,
                "range": list(f.range),
            }
            for f in (self.prefill, self.transfer, self.decode)
        }
        return {
            "source": self.source,
            "substrate": self.substrate,
            "time_scale": self.time_scale,
            "bytes_per_token": self.bytes_per_token,
            "block_size": self.block_size,
            "fits": fits,
            "cost": self.cost_numbers(),
            "notes": list(self.notes),
        }

    def lines(self) -> list[str]:
        """The fitted numbers, one line each, with the spans and samples behind them."""
        where = self.source or "the traces"
        out = [f"calibrated from {where} ({self.substrate}; model time = wall x {self.time_scale:g})"]
        for f in (self.prefill, self.transfer, self.decode):
            spans = ", ".join(f"{n} {name}" for name, n in f.spans.items())
            terms = ", ".join(_term(k, v) for k, v in f.terms.items())
            zero = f" (held at 0: {', '.join(f.held_at_zero)})" if f.held_at_zero else ""
            zero += f" over {f.range[0]:,}-{f.range[1]:,} new tokens" if f.range else ""
            left = f" ({f.outliers} left out as outliers)" if f.outliers else ""
            out.append(
                f"  {f.name}: {terms}{zero}; {f.samples} samples{left} from {spans}; "
                f"residual {f.residual_ms:.3g} ms RMS (mean {f.mean_ms:.3g} ms)"
            )
        out.append(f"  KV: {self.bytes_per_token:,} bytes per token, block size {self.block_size}")
        out.extend(f"  note: {n}" for n in self.notes)
        return out


def _term(name: str, value: float) -> str:
    unit = name.rsplit("_", 1)[-1]
    label = name[: -len(unit) - 1]
    return f"{label} {value * 1e3:.4g} ms" if unit == "s" else f"{label} {value:.4g}"


def fit_transfer(xfer: dict) -> Fit:
    ok = (xfer["status"] == sc.TRANSFER_OK) & (xfer["bytes"] > 0)
    y = xfer["duration_ms"][ok] * xfer["time_scale"][ok] / 1e3
    x = np.column_stack([np.ones(int(ok.sum())), xfer["bytes"][ok].astype(float)])
    dirs = xfer["direction"][ok]
    spans = {f"{sc.SPAN_KV_TRANSFER} {d}": int((dirs == d).sum()) for d in sc.DIRECTIONS if (dirs == d).any()}
    return least_squares("transfer", x, y, ("fixed_s", "per_byte_s"), spans or {sc.SPAN_KV_TRANSFER: 0})


def _batch_ctx(eng: dict, rows: np.ndarray) -> np.ndarray:
    """Per decode span: the context of every other request decoding on its worker meanwhile, summed
    over this span's steps (each other request's mean context x its overlap with this span, as a
    share of this span's steps)."""
    out = np.zeros(len(rows))
    start = eng["start_ns"][rows] + (eng["xfer_ms"][rows] * 1e6).astype(np.int64)
    end, steps = eng["end_ns"][rows], eng["output_tokens"][rows].astype(float)
    mean_ctx = eng["prompt_tokens"][rows] + steps / 2
    engines = eng["engine_id"][rows]
    for engine in np.unique(engines):
        idx = np.flatnonzero(engines == engine)
        s, e = start[idx], end[idx]
        overlap = np.clip(np.minimum(e[:, None], e[None, :]) - np.maximum(s[:, None], s[None, :]), 0, None)
        np.fill_diagonal(overlap, 0)
        dur = np.maximum(e - s, 1)
        out[idx] = steps[idx] * (overlap / dur[:, None]) @ mean_ctx[idx]
    return out


def _warm(eng: dict, rows: np.ndarray) -> np.ndarray:
    """``rows`` without each worker's first span (its warm-up: one-time costs of a fresh process)."""
    first = {}
    for i in rows[np.argsort(eng["start_ns"][rows], kind="stable")]:
        first.setdefault(eng["engine_id"][i], i)
    return rows[~np.isin(rows, list(first.values()))]


def fit_decode(eng: dict) -> Fit:
    rows = _warm(eng, np.flatnonzero(~eng["prefill"] & (eng["output_tokens"] > 0)))
    steps = eng["output_tokens"][rows].astype(float)
    prompt = eng["prompt_tokens"][rows].astype(float)
    own = steps * prompt + steps * (steps - 1) / 2  # this request's context at each of its steps
    y = (eng["duration_ms"][rows] - eng["xfer_ms"][rows]) * eng["time_scale"][rows] / 1e3
    ctx = own + _batch_ctx(eng, rows)
    spans = {sc.SPAN_ENGINE_DECODE: int(len(rows))}
    if len(rows) and np.ptp(steps) == 0:  # one output length: a per-request cost cannot be told from the steps
        fit = least_squares("decode step", np.column_stack([steps, ctx]), y, ("per_step_s", "per_ctx_token_s"), spans)
        fit.terms = {"per_request_s": 0.0, **fit.terms}
        fit.held_at_zero = ("per_request_s", *fit.held_at_zero)
        return fit
    x = np.column_stack([np.ones(len(rows)), steps, ctx])
    return least_squares("decode step", x, y, ("per_request_s", "per_step_s", "per_ctx_token_s"), spans)


def _service_ms(eng: dict, rows: np.ndarray) -> np.ndarray:
    """Each prefill span's own time: from the later of its start (+ its loads) and the end of the
    spans before it on its worker, to its end (wall ms)."""
    out = np.empty(len(rows))
    engines = eng["engine_id"][rows]
    for engine in np.unique(engines):
        idx = rows[engines == engine]
        order = idx[np.argsort(eng["start_ns"][idx], kind="stable")]
        ends = eng["end_ns"][order]
        prev_end = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]])
        ready = eng["start_ns"][order] + (eng["xfer_ms"][order] * 1e6).astype(np.int64)
        busy = np.maximum(ready, prev_end)
        out[np.searchsorted(rows, order)] = np.maximum(ends - busy, 0) / 1e6
    return out


def fit_prefill(eng: dict, decode: Fit) -> Fit:
    prefill = np.flatnonzero(eng["prefill"])
    service = dict(zip(prefill.tolist(), _service_ms(eng, prefill), strict=True))  # every span queues the next
    new = eng["prompt_tokens"][prefill] - eng["cached_tokens"][prefill]
    rows = _warm(eng, prefill[new > 0])
    new = eng["prompt_tokens"][rows] - eng["cached_tokens"][rows]
    new = new.astype(float)
    ctx = eng["prompt_tokens"][rows].astype(float)
    # P generates one token (the proxy asks P for max_tokens=1): the fitted decode step at its context
    step_s = decode.value("per_step_s") + decode.value("per_ctx_token_s") * ctx
    y = np.array([service[i] for i in rows.tolist()]) * eng["time_scale"][rows] / 1e3 - step_s
    spans = {sc.SPAN_ENGINE_PREFILL: int(len(rows))}
    if len(rows) and new.max() < FIXED_SPAN * new.min():  # alike prompts: the fixed cost is held at 0
        x = np.column_stack([new, causal_pairs(new, ctx)])
        fit = least_squares("prefill", x, y, ("per_new_token_s", "per_pair_s"), spans)
        fit.terms = {"fixed_s": 0.0, **fit.terms}
        fit.held_at_zero = ("fixed_s", *fit.held_at_zero)
    else:
        x = np.column_stack([np.ones(len(rows)), new, causal_pairs(new, ctx)])
        fit = least_squares("prefill", x, y, ("fixed_s", "per_new_token_s", "per_pair_s"), spans)
    fit.range = (int(new.min()), int(new.max())) if len(rows) else ()
    return fit


def _kv_layout(xfer: dict) -> tuple[int, int]:
    """(bytes per token, block size) from the transfers: bytes / blocks is one block's bytes;
    tokens / blocks never exceeds the block size, which is a power of two."""
    ok = (xfer["blocks"] > 0) & (xfer["bytes"] > 0) & (xfer["tokens"] > 0)
    if not ok.any():
        raise CalibrationError(f"no {sc.SPAN_KV_TRANSFER} span with bytes and blocks: the KV size is unknown")
    per_block = float(np.median(xfer["bytes"][ok] / xfer["blocks"][ok]))
    fill = float((xfer["tokens"][ok] / xfer["blocks"][ok]).max())
    block = 1 << max(0, math.ceil(math.log2(fill)))
    return int(round(per_block / block)), int(block)


def _arrays(tbl) -> dict:
    out = {}
    for name in tbl.column_names:
        col = tbl.column(name)
        out[name] = np.asarray(col.to_pylist() if col.null_count else col.to_numpy(zero_copy_only=False))
    return out


def calibrate(con, source: str = "") -> Calibration:
    """Fit transfer, decode step and prefill costs (in that order: prefill subtracts P's decode
    step) from the store ``con``; :class:`CalibrationError` when a fit lacks samples."""
    xt = table(con, TRANSFERS_SQL, {"transfer": PARAMS["transfer"]})
    et = table(con, ENGINE_SQL, PARAMS)
    if et.num_rows == 0:
        raise CalibrationError(
            f"no {sc.SPAN_ENGINE_PREFILL} / {sc.SPAN_ENGINE_DECODE} spans in these traces: nothing to calibrate from "
            "(record a run with kvtrace's vLLM connector or the simulator)"
        )
    xfer, eng = _arrays(xt), _arrays(et)
    if xt.num_rows == 0:
        raise CalibrationError(f"too few samples for the transfer fit: 0 {sc.SPAN_KV_TRANSFER} spans")
    for name, fill in (("bytes", 0), ("tokens", 0), ("blocks", 0), ("duration_ms", 0.0)):
        xfer[name] = np.array([fill if v is None else v for v in xfer[name]], dtype=type(fill))
    eng["prefill"] = eng["prefill"].astype(bool)
    transfer = fit_transfer(xfer)
    decode = fit_decode(eng)
    prefill = fit_prefill(eng, decode)
    bpt, block = _kv_layout(xfer)
    subs = {v for v in eng["substrate"] if v}
    scales = sorted({float(v) for v in eng["time_scale"]})
    notes = []
    if len(scales) > 1:
        notes.append(f"the spans mix time scales {scales}: each span was read at its own")
    if prefill.range and prefill.range[1] < FIXED_SPAN * prefill.range[0]:
        notes.append(
            f"the prefills computed {prefill.range[0]:,}-{prefill.range[1]:,} new tokens (within a factor "
            f"{FIXED_SPAN:g}): a fixed cost cannot be told from the per-token one there and is held at 0"
        )
    if decode.value("per_request_s") > 0:
        notes.append(
            f"D's per-request cost outside its steps ({decode.value('per_request_s') * 1e3:.3g} ms) is not "
            "simulated (the simulator's decode has no per-request term)"
        )
    return Calibration(
        prefill=prefill,
        transfer=transfer,
        decode=decode,
        bytes_per_token=bpt,
        block_size=block,
        substrate="+".join(sorted(subs)) or "unknown",
        time_scale=scales[-1],
        source=source,
        notes=notes,
    )


def from_directory(directory) -> Calibration:
    """:func:`calibrate` over a trace directory (:class:`CalibrationError` also when it holds no spans)."""
    from kvtrace.store import connect
    from kvtrace.store.reader import StoreError

    try:
        con = connect(directory)
    except StoreError as exc:
        raise CalibrationError(str(exc)) from None
    try:
        return calibrate(con, str(directory))
    finally:
        con.close()
