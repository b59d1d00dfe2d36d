"""The query results of :func:`.data.load` as the replay's numpy arrays: the decisions sorted by
start, the retentions by D engine and start, and the pairing between them (each retention's next
decision, what each decision knows of the session's previous blocks, each retention's fate).

A module of its own so that :mod:`.data` keeps the reading of the store (the cursor, the queries,
the recorded setting and the calibration) and this one the Arrow -> numpy conversion it feeds.
:data:`FATE_UNCONSUMED`, :data:`FATE_READ` and :data:`FATE_RELEASED` are re-exported by :mod:`.data`.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvtrace import kvrules
from kvtrace import semconv as sc

FATE_UNCONSUMED, FATE_READ, FATE_RELEASED = 0, 1, 2


def _np(tbl: pa.Table, name: str, fill=None, dtype=None) -> np.ndarray:
    col = tbl.column(name)
    if isinstance(fill, bool) and not pa.types.is_boolean(col.type):  # ClickHouse's booleans are UInt8
        col = col.cast(pa.bool_())
    if fill is not None and col.null_count:
        col = pc.fill_null(col, fill)
    out = col.to_numpy(zero_copy_only=False)  # read-only where it shares Arrow's buffer
    return out.astype(dtype, copy=False) if dtype is not None else out


def _codes(tbl: pa.Table, name: str) -> tuple[list, np.ndarray]:
    """(sorted distinct values, index of each row's value) of a string column (NULL as '')."""
    enc = pc.dictionary_encode(pc.fill_null(tbl.column(name), "")).combine_chunks()
    names = enc.dictionary.to_pylist()
    order = sorted(range(len(names)), key=names.__getitem__)
    rank = np.empty(len(names), dtype=np.int32)
    rank[order] = np.arange(len(names), dtype=np.int32)
    return [names[i] for i in order], rank[enc.indices.to_numpy(zero_copy_only=False)]


def _lookup(tbl: pa.Table, name: str, values, missing: int = -1) -> np.ndarray:
    """Index of each row's ``name`` in ``values`` (``missing`` where absent or NULL)."""
    found = pc.index_in(tbl.column(name), value_set=pa.array(values))
    return pc.fill_null(found, missing).to_numpy(zero_copy_only=False)


def _decisions(dec: pa.Table) -> tuple[np.ndarray, dict]:
    """(the order of the rows by start, then span id; the decisions' arrays in that order)."""
    span = _np(dec, "span_id", 0, np.int64).view(np.uint64)  # a hash (ClickHouse's UInt64 comes wrapped)
    order = np.lexsort((span, _np(dec, "start_ns", 0, np.int64)))
    dec = dec.take(order)
    p_engines, d_engine = _codes(dec, "engine_id")
    code = _lookup(dec, "outcome", sc.OUTCOMES).astype(np.int8)  # sc.OUTCOMES order = kvrules codes
    return order, dict(
        p_engines=p_engines,
        d_engine=d_engine,
        d_start_ns=_np(dec, "start_ns", 0, np.int64),
        d_prompt=_np(dec, "prompt_tokens", 0, np.int64),
        d_local=_np(dec, "local_hit_tokens", 0, np.int64),
        d_remote=_np(dec, "remote_tokens", 0, np.int64),
        d_offered=_np(dec, "offered", False, bool),
        d_age_s=_np(dec, "entry_age_s", math.nan, float),
        d_remaining_s=_np(dec, "remaining_s", math.nan, float),
        d_code=code,
        d_pulled=_np(dec, "pulled_tokens", 0, np.int64),
        d_recomputed=_np(dec, "recomputed_tokens", 0, np.int64),
        d_fail_policy=_lookup(dec, "policy", ["recompute"]) != 0,
        d_xfer_ms=_np(dec, "xfer_ms", 0.0, float),
        d_ttft_ms=_np(dec, "ttft_ms", math.nan, float),
        d_has_entry=None,
        d_gap_s=None,
        d_diverged=_np(dec, "diverged", False, bool),
        d_enforce=_np(dec, "enforce", False, bool),
        d_verified=_np(dec, "verified_tokens", 0, np.int64),
    )


def _retention_arrays(ret: pa.Table) -> dict:
    """What of the retentions needs no decision: their columns, D engine codes, their order (by
    D engine, then start: the replay sweeps each engine's holds)."""
    d_engines, r_engine = _codes(ret, "engine_id")
    start = _np(ret, "start_ns", 0, np.int64)
    out = {
        name: _np(ret, name, fill, dtype)
        for name, fill, dtype in (
            ("gap_s", math.nan, float),
            ("expiry_gap_s", math.nan, float),
            ("next_tokens", 0, np.int64),
            ("ttl_s", None, float),
            ("end_ns", 0, np.int64),
            ("bytes", 0, np.int64),
        )
    }
    return dict(
        out,
        d_engines=d_engines,
        r_engine=r_engine,
        start_ns=start,
        order=np.lexsort((start, r_engine)),
        ttl_null=pc.is_null(ret.column("ttl_s")).to_numpy(zero_copy_only=False),
        outcome=_lookup(ret, "outcome", sc.RETENTION_OUTCOMES),
    )


def _retentions(rec: dict, ret: dict, d_order: np.ndarray, ttl: float) -> None:
    """Retention arrays, and what each decision knows of the session's previous blocks (``ttl``:
    the TTL of a retention that did not record one, and of a decision with no previous blocks;
    ``d_order``: the decisions' rows in their sorted order)."""
    d_row = np.empty(len(d_order), dtype=np.int64)
    d_row[d_order] = np.arange(len(d_order))
    r_next = np.where(ret["next"] >= 0, d_row[np.maximum(ret["next"], 0)], -1)
    n = len(rec["d_start_ns"])
    has = r_next >= 0
    paired = r_next[has]
    gap = np.full(n, np.nan)
    gap[paired] = ret["gap_s"][has]
    exp_gap = np.full(n, np.nan)
    exp_gap[paired] = ret["expiry_gap_s"][has]
    held = np.zeros(n, dtype=np.int64)
    held[paired] = ret["next_tokens"][has]
    r_ttl = np.where(ret["ttl_null"], ttl, ret["ttl_s"])
    d_ttl = np.full(n, ttl)
    d_ttl[paired] = r_ttl[has]
    has_entry = rec["d_offered"].copy()
    has_entry[paired] = True
    has_entry &= ~rec.pop("d_diverged")  # a turn that diverged is never offered D's blocks, at any TTL
    remote = np.where(rec["d_offered"], rec["d_remote"], held)
    # the proxy's entry age, else the gap (vLLM's, else the timestamps')
    age = rec["d_age_s"]
    age = np.where(np.isnan(age), np.where(np.isnan(exp_gap), gap, exp_gap), age)
    age = np.where(np.isnan(age) & rec["d_offered"], 0.0, age)
    outcome, order = ret["outcome"], ret["order"]
    fate = np.full(len(outcome), FATE_UNCONSUMED, dtype=np.int8)
    read = outcome == sc.RETENTION_OUTCOMES.index(sc.RETENTION_READ)
    fate[read & has] = FATE_READ
    nxt_code = np.where(has, rec["d_code"][np.where(has, r_next, 0)], -1)
    nxt_offered = np.where(has, rec["d_offered"][np.where(has, r_next, 0)], False)
    declined = np.isin(nxt_code, (kvrules.BELOW_THRESHOLD, kvrules.LOCAL_HIT, kvrules.NO_REMOTE))
    released = outcome == sc.RETENTION_OUTCOMES.index(sc.RETENTION_RELEASED)
    # P frees offered blocks it does not pull with an empty notification, which vLLM's D cannot
    # tell from a read (its retention span ends "read"); the simulator records "released"
    fate[(released | read) & has & nxt_offered & declined] = FATE_RELEASED
    rec.update(
        d_engines=ret["d_engines"],
        d_has_entry=has_entry,
        d_remote=remote,
        d_age_s=age,
        d_gap_s=gap,
        d_ttl_s=d_ttl,
        r_ttl_s=r_ttl[order],
        r_engine=ret["r_engine"][order],
        r_start_ns=ret["start_ns"][order],
        r_end_ns=ret["end_ns"][order],
        r_bytes=ret["bytes"][order],
        r_next=r_next[order],
        r_fate=fate[order],
    )
