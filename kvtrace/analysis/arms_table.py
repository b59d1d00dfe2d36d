"""The published configuration beside a production one: four arms of one workload, one table.

The vendor benchmark of bidirectional KV transfer ran P with prefix caching off, so every later turn
either pulls from D or recomputes everything; a production P keeps its prefix cache and only the
part D generated since (and whatever P evicted) is left to pull.  ``kvtrace bench --arms`` runs
one workload (same scenario, seed and sessions) in four arms — P prefix cache {off, on} x
bidirectional transfer {off, on} — one run (trace directory) each; ``kvtrace report`` on the
directory above them shows the same table.

A run's arm is read from its prefill worker's resource attributes (``kvtrace.sim.preset``,
``kvtrace.engine.prefix_caching``, ``kvtrace.kv.bidirectional``); times are in simulated time (the
run's wall times x ``kvtrace.sim.time_scale``).  Per preset, per arm: mean TTFT per turn index,
for turns >= 1 and for all turns; mean completed-task latency (turn windows); KV D held for next
turns (retention spans clipped at the end of the workload's last turn: GiB·s and the peak held at
once).  Two gains, each with the
bootstrap 95 % interval and verdict of :mod:`kvtrace.analysis.compare` (the rule every comparison
uses): **published** = P cache off, bidirectional off / on; **incremental** = P cache on, the same.
A gain is a speedup (the inverse of compare's on/off ratio): above 1 bidirectional is faster.
Several runs of one arm (``--repeat``) are its repeats: their values are pooled, their spread is
compare's run-to-run noise, D memory is their mean (GiB·s) and maximum (peak).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from kvtrace import semconv as sc
from kvtrace.analysis import compare
from kvtrace.analysis.common import one, rows
from kvtrace.store.sql import literal
from kvtrace.store.units import GIB

ARMS = ((False, False), (False, True), (True, False), (True, True))  # (P prefix cache, bidirectional)

IDENTITY_SQL = f"""
SELECT ResourceAttributes[{literal(sc.SIM_PRESET)}] AS preset,
       ResourceAttributes[{literal(sc.ENGINE_PREFIX_CACHING)}] AS prefix_caching,
       ResourceAttributes[{literal(sc.KV_BIDIRECTIONAL)}] AS bidirectional,
       ResourceAttributes[{literal(sc.SIM_TIME_SCALE)}] AS time_scale, count(*) AS spans
FROM spans WHERE engine_role = {literal(sc.ROLE_PREFILL)}
GROUP BY ALL ORDER BY spans DESC
"""


# KV D held while the workload ran: retention spans clipped at the end of the last turn (blocks
# still held then would stay until read or expired, which the workload no longer measures)
HELD_SQL = """
WITH w AS (SELECT COALESCE((SELECT max(end_ns) FROM turns), (SELECT max(end_ns) FROM requests)) AS t_end),
r AS (SELECT k.start_ns, least(k.end_ns, w.t_end) AS end_ns, k.bytes FROM kv_retention k, w WHERE k.start_ns < w.t_end),
ev AS (SELECT start_ns AS t, bytes AS d FROM r UNION ALL SELECT end_ns, -bytes FROM r),
pts AS (SELECT t, sum(d) AS d FROM ev GROUP BY t),
s AS (SELECT sum(d) OVER (ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS held FROM pts)
SELECT (SELECT sum(bytes * ((end_ns - start_ns) / 1e9)) FROM r) AS byte_seconds, (SELECT max(held) FROM s) AS peak_bytes
"""

# the published benchmark's two other measures, per request: P's prefill (its engine prefill span:
# queue, KV load and compute) and the reverse (d2p) KV transfers that completed
PHASES_SQL = f"""
SELECT (SELECT avg(duration_ms) FROM engine_requests
        WHERE engine_role = {literal(sc.ROLE_PREFILL)} AND phase = {literal(sc.ROLE_PREFILL)}) AS prefill_ms,
       (SELECT avg(duration_ms) FROM kv_transfers
        WHERE direction = {literal(sc.DIRECTION_D2P)} AND status = {literal(sc.TRANSFER_OK)}) AS d2p_ms
"""


def arm_label(prefix_caching: bool, bidirectional: bool) -> str:
    return f"P cache {'on' if prefix_caching else 'off'}, bidir {'on' if bidirectional else 'off'}"


@dataclass
class Arm:
    """One run: its configuration and its values (simulated ms) and D memory."""

    directory: str
    preset: str
    prefix_caching: bool
    bidirectional: bool
    time_scale: float
    values: list = field(default_factory=list)  # compare.Value tuples
    gib_s: float = 0.0
    peak_gib: float = 0.0
    repeats: int = 1
    prefill_ms: float | None = None  # mean P prefill span (simulated ms)
    d2p_ms: float | None = None  # mean completed d2p transfer (simulated ms; None: none)

    @property
    def key(self) -> tuple[bool, bool]:
        return self.prefix_caching, self.bidirectional

    @property
    def label(self) -> str:
        return arm_label(self.prefix_caching, self.bidirectional)


def identify(con) -> dict | None:
    """The run's preset, P prefix caching, bidirectional and time scale (None: not a simulator
    run that records them)."""
    found = rows(con, IDENTITY_SQL)
    if not found or any(found[0][k] is None for k in ("preset", "prefix_caching", "bidirectional")):
        return None
    r = found[0]
    return {
        "preset": r["preset"],
        "prefix_caching": r["prefix_caching"] == "true",
        "bidirectional": r["bidirectional"] == "true",
        "time_scale": float(r["time_scale"] or 1.0),
    }


def load(con, directory: str, repeat: int = 0) -> Arm | None:
    """The run in ``con`` as an :class:`Arm` (its values marked as repeat ``repeat``; None when it
    is not one)."""
    ident = identify(con)
    if ident is None:
        return None
    arm = Arm(directory, **ident)
    scale = arm.time_scale
    arm.values = [(m, t, repeat, v * scale) for m, t, _, v in compare.store_values(con) if v is not None]
    held = one(con, HELD_SQL)
    arm.gib_s = (held.get("byte_seconds") or 0.0) * scale / GIB
    arm.peak_gib = (held.get("peak_bytes") or 0) / GIB
    phases = one(con, PHASES_SQL)
    arm.prefill_ms = None if phases.get("prefill_ms") is None else phases["prefill_ms"] * scale
    arm.d2p_ms = None if phases.get("d2p_ms") is None else phases["d2p_ms"] * scale
    return arm


@dataclass
class PresetTable:
    preset: str
    arms: dict  # (prefix caching, bidirectional) -> Arm
    published: list  # compare rows: cache off, bidir off (A) vs on (B)
    incremental: list  # compare rows: cache on, bidir off (A) vs on (B)


def merge(runs: list[Arm]) -> Arm:
    """Repeats of one arm as one: values pooled (each keeps its repeat), GiB·s averaged, peak maxed."""
    first = runs[0]
    if len({(a.preset, a.key, a.time_scale) for a in runs}) != 1:
        raise ValueError(f"runs {', '.join(a.directory for a in runs)} are not repeats of one arm")
    return Arm(
        os.path.dirname(first.directory) if len(runs) > 1 else first.directory,
        first.preset,
        first.prefix_caching,
        first.bidirectional,
        first.time_scale,
        [v for a in runs for v in a.values],
        math.fsum(a.gib_s for a in runs) / len(runs),
        max(a.peak_gib for a in runs),
        len(runs),
        _mean_of([a.prefill_ms for a in runs]),
        _mean_of([a.d2p_ms for a in runs]),
    )


def _mean_of(xs: list) -> float | None:
    got = [x for x in xs if x is not None]
    return math.fsum(got) / len(got) if got else None


def tables(arms: list[Arm], *, seed: int = 0) -> list[PresetTable]:
    """One table per preset that has all four arms (ValueError naming what is missing otherwise);
    several runs of one arm are its repeats (:func:`merge`)."""
    grouped: dict[str, dict] = {}
    for arm in arms:
        grouped.setdefault(arm.preset, {}).setdefault(arm.key, []).append(arm)
    by_preset = {p: {k: merge(runs) for k, runs in g.items()} for p, g in grouped.items()}
    out = []
    for preset in sorted(by_preset):
        got = by_preset[preset]
        missing = [arm_label(*k) for k in ARMS if k not in got]
        if missing:
            raise ValueError(f"{preset}: no run of {', '.join(missing)}")
        cmp = lambda cache, got=got: compare.compare(  # noqa: E731 - got bound: a loop variable
            got[(cache, False)].values, got[(cache, True)].values, seed=seed
        )
        out.append(PresetTable(preset, got, cmp(False), cmp(True)))
    return out


def _mean(arm: Arm, metric: str, turn) -> float | None:
    xs = [
        v
        for m, t, _, v in arm.values
        if m == metric and (turn == compare.ALL or (turn == compare.LATER and t is not None and t >= 1) or t == turn)
    ]
    return math.fsum(xs) / len(xs) if xs else None


def _gain(rows_: list[dict], metric: str, turn) -> str:
    r = compare.row(rows_, metric, turn)
    if r is None or not r["ratio"]:
        return "–"
    lo = 1 / r["ci_high"] if r["ci_high"] else math.nan
    hi = 1 / r["ci_low"] if r["ci_low"] else math.nan
    return f"x{1 / r['ratio']:.2f} [{lo:.2f}-{hi:.2f}] {r['verdict']}"


def table_rows(t: PresetTable) -> tuple[list[str], list[list[str]]]:
    """(columns, rows): the metrics by arm, then the published and incremental gains."""
    arms = [t.arms[k] for k in ARMS]
    cols = ["metric", *(a.label for a in arms), "published gain (P cache off)", "incremental gain (P cache on)"]
    turns = sorted({tn for a in arms for m, tn, _, _ in a.values if m == "ttft_ms" and tn is not None})
    ms = lambda v: "–" if v is None else f"{v:,.1f}"  # noqa: E731
    body = []
    for metric, label, groups in (
        ("ttft_ms", "TTFT", [*turns, compare.LATER, compare.ALL]),
        ("turn_latency_ms", "task latency", [compare.LATER, compare.ALL]),
    ):
        for g in groups:
            name = (
                f"{label} turn {g} (ms)"
                if isinstance(g, int)
                else f"{label} {'turns >= 1' if g == compare.LATER else 'all turns'} (ms)"
            )
            body.append(
                [
                    name,
                    *(ms(_mean(a, metric, g)) for a in arms),
                    _gain(t.published, metric, g),
                    _gain(t.incremental, metric, g),
                ]
            )
    body.append(["D KV held (GiB·s)", *(f"{a.gib_s:,.2f}" for a in arms), "–", "–"])
    body.append(["D KV peak (GiB)", *(f"{a.peak_gib:,.3f}" for a in arms), "–", "–"])
    return cols, body


def markdown(ts: list[PresetTable]) -> str:
    """Every preset's table (Markdown), with the note on how gains are read."""
    from kvtrace.analysis.report.text import md_table

    parts = []
    for t in ts:
        first = next(iter(t.arms.values()))
        runs = f"{first.repeats} run{'s' if first.repeats > 1 else ''} per arm"
        parts.append(
            f"### {t.preset} (simulated time; time scale {first.time_scale:g}; {runs}; "
            f"{first.directory})\n\n" + md_table(*table_rows(t))
        )
    parts.append(
        "Gain = mean(bidir off) / mean(bidir on) with its bootstrap 95% interval "
        "(kvtrace.analysis.compare): above 1 bidirectional transfer is faster. Published: P prefix cache "
        "off, as the vendor benchmark ran; incremental: P prefix cache on, as production runs. D KV held: "
        "retention spans (blocks kept for the next turn), GiB x simulated seconds, and the peak held at once "
        "(on all of a fleet's D together)."
    )
    return "\n\n".join(parts) + "\n"


def from_directory(root: str | os.PathLike) -> list[Arm]:
    """Every run under ``root`` (its subdirectories holding partitions) loaded as an arm; ValueError
    when a run is not a simulator run recording its arm, or ``root`` holds fewer than two runs."""
    from kvtrace.store import connect
    from kvtrace.store.files import list_files
    from kvtrace.store.runs import runs

    root = os.fspath(root)
    found = runs(list_files(root), root)
    if any(SWEEP_DIR.match(run.split(os.sep, 1)[0]) for run in found):
        raise ValueError(f"{root} holds a sweep (one directory per point): read it with sweep_from_directory")
    if len(found) < 2 or "." in found:
        raise ValueError(f"{root} does not hold the runs of kvtrace bench --arms (one subdirectory per arm)")
    out, seen = [], {}
    for run in found:
        directory = os.path.join(root, run)
        arm_dir = os.path.dirname(directory)
        seen[arm_dir] = seen.get(arm_dir, -1) + 1  # runs under one arm directory are its repeats
        arm = load(connect(directory), directory, seen[arm_dir])
        if arm is None:
            raise ValueError(
                f"{directory} is not a simulator run that records its arm "
                f"({sc.ENGINE_PREFIX_CACHING}, {sc.KV_BIDIRECTIONAL})"
            )
        out.append(arm)
    return out


# -- sweeps: one four-arm run per point of the first turn's prefix ---------------------------------
SWEEP_DIR = re.compile(r"^prefix-(\d+)$")


def point_dir(prefix: int) -> str:
    return f"prefix-{prefix}"


@dataclass
class SweepPoint:
    prefix: int
    tables: list  # PresetTable per preset run at this point


def sweep_from_directory(root: str | os.PathLike, *, seed: int = 0) -> list[SweepPoint]:
    """Every complete point (``prefix-N`` subdirectory holding all four arms of a preset) under
    ``root``, by prefix; ValueError when there is none."""
    root = os.fspath(root)
    points = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        m = SWEEP_DIR.match(name)
        if m:
            points.append(SweepPoint(int(m.group(1)), tables(from_directory(os.path.join(root, name)), seed=seed)))
    if not points:
        raise ValueError(f"{root} holds no sweep point (prefix-N directories of kvtrace bench --arms --sweep)")
    return sorted(points, key=lambda p: p.prefix)


def sweep_rows(points: list[SweepPoint], preset: str) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of one preset: per prefix, mean TTFT of the four arms, P's mean prefill and
    d2p transfer, and the gains (TTFT, all turns; the published one also over turns >= 1)."""
    off, on = arm_label(False, False), arm_label(False, True)
    cols = [
        "prefix",
        f"TTFT {off}",
        f"TTFT {on}",
        f"TTFT {arm_label(True, False)}",
        f"TTFT {arm_label(True, True)}",
        "P prefill, 4 arms",
        "d2p transfer (P cache off / on)",
        "published gain (P cache off)",
        "published gain, turns >= 1",
        "incremental gain (P cache on)",
    ]
    ms = lambda v: "–" if v is None else f"{v:,.0f}"  # noqa: E731
    body = []
    for point in points:
        t = next((t for t in point.tables if t.preset == preset), None)
        if t is None:
            continue
        arms = [t.arms[k] for k in ARMS]
        body.append(
            [
                f"{point.prefix:,}",
                *(ms(_mean(a, "ttft_ms", compare.ALL)) for a in arms),
                " / ".join(ms(a.prefill_ms) for a in arms),
                f"{ms(t.arms[(False, True)].d2p_ms)} / {ms(t.arms[(True, True)].d2p_ms)}",
                _gain(t.published, "ttft_ms", compare.ALL),
                _gain(t.published, "ttft_ms", compare.LATER),
                _gain(t.incremental, "ttft_ms", compare.ALL),
            ]
        )
    return cols, body


def sweep_markdown(points: list[SweepPoint]) -> str:
    """One table per preset over the sweep's points (simulated ms), with the note on reading it."""
    from kvtrace.analysis.report.text import md_table

    presets = sorted({t.preset for p in points for t in p.tables})
    parts = []
    for preset in presets:
        first = next(t for p in points for t in p.tables if t.preset == preset)
        arm = next(iter(first.arms.values()))
        parts.append(
            f"### {preset}: mean TTFT per prefix (simulated ms; time scale {arm.time_scale:g}; "
            f"{arm.repeats} run{'s' if arm.repeats > 1 else ''} per arm)\n\n" + md_table(*sweep_rows(points, preset))
        )
    parts.append(
        "TTFT: mean over all turns. P prefill: mean of P's engine prefill spans (queue, KV load, compute), "
        "arms in the TTFT columns' order; d2p transfer: mean completed reverse transfer with bidirectional "
        "on. Gain = mean TTFT bidir off / on with its bootstrap 95% interval (kvtrace.analysis.compare): "
        "published = P prefix cache off, as the vendor benchmark ran; incremental = P prefix cache on."
    )
    return "\n\n".join(parts) + "\n"
