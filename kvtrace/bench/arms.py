"""``kvtrace bench --arms``: the published configuration beside a production one.

One workload (scenario or input file, seed, sessions) runs against a fresh simulated cluster
(1 P + 1 D, or the :class:`~kvtrace.bench.fleet.Fleet` asked for) behind a fresh ``kvtrace proxy`` in each
of four arms — P prefix cache {off, on} x bidirectional transfer {off, on} — for each cost preset
(default: :data:`PRESETS`) over the EFA link: in this process on the virtual clock
(:mod:`kvtrace.bench.inproc`), or, on the wall clock, the simulator and the proxy as subprocesses
(:mod:`kvtrace.bench.served`). Each run of an arm is written to ``DIR/<preset>/<arm>/r<k>``
(simulator, proxy and bench spans together; process logs beside it as ``r<k>.log``). With
``repeat`` > 1 the arms run interleaved (arm 1..4, arm 1..4, ...), so a drift of the machine's load hits every
arm alike, and the repeats' spread is the noise the verdicts use. :mod:`kvtrace.analysis.arms_table`
reads the runs back and builds each preset's table (``kvtrace report --traces DIR`` shows the same).

Time: on the virtual clock model time costs nothing to wait (time scale 1). On the wall clock the
simulator compresses model time by the time scale (:data:`TIME_SCALES` per preset, chosen so one
simulated decode step lasts at least ~1 ms of wall time and Python's per-token work stays small
beside it); the bench's waits (tools, app work, pauses) are compressed by the same factor so the
workload keeps its simulated timing, and every reported time is simulated (wall x the time scale).
The same ``nonce`` is used in every arm, so every arm sends the same prompts and gets the same
answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from kvtrace.analysis import arms_table as arms_analysis
from kvtrace.bench import api as bench
from kvtrace.bench import lateness, served
from kvtrace.bench.fleet import SINGLE, Fleet

PRESETS = ("qwen3-32b", "glm5-fp8", "llama-3.3-70b")
CONVERSATION_TTL_S = 450.0  # the proxy's default --conversation-ttl (D's 480 s TTL less 30 s), model s
# decode step 3.0 / 2.6 / 5.3 ms simulated at TP 8: ~0.6 ms of wall time each
TIME_SCALES = {"qwen3-32b": 5.0, "glm5-fp8": 4.0, "llama-3.3-70b": 8.0}
LINK = "efa-3200"
CALIBRATED = "calibrated"  # the table of a run at fitted costs (kvtrace.sim.fitted.NAME)
NONCE = "arms"
VIRTUAL, WALL = "virtual", "wall"
MAX_WALL_REPLAY_S = 6 * 3600.0  # a wall-clock arm longer than this is refused (the virtual clock takes no wait)
CLOCKS = (VIRTUAL, WALL)  # --clock: the virtual-time loop in this process, or the served subprocesses


def arm_dir(prefix_caching: bool, bidirectional: bool) -> str:
    return f"pcache-{'on' if prefix_caching else 'off'}_bidir-{'on' if bidirectional else 'off'}"


@dataclass
class ArmsResult:
    tables: list  # kvtrace.analysis.arms_table.PresetTable
    results: dict  # (preset, prefix caching, bidirectional, repeat) -> bench.BenchResult
    traces_dir: str
    late_s: list = field(default_factory=list)  # --clock wall: the bench loop's lateness samples (s)
    fleet: Fleet = SINGLE

    def format(self) -> str:
        head = f"kvtrace bench --arms: runs in {self.traces_dir} (kvtrace report --traces {self.traces_dir})"
        if not self.fleet.default:
            head += f"\nfleet: {self.fleet.label}"
        summary = lateness.summarise(self.late_s)
        return head + "\n\n" + arms_analysis.markdown(self.tables) + (f"\n{summary.format()}\n" if summary else "")

    def to_dict(self) -> dict:
        summary = lateness.summarise(self.late_s)
        return {
            "traces_dir": self.traces_dir,
            "runs": {f"{p}/{arm_dir(c, b)}/r{k}": r.to_dict() for (p, c, b, k), r in self.results.items()},
            "wall_lateness": summary.to_dict() if summary else None,
            "fleet": dataclasses.asdict(self.fleet),
        }


async def arun_arms(
    traces_dir: str,
    *,
    presets: tuple[str, ...] = PRESETS,
    sim_time_scale: float | None = None,
    link: str = LINK,
    progress: bool = False,
    repeat: int = 1,
    calibrate_from: str | None = None,
    clock: str = "wall",
    fleet: Fleet = SINGLE,
    **config: Any,
) -> ArmsResult:
    """Run the workload (``config`` = :class:`~kvtrace.bench.api.BenchConfig` fields) in the four
    arms of each preset; ``traces_dir`` must be empty or missing.  ``sim_time_scale`` None: the
    preset's :data:`TIME_SCALES` entry.  ``calibrate_from``: a trace directory whose fitted costs
    (``kvtrace sim --calibrate-from``) every arm runs at, instead of the presets (one table, named
    ``calibrated``)."""
    presets = _checked(traces_dir, presets, sim_time_scale, repeat, calibrate_from, clock, fleet, config)
    results: dict = {}
    late: list[float] = []
    for preset in presets:
        scale = 1.0 if clock == VIRTUAL else sim_time_scale or TIME_SCALES.get(preset, 1.0)
        cfg = dict(config)
        cfg["time_scale"] = cfg.get("time_scale", 1.0) / scale  # the workload's waits, in simulated time
        cfg.setdefault("nonce", NONCE)
        cfg["repeat"] = 1  # repeats are separate runs of each arm (fresh cluster), interleaved below
        for rep in range(repeat):
            for prefix_caching, bidirectional in arms_analysis.ARMS:
                run_dir = os.path.join(traces_dir, preset, arm_dir(prefix_caching, bidirectional), f"r{rep}")
                key = (preset, prefix_caching, bidirectional, rep)
                if clock == VIRTUAL:
                    one = _one_virtual(run_dir, preset, prefix_caching, bidirectional, link, cfg, calibrate_from, fleet)
                    results[key] = await one
                    continue
                async with lateness.Lateness() as probe:
                    arm = (run_dir, preset, prefix_caching, bidirectional, scale, link, cfg, progress)
                    results[key] = await served.run_arm(*arm, CONVERSATION_TTL_S, calibrate_from, fleet)
                late += probe.late_s
    found = arms_analysis.from_directory(traces_dir)
    # the bootstrap seed kvtrace report uses
    return ArmsResult(arms_analysis.tables(found), results, traces_dir, late, fleet)


def _checked(
    traces_dir: str,
    presets: tuple[str, ...],
    sim_time_scale: float | None,
    repeat: int,
    calibrate_from: str | None,
    clock: str,
    fleet: Fleet,
    config: dict,
) -> tuple[str, ...]:
    """The presets the arms run at, once every argument is checked (BenchError, one line) before any
    cluster starts or any arm's directory is made."""
    if sim_time_scale is not None and not sim_time_scale > 0:
        raise bench.BenchError("sim_time_scale must be positive")
    if repeat < 1:
        raise bench.BenchError("repeat must be >= 1")
    if os.path.isdir(traces_dir) and os.listdir(traces_dir):
        raise bench.BenchError(f"{traces_dir} is not empty: the arms' runs need a directory of their own")
    bench._config(dict(config)).validate()
    fleet.check(config.get("clients"))
    if clock not in CLOCKS:
        raise bench.BenchError(f"unknown clock {clock!r}; choose from {', '.join(CLOCKS)}")
    if clock == VIRTUAL and sim_time_scale is not None:
        raise bench.BenchError("--sim-time-scale compresses wall time: it does not go with --clock virtual")
    if clock == WALL:
        _check_wall_span(config, min(sim_time_scale or TIME_SCALES.get(p, 1.0) for p in presets or ("",)))
    elif config.get("input") is not None:  # a bad file fails here, before the first arm's directory is made
        _workload(config)
    if calibrate_from:
        return (CALIBRATED,)
    if clock == VIRTUAL:
        _check_presets_here(presets)
    else:
        served.check_presets(presets)
    return presets


async def _one_virtual(
    run_dir: str,
    preset: str,
    prefix_caching: bool,
    bidirectional: bool,
    link: str,
    cfg: dict,
    calibrate_from: str | None,
    fleet: Fleet,
) -> bench.BenchResult:
    from kvtrace.bench import inproc

    cost_model = None
    if calibrate_from:
        from kvtrace.analysis.calibrate import CalibrationError, from_directory
        from kvtrace.sim.fitted import FittedCostModel

        try:
            cost_model = FittedCostModel(from_directory(calibrate_from).cost_numbers())
        except CalibrationError as exc:
            raise bench.BenchError(f"--calibrate-from {calibrate_from}: {exc}") from None
    os.makedirs(run_dir, exist_ok=True)
    label = arms_analysis.arm_label(prefix_caching, bidirectional)
    return await inproc.run_arm(
        run_dir, preset, prefix_caching, bidirectional, link, cfg, label, CONVERSATION_TTL_S, cost_model, fleet
    )


def _workload(config: dict) -> tuple[bench.BenchConfig, Any]:
    """``config`` read, and the workload it describes built once before any arm runs: BenchError on
    bad input (a file read before any arm's directory is made)."""
    cfg = bench._config(dict(config))
    return cfg, cfg.build(cfg.seed, "")


def _check_wall_span(config: dict, scale: float) -> None:
    """BenchError (one line) when a replayed trace would keep a wall-clock arm waiting more than
    :data:`MAX_WALL_REPLAY_S` (its sessions' pauses, compressed by the time scale): a trace with a long
    gap replays in seconds on the virtual clock instead of hanging here."""
    cfg, workload = _workload(config)
    if not workload.timed:
        return
    span_s = max((sum(t.pause_s for t in s.turns) for s in workload.sessions), default=0.0) * cfg.time_scale
    if span_s / scale > MAX_WALL_REPLAY_S:
        raise bench.BenchError(
            f"the trace spans {span_s:,.0f} s of model time, {span_s / scale / 3600:,.1f} h of wall time per arm "
            f"at time scale {scale:g}: use --clock virtual (no wall time spent waiting)"
        )


def _check_presets_here(presets: tuple[str, ...]) -> None:
    from kvtrace.sim.costmodel import PRESETS as KNOWN

    if not presets:
        raise bench.BenchError("--presets needs at least one preset")
    for preset in presets:
        if preset not in KNOWN:
            raise bench.BenchError(f"unknown preset {preset!r}; choose from {', '.join(KNOWN)}")


def _run(main, clock: str, seed: int):
    """``main`` on the virtual-time loop (seeded by the workload's seed) or on asyncio's."""
    if clock == VIRTUAL:
        from kvtrace.sim import virtual

        return virtual.run(main, seed=seed)
    return asyncio.run(main)


def run_arms(traces_dir: str, **kwargs: Any) -> ArmsResult:
    """Synchronous :func:`arun_arms` (``clock="virtual"``: on the virtual-time loop)."""
    return _run(arun_arms(traces_dir, **kwargs), kwargs.get("clock", "wall"), kwargs.get("seed", 0))


@dataclass
class SweepResult:
    points: list  # kvtrace.analysis.arms_table.SweepPoint
    runs: dict  # prefix -> ArmsResult
    traces_dir: str

    def format(self) -> str:
        head = f"kvtrace bench --arms --sweep: runs in {self.traces_dir}/prefix-N"
        summary = lateness.summarise([x for r in self.runs.values() for x in r.late_s])
        tail = f"\n{summary.format()}\n" if summary else ""
        return head + "\n\n" + arms_analysis.sweep_markdown(self.points) + tail

    def to_dict(self) -> dict:
        return {"traces_dir": self.traces_dir, "points": {p: r.to_dict() for p, r in self.runs.items()}}


async def arun_sweep(traces_dir: str, prefixes: tuple[int, ...], **kwargs: Any) -> SweepResult:
    """:func:`arun_arms` once per first-turn prefix length, each point in ``traces_dir/prefix-N``
    (``kwargs`` as there; the workload must be a built-in one or a generate_conversations input)."""
    if not prefixes:
        raise bench.BenchError("the sweep needs at least one point")
    if os.path.isdir(traces_dir) and os.listdir(traces_dir):
        raise bench.BenchError(f"{traces_dir} is not empty: the sweep's runs need a directory of their own")
    if kwargs.get("published") is None and kwargs.get("input") is None:
        raise bench.BenchError("--sweep prefix=... needs --workload or a generate_conversations --input")
    runs = {}
    for prefix in prefixes:
        point = os.path.join(traces_dir, arms_analysis.point_dir(prefix))
        runs[prefix] = await arun_arms(point, prefix=prefix, **kwargs)
    points = [arms_analysis.SweepPoint(p, r.tables) for p, r in sorted(runs.items())]  # each run read its point
    return SweepResult(points, runs, traces_dir)


def run_sweep(traces_dir: str, prefixes: tuple[int, ...], **kwargs: Any) -> SweepResult:
    """Synchronous :func:`arun_sweep` (``clock="virtual"``: on the virtual-time loop)."""
    return _run(arun_sweep(traces_dir, prefixes, **kwargs), kwargs.get("clock", "wall"), kwargs.get("seed", 0))
