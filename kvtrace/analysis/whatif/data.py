"""What the what-if replay reads from a trace store: recorded d2p decisions, D's retentions, and
the rates they are priced at.  The named queries are in :mod:`.sql`; the replay itself is
:mod:`.replay`.

:func:`load` returns a :class:`Recorded`: numpy arrays, one element per recorded d2p decision
(P's "pull D's blocks or recompute") and per retention (blocks D held after a turn), sorted for
the replay (by :mod:`.arrays`, which turns the query results into those arrays), plus the
recorded setting and the calibration.  Times: ``*_ns`` are epoch ns of the trace (wall); ``*_s``
are model seconds (wall x the simulator's ``kvtrace.sim.time_scale``, 1 on vLLM); ``ttft_ms`` /
``xfer_ms`` are wall ms, converted by :data:`Recorded.time_scale`.

Where each number comes from:

- decision inputs (prompt, local hit, reusable tokens D offered, outcome, pulled / recomputed
  tokens, threshold, expiry time left): ``kvtrace.kv.decision`` spans, direction d2p;
- the gap to the previous turn, what D held and the offer: the ``turn_gaps`` pairing
  (``kvtrace.kv.retention`` spans, the proxy's ``kvtrace.proxy.request`` span: entry age and
  ``--conversation-ttl``);
- TTFT: the proxy's request span; transfer time: the d2p ``kvtrace.kv.transfer`` span(s);
- prefill rate per P engine and the transfer cost fit: :func:`kvtrace.analysis.reuse.break_even`
  (``kvtrace.engine.prefill`` spans and successful d2p transfers);
- D's KV pool size: the ``kvtrace.engine.kv_pool_bytes`` resource attribute.

The store is read once: :data:`kvtrace.store.views.gaps.BASE_SQL_HASHED_IDS` copies those spans,
attributes as columns, into a temporary table ``base`` of a private cursor; every query here, the
``turn_gaps`` pairing (the view's own SQL, its ``latest`` and ``q`` CTEs computed once on DuckDB into
temporary tables that both the decisions and the retentions query read) and :mod:`.reuse`'s
calibration (over temporary ``engine_requests`` / ``kv_transfers`` views of ``base`` with the
store views' columns; the prefill rates computed once) run on it.  The queries return rows in
no particular order (numpy sorts them); on DuckDB the calibration, retentions and pools queries
run in a thread while numpy takes the decisions.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow.compute as pc

from kvtrace import semconv as sc
from kvtrace.analysis import reuse
from kvtrace.analysis.common import rows, table
from kvtrace.analysis.whatif.arrays import FATE_READ as FATE_READ
from kvtrace.analysis.whatif.arrays import FATE_RELEASED as FATE_RELEASED
from kvtrace.analysis.whatif.arrays import FATE_UNCONSUMED as FATE_UNCONSUMED
from kvtrace.analysis.whatif.arrays import _decisions, _retention_arrays, _retentions
from kvtrace.analysis.whatif.sql import (
    BANDWIDTH_SQL,
    CALIBRATION_VIEWS,
    DECISIONS_SQL,
    PAIRING_TABLES,
    POOLS_SQL,
    REQUEST_COLUMNS,
    RETENTIONS_SQL,
    RUN_SQL,
)
from kvtrace.store.reader import query
from kvtrace.store.views import gaps as gv

DEFAULT_OFFER_MARGIN_S = 30.0  # the proxy's default: --conversation-ttl 450 s for decoder_kv_blocks_ttl 480 s


RATES_TABLE = "whatif_prefill_rates"


class WhatIfError(ValueError):
    """The traces cannot be replayed (one line)."""


@dataclass
class Calibration:
    """Rates the replay prices tokens at, all from the traces (wall ms)."""

    prefill_tokens_per_ms: dict  # P engine id -> tokens computed per ms (None: pooled)
    prefill_requests: dict  # P engine id -> prefill spans the rate came from
    xfer_overhead_ms: dict  # P engine id -> fitted fixed cost of one d2p transfer
    xfer_ms_per_token: dict
    transfers: dict  # P engine id -> successful d2p transfers the fit came from
    break_even_tokens: float | None  # pooled
    bytes_per_ms: float | None  # observed d2p bandwidth (bytes / ms of transfer span)
    samples: dict = field(default_factory=dict)  # what else the replay used: span -> count

    def rate(self, engine: str) -> float | None:
        return self.prefill_tokens_per_ms.get(engine) or self.prefill_tokens_per_ms.get(None)

    def xfer(self, engine: str) -> tuple[float, float]:
        """(overhead ms, ms per token) for ``engine``, else pooled, else (0, 0) when nothing was pulled."""
        key = engine if engine in self.xfer_ms_per_token else None
        return float(self.xfer_overhead_ms.get(key) or 0.0), float(self.xfer_ms_per_token.get(key) or 0.0)


@dataclass
class Recorded:
    """The recorded decisions (``d_*``, sorted by start) and retentions (``r_*``, sorted by D engine
    and start), the recorded setting and the calibration."""

    # decisions
    d_engine: np.ndarray  # index into p_engines
    d_start_ns: np.ndarray
    d_prompt: np.ndarray
    d_local: np.ndarray
    d_remote: np.ndarray  # tokens D offered (recorded), else what D held for the session
    d_has_entry: np.ndarray  # the proxy had the session's previous blocks (offered or not)
    d_offered: np.ndarray  # recorded: P got D's blocks
    d_age_s: np.ndarray  # age of the proxy's entry (model s), NaN unknown
    d_remaining_s: np.ndarray  # expiry time left P saw (model s), NaN unknown
    d_gap_s: np.ndarray  # decode end -> decision (model s), NaN unknown
    d_code: np.ndarray  # recorded outcome code (kvrules), -1 unknown
    d_pulled: np.ndarray
    d_recomputed: np.ndarray
    d_fail_policy: np.ndarray  # kv_load_failure_policy = fail: an expired / failed load fails the request
    d_xfer_ms: np.ndarray  # recorded d2p transfer span time (wall ms), 0 none
    d_ttft_ms: np.ndarray  # recorded TTFT at the proxy (wall ms), NaN unknown
    d_rate: np.ndarray  # prefill tokens per wall ms of the decision's P engine, NaN unknown
    d_xfer_a: np.ndarray  # fitted transfer overhead (wall ms) of that engine
    d_xfer_b: np.ndarray  # fitted transfer ms per token of that engine
    d_ttl_s: np.ndarray  # decoder_kv_blocks_ttl of the D holding the session's previous blocks (s)
    d_enforce: np.ndarray  # P ran verify=enforce: it loads at most d_verified tokens (kvrules.enforced_outcome)
    d_verified: np.ndarray  # prompt tokens D's digest proved (recorded); under enforce, no digest = 0
    # retentions
    r_engine: np.ndarray  # index into d_engines
    r_start_ns: np.ndarray
    r_end_ns: np.ndarray
    r_bytes: np.ndarray
    r_next: np.ndarray  # index of the session's next decision, -1 none
    r_fate: np.ndarray  # FATE_* as recorded
    r_ttl_s: np.ndarray  # decoder_kv_blocks_ttl of the holding D (s)
    # the run
    p_engines: list
    d_engines: list
    pool_bytes: dict  # D engine id -> KV pool bytes (known ones)
    ttl_s: float  # decoder_kv_blocks_ttl in force (the largest, when the Ds ran different ones)
    ttls: list  # every decoder_kv_blocks_ttl the Ds recorded (several: :attr:`mixed`)
    threshold: int  # kv_recompute_threshold in force
    offer_ttl_s: float  # the proxy's --conversation-ttl, model s
    offer_margin_s: float  # ttl_s - offer_ttl_s
    offer_margin_known: bool
    time_scale: float
    window_end_ns: int
    calibration: Calibration
    r_by_engine: list = field(default_factory=list)  # per D engine: slice into r_* arrays

    @property
    def mixed(self) -> bool:
        """The decode workers ran different TTLs: the recorded setting is each D's own TTL, a
        replay with ``ttl_s=None`` (see :func:`kvtrace.analysis.whatif.replay.replay`)."""
        return len(self.ttls) > 1

    @property
    def decisions(self) -> int:
        return len(self.d_start_ns)

    @property
    def retentions(self) -> int:
        return len(self.r_start_ns)


def _single(values, what: str, default=None):
    vals = sorted({v for v in values or () if v is not None and not (isinstance(v, float) and math.isnan(v))})
    if not vals:
        return default
    if len(vals) > 1:
        raise WhatIfError(
            f"the traces mix several {what} ({', '.join(f'{v:g}' for v in vals)}); replay one run "
            "at a time (kvtrace whatif --traces DIR of one run)"
        )
    return vals[0]


class Phases(dict):
    """(wall s, CPU s of the process) per phase of :func:`load`, for benchmarks."""

    def __init__(self) -> None:
        super().__init__()
        self._t = (time.perf_counter(), time.process_time())

    def lap(self, name: str) -> None:
        t = (time.perf_counter(), time.process_time())
        self[name] = (t[0] - self._t[0], t[1] - self._t[1])
        self._t = t


def load(con, phases: Phases | None = None) -> Recorded:
    """Read a store for :func:`kvtrace.analysis.whatif.replay.replay` (one pass over its spans).  Raises
    :class:`WhatIfError` when there is nothing to replay or the store mixes runs with different
    settings.  ``phases``: filled with the time each step took."""
    lap = phases.lap if phases is not None else (lambda name: None)
    cur = con.cursor()
    try:
        query(cur, f"CREATE TEMP TABLE base AS {gv.BASE_SQL_HASHED_IDS}")
        lap("base: the spans' attributes as columns")
        cur.execute(f"CREATE TEMP TABLE {PAIRING_TABLES['latest']} AS WITH {gv.TURN_GAPS_CTES} SELECT * FROM latest")
        cur.execute(f"CREATE TEMP TABLE {PAIRING_TABLES['q']} AS {gv.requests_sql(REQUEST_COLUMNS)}")
        for sql in CALIBRATION_VIEWS:
            cur.execute(sql)
        lap("pairing: retentions and decisions, request spans")
        return _load(cur, lap)
    finally:
        cur.close()


def _load(cur, lap) -> Recorded:
    dec = table(cur, DECISIONS_SQL)
    lap("decisions query")
    if dec.num_rows == 0:
        raise WhatIfError("no d2p decisions (kvtrace.kv.decision spans on P) in these traces: nothing to replay")

    def queries():
        return rows(cur, RUN_SQL)[0], calibrate(cur), table(cur, RETENTIONS_SQL), rows(cur, POOLS_SQL)

    def next_decisions(ret):  # each retention's next decision: its row in ``dec`` (-1: none)
        found = pc.index_in(ret.column("next_span_id"), value_set=dec.column("span_id").combine_chunks())
        return pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)

    # DuckDB runs the cursor's other queries while numpy takes the decisions (ClickHouse: in turn),
    # then the next decisions are looked up while numpy takes the retentions
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(queries) if not getattr(cur, "is_clickhouse", False) else None
        order, rec = _decisions(dec)
        lap("decisions -> numpy (recorded setting, calibration, retentions query meanwhile)")
        run, calib, ret, pool_rows = pending.result() if pending is not None else queries()
        lap("recorded setting, calibration, retentions query (the rest)")
        nxt = pool.submit(next_decisions, ret)
        ret = _retention_arrays(ret)
        ret["next"] = nxt.result()
    if run["scale_min"] != run["scale_max"]:
        raise WhatIfError("the traces mix simulator time scales; replay one run at a time")
    scale = float(run["scale_max"] or 1.0)
    ttls = sorted({float(v) for v in run["ttls"] or () if v is not None and not math.isnan(v)})
    if not ttls:
        raise WhatIfError("no kvtrace.kv.retention spans: D did not retain blocks (bidirectional_kv_xfer off?)")
    ttl = ttls[-1]
    threshold = int(_single(run["thresholds"], "kv_recompute_threshold values", 64))
    proxy_ttl = _single(run["proxy_ttls"], "proxy --conversation-ttl values", None)
    margin_known = proxy_ttl is not None
    offer_ttl = proxy_ttl * scale if margin_known else ttl - DEFAULT_OFFER_MARGIN_S
    _priced(rec, calib)
    _retentions(rec, ret, order, ttl)
    lap("retentions -> numpy")
    p_engines, d_engines = rec.pop("p_engines"), rec.pop("d_engines")
    pools = {r["engine_id"]: r["pool_bytes"] for r in pool_rows if r["pool_bytes"]}
    out = Recorded(
        **rec,
        p_engines=p_engines,
        d_engines=d_engines,
        pool_bytes=pools,
        ttl_s=float(ttl),
        ttls=ttls,
        threshold=threshold,
        offer_ttl_s=float(offer_ttl),
        offer_margin_s=float(ttl - offer_ttl),
        offer_margin_known=margin_known,
        time_scale=scale,
        window_end_ns=int(run["window_end_ns"]),
        calibration=calib,
    )
    bounds = np.searchsorted(out.r_engine, np.arange(len(d_engines) + 1))
    out.r_by_engine = [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    calib.samples.update(
        {
            sc.SPAN_KV_DECISION: out.decisions,
            sc.SPAN_KV_RETENTION: out.retentions,
            sc.SPAN_PROXY_REQUEST: int(np.count_nonzero(~np.isnan(out.d_ttft_ms))),
        }
    )
    lap("pools, the rest")
    return out


def _priced(rec: dict, calib: Calibration) -> None:
    """Each decision's P engine's prefill rate and transfer cost fit."""
    p_engines, d_engine = rec["p_engines"], rec["d_engine"]
    rates = np.array([calib.rate(e) or np.nan for e in p_engines], dtype=float)
    fits = np.array([calib.xfer(e) for e in p_engines], dtype=float).reshape(-1, 2)
    rec.update(d_rate=rates[d_engine], d_xfer_a=fits[d_engine, 0], d_xfer_b=fits[d_engine, 1])


def calibrate(con) -> Calibration:
    """Prefill rate and transfer cost per P engine (and pooled), from :func:`reuse.break_even`
    (on the store's views, or on :data:`CALIBRATION_VIEWS` during :func:`load`)."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {RATES_TABLE} AS {reuse.PREFILL_RATE_SQL}")  # computed once
    rates = rows(con, f"SELECT * FROM {RATES_TABLE} ORDER BY engine_id NULLS FIRST")
    fits = reuse.break_even(con, RATES_TABLE)
    bw = rows(con, BANDWIDTH_SQL)[0]
    pooled = [f for f in fits if f["engine_id"] is None]

    def clean(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v

    return Calibration(
        prefill_tokens_per_ms={r["engine_id"]: clean(r["tokens_per_ms"]) for r in rates},
        prefill_requests={r["engine_id"]: r["requests"] for r in rates},
        xfer_overhead_ms={f["engine_id"]: clean(f["overhead_ms"]) for f in fits},
        xfer_ms_per_token={f["engine_id"]: clean(f["xfer_ms_per_token"]) for f in fits},
        transfers={f["engine_id"]: f["transfers"] for f in fits},
        break_even_tokens=clean(pooled[0]["break_even_tokens"]) if pooled else None,
        bytes_per_ms=(float(bw["b"]) / bw["ms"]) if bw["n"] and bw["ms"] else None,
    )
