"""Proof that the what-if replay predicts the system: record the simulator at one setting, replay
those traces at other settings, run the simulator again at each of them, compare.

Workload (fixed seed): two sessions each of pause-resume (with a 12 s pause before the resumed
turn), coding-agent and short-followups (:func:`scenarios`), all at once, through the kvtrace proxy (offer margin 5 s:
``--conversation-ttl`` = TTL - 5) to a simulated P/D cluster, compressed :data:`SCALE` times.
Recorded at ``decoder_kv_blocks_ttl`` 480 s, threshold 64; replayed and re-run at TTL 15, 30 and
120 s (threshold 64) and at threshold 256 (TTL 480).  TTL 15 against the 12 s pause: the proxy no
longer offers the resumed turn D's blocks (12 s > 15 - 5), which D drops at 15 s.

1 P + 1 D: decisions by outcome equal exactly (and per decision), GiB·s held within 5 %, mean
TTFT within 15 %.  2 P + 1 D: the proxy's round-robin sends a session's turns to either P in an
order that depends on timing, so a re-run's local prefix hits differ from the recorded ones; the
replay (which keeps the recorded local hits) must match every decision whose local hit the re-run
reproduced, and the differences are printed (``pytest -s``).

The simulator runs in compressed wall time, so a machine busy with other work can stall a run:
stretch its turn gaps (past a TTL boundary, even), its TTFTs and its length.  Such a pair of runs
is not the same workload; it is detected from its own spans (:func:`unfaithful`) and run again
(:func:`comparable`).  Decisions are compared whatever the machine did (the workload keeps its
turn gaps well away from every TTL boundary); GiB·s and TTFT are compared on comparable pairs,
and a test whose pairs never were says so by ending skipped (after its other checks passed).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis.common import rows
from kvtrace.analysis.whatif.replay import load, replay
from kvtrace.store import connect as open_store

from support.whatif_check import check_recorded_row

SCALE = 4.0
SEED = 7
OFFER_MARGIN_S = 5.0
RECORDED = (480.0, 64)
SETTINGS = [(15.0, 64), (30.0, 64), (120.0, 64), (480.0, 256)]
GAP_TOLERANCE_S = 1.5  # a re-run is the same workload when its turn gaps are within this of the recorded
REFERENCE_TOLERANCE = 0.10  # ... its turn-0 TTFT, and its later turns with unchanged decisions, within 10 %
LENGTH_TOLERANCE = 0.03  # ... and the whole workload's duration within 3 %
ATTEMPTS = 3
OUTCOMES = ("pulled", "expired", "below_threshold", "no_remote", "local_hit", "failed")

_recordings: dict = {}  # P workers -> (store, directory) of the recorded run


def scenarios():
    """Proof versions of the built-in scenarios: the same turn structure and waits, answers of
    72-128 tokens (a turn's pull is about the previous answer: above threshold 64, below 256;
    fewer streamed tokens, less wall time for the compression to multiply), test logs of
    800-1600 tokens (prefill compute, not the harness, is most of a TTFT); pause-resume pauses
    12 s before the resumed turn."""
    from kvtrace.bench.distributions import Constant
    from kvtrace.bench.distributions import Uniform as U
    from kvtrace.bench.scenarios import CODING_AGENT, LLM, PAUSE_RESUME, SHORT_FOLLOWUPS, Tool

    def sized(step):
        if isinstance(step, LLM):
            return LLM(U(72, 128))
        return replace(step, output_tokens=U(800, 1600)) if isinstance(step, Tool) else step

    coding = CODING_AGENT.with_(turns=tuple(replace(t, steps=tuple(map(sized, t.steps))) for t in CODING_AGENT.turns))
    turns = [replace(t, steps=tuple(map(sized, t.steps))) for t in PAUSE_RESUME.turns]
    turns[2] = replace(turns[2], pause_s=Constant(12.0))  # the resumed turn
    return [PAUSE_RESUME.with_(turns=tuple(turns)), coding, SHORT_FOLLOWUPS]


def workload():
    """Two sessions of each scenario, one Workload (the same draw for every run)."""
    from kvtrace.bench.workload import Workload, from_scenario

    plans = [p for s in scenarios() for p in from_scenario(s, 2, SEED, "w").sessions]
    return Workload("whatif-proof", plans, SEED)


async def _run(directory: str, ttl: float, threshold: int, n_prefill: int) -> None:
    import kvtrace
    from kvtrace.bench import api as bench
    from kvtrace.proxy import server
    from kvtrace.proxy.config import ProxyConfig, Worker
    from kvtrace.sim.cluster import SimCluster

    kv = {
        "kv_connector_extra_config": {
            "decoder_kv_blocks_ttl": ttl,
            "kv_recompute_threshold": threshold,
            "kv_lease_duration": 600.0,
        }
    }
    proxy_provider = kvtrace.configure("kvtrace-proxy", traces_dir=directory, handle_sigterm=False)
    bench_provider = kvtrace.configure("kvtrace-bench", traces_dir=directory, handle_sigterm=False)
    try:
        async with SimCluster(n_prefill, 1, kv_config=kv, time_scale=SCALE, traces_dir=directory) as cluster:
            cfg = ProxyConfig(
                prefill=[Worker("127.0.0.1", w.port) for w in cluster.prefill],
                decode=[Worker("127.0.0.1", w.port) for w in cluster.decode],
                port=0,
                conversation_ttl_s=(ttl - OFFER_MARGIN_S) / SCALE,
            )
            proxy = await server.start(cfg, tracer_provider=proxy_provider)
            try:
                work = workload()
                await bench.arun_bench(
                    proxy.url,
                    workload=work,
                    tracer_provider=bench_provider,
                    time_scale=1.0 / SCALE,
                    clients=len(work.sessions),
                    seed=SEED,
                    nonce="w",
                )
            finally:
                await proxy.close()
    finally:
        proxy_provider.shutdown()
        bench_provider.shutdown()


def sim_run(tmp_path_factory, setting: tuple[float, int], n_prefill: int):
    """A new simulator run at ``setting``: (store connection, directory)."""
    directory = tmp_path_factory.mktemp(f"sim-{n_prefill}p-ttl{setting[0]:g}-th{setting[1]}")
    asyncio.run(_run(str(directory), *setting, n_prefill))
    return open_store(directory), directory


def recording(tmp_path_factory, n_prefill: int, fresh: bool = False):
    """The recorded run (TTL 480 s, threshold 64), cached per module unless ``fresh``."""
    if fresh or n_prefill not in _recordings:
        _recordings[n_prefill] = sim_run(tmp_path_factory, RECORDED, n_prefill)
    return _recordings[n_prefill]


def comparable(tmp_path_factory, setting: tuple[float, int], n_prefill: int):
    """(recording, re-run at ``setting``, why they are not comparable or None).  The simulator
    runs in compressed wall time: when another process stalls either run, its turn gaps, its
    turn-0 TTFT, its later turns with unchanged decisions (the same work) or its duration say so
    (:func:`unfaithful`), and the re-run is made again; the third attempt with a new recording too
    (the stalled run may have been the recording)."""
    for attempt in range(ATTEMPTS):
        rec_con, _ = recording(tmp_path_factory, n_prefill, fresh=attempt == 2)
        sim, _ = sim_run(tmp_path_factory, setting, n_prefill)
        why = unfaithful(timing(rec_con), timing(sim))
        if why is None:
            break
        print(
            f"{n_prefill}P+1D TTL {setting[0]:g} threshold {setting[1]}: attempt {attempt + 1} not comparable "
            f"({why}){'; running it again' if attempt + 1 < ATTEMPTS else ''}"
        )
    return rec_con, sim, why


def timing(con) -> dict:
    """Turn gaps by (session, turn), model s, the mean TTFT of turn 0 (no reuse possible in any
    setting: the same work every run), model ms, and how long the workload took, model s."""
    gaps = {
        (r["session_id"], r["turn"]): r["gap_s"]
        for r in rows(con, "SELECT session_id, turn, gap_s FROM turn_gaps WHERE gap_s IS NOT NULL")
    }
    ref = rows(con, "SELECT avg(ttft_ms) AS t FROM requests WHERE turn = 0")[0]["t"]
    length = rows(con, "SELECT (max(end_ns) - min(start_ns)) / 1e9 AS s FROM requests")[0]["s"]
    turns = {
        (r["session_id"], r["turn"]): (r["decided"], r["t"] * SCALE)
        for r in rows(
            con,
            "SELECT r.session_id, r.turn, avg(r.ttft_ms) AS t, "
            "list(DISTINCT (d.outcome, d.pulled_tokens) ORDER BY (d.outcome, d.pulled_tokens)) AS decided "
            "FROM requests r LEFT JOIN kv_decisions d ON d.trace_id = r.trace_id "
            f"AND d.direction = '{sc.DIRECTION_D2P}' WHERE r.turn > 0 AND r.ttft_ms IS NOT NULL "
            "GROUP BY r.session_id, r.turn",
        )
    }
    return {"gaps": gaps, "reference_ms": ref * SCALE, "length_s": length * SCALE, "turns": turns}


def unfaithful(reference: dict, run: dict) -> str | None:
    """Why ``run`` did not replay the recorded workload's timing, or None."""
    common = reference["gaps"].keys() & run["gaps"].keys()
    worst = max((abs(run["gaps"][k] - reference["gaps"][k]) for k in common), default=0.0)
    if worst > GAP_TOLERANCE_S:
        return f"a turn gap differs by {worst:.1f} s from the recorded run's"
    ratio = run["reference_ms"] / reference["reference_ms"]
    if abs(ratio - 1) > REFERENCE_TOLERANCE:
        return f"turn-0 TTFT {ratio:.2f}x the recorded run's"
    # later turns whose decisions are the same in both runs are the same work too: a stall in
    # either run's later turns shows there (turn 0 alone misses it)
    ref_turns, run_turns = reference["turns"], run["turns"]
    same = [k for k in ref_turns.keys() & run_turns.keys() if ref_turns[k][0] == run_turns[k][0]]
    if same:
        ratio = sum(run_turns[k][1] for k in same) / sum(ref_turns[k][1] for k in same)
        if abs(ratio - 1) > REFERENCE_TOLERANCE:
            return f"turns with unchanged decisions {ratio:.2f}x the recorded run's TTFT"
    ratio = run["length_s"] / reference["length_s"]  # blocks still held at the end are held until then
    if abs(ratio - 1) > LENGTH_TOLERANCE:
        return f"the workload took {ratio:.2f}x the recorded run's time"
    return None


def measured(con) -> dict:
    """What the simulator did: decisions by outcome, GiB·s held (model s), mean TTFT (model ms)."""
    mix = {
        r["outcome"]: r["n"]
        for r in rows(
            con,
            f"SELECT outcome, count(*) AS n FROM kv_decisions WHERE direction = '{sc.DIRECTION_D2P}' GROUP BY outcome",
        )
    }
    held = rows(con, "SELECT sum(byte_seconds) AS bs FROM kv_retention")[0]["bs"] or 0.0
    ttft = rows(con, "SELECT avg(ttft_ms) AS t FROM requests")[0]["t"]
    return {"outcomes": {o: mix.get(o, 0) for o in OUTCOMES}, "gib_s": held * SCALE / 2**30, "ttft": ttft * SCALE}


def per_decision(con) -> list[dict]:
    """The d2p decisions in the replay's order (start, span id), keyed by session and turn."""
    return rows(
        con,
        "SELECT session_id, turn, outcome, local_hit_tokens FROM kv_decisions "
        f"WHERE direction = '{sc.DIRECTION_D2P}' ORDER BY start_ns, span_id",
    )


def compare(tmp_path_factory, n_prefill: int, settings) -> list[dict]:
    out = []
    for setting in settings:
        recorded, sim, why = comparable(tmp_path_factory, setting, n_prefill)
        rec = load(recorded)
        assert rec.offer_margin_s == pytest.approx(OFFER_MARGIN_S) and rec.offer_margin_known
        assert (rec.ttl_s, rec.threshold, rec.time_scale) == (*RECORDED, SCALE)
        order = per_decision(recorded)
        r = replay(rec, *setting)
        got = measured(sim)
        predicted = {(d["session_id"], d["turn"]): sc.OUTCOMES[c] for d, c in zip(order, r.codes, strict=True)}
        actual = {(d["session_id"], d["turn"]): d for d in per_decision(sim)}
        recorded_hits = {(d["session_id"], d["turn"]): d["local_hit_tokens"] for d in order}
        out.append(
            {
                "setting": setting,
                "replay": {o: r.row[o] for o in OUTCOMES},
                "sim": got["outcomes"],
                "gib_s": (r.row["gib_s_held"], got["gib_s"]),
                "ttft": (r.row["ttft_mean_ms"], got["ttft"]),
                "predicted": predicted,
                "actual": actual,
                "recorded_hits": recorded_hits,
                "unfaithful": why,
                "recorded": {o: replay(rec, *RECORDED).row[o] for o in OUTCOMES},
                "by_ttl": {t: replay(rec, t, RECORDED[1]).row for t, _ in SETTINGS[:3]},
            }
        )
        print(
            f"{n_prefill}P+1D TTL {setting[0]:g} threshold {setting[1]}: replay {out[-1]['replay']} | sim "
            f"{got['outcomes']} | GiB·s {r.row['gib_s_held']:.2f} vs {got['gib_s']:.2f} "
            f"({_rel(r.row['gib_s_held'], got['gib_s']):+.1%}) | mean TTFT {r.row['ttft_mean_ms']:.1f} vs "
            f"{got['ttft']:.1f} ms ({_rel(r.row['ttft_mean_ms'], got['ttft']):+.1%})"
        )
    return out


def _rel(predicted: float, actual: float) -> float:
    return (predicted - actual) / actual if actual else math.inf


def _check_1p(result: dict) -> None:
    """Decisions by outcome (and each decision) equal exactly; GiB·s within 5 % and mean TTFT within
    15 % when the two runs ran the same workload (:func:`comparable`)."""
    assert result["replay"] == result["sim"], result["setting"]
    assert result["predicted"] == {k: d["outcome"] for k, d in result["actual"].items()}
    if result["unfaithful"]:
        return
    predicted, actual = result["gib_s"]
    assert abs(_rel(predicted, actual)) <= 0.05, (result["setting"], predicted, actual)
    predicted, actual = result["ttft"]
    assert abs(_rel(predicted, actual)) <= 0.15, (result["setting"], predicted, actual)


def _skip_if_unchecked(results: list[dict]) -> None:
    """After every robust assertion passed: say so when the machine never let the timing be compared."""
    busy = [
        f"TTL {r['setting'][0]:g} threshold {r['setting'][1]}: {r['unfaithful']}" for r in results if r["unfaithful"]
    ]
    if busy:
        pytest.skip(
            f"decisions checked; GiB·s / TTFT not comparable on this busy machine after {ATTEMPTS} "
            f"attempts ({'; '.join(busy)})"
        )


@pytest.mark.slow
@pytest.mark.timeout(1800)  # on an idle 2-core machine one attempt each, under a minute per test
def test_recorded_row_equals_the_simulators_outcomes(tmp_path_factory):
    """tests/support/whatif_check.py (the helper for the vLLM end-to-end test) on simulator traces."""
    _, directory = recording(tmp_path_factory, 1)
    row = check_recorded_row(directory)
    assert row["pulled"] > 0 and row["below_threshold"] > 0 and row["no_remote"] > 0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_replay_predicts_the_simulator_at_other_ttls(tmp_path_factory):
    results = compare(tmp_path_factory, 1, SETTINGS[:3])
    for result in results:
        _check_1p(result)
    by_ttl = {r["setting"][0]: r for r in results}
    # the settings differ where they should: TTL 15 stops offering the turn resumed after 12 s
    assert by_ttl[15.0]["sim"]["no_remote"] > by_ttl[30.0]["sim"]["no_remote"]
    # between settings that offer the same pulls a longer TTL never holds less (120 s holds more
    # than 30 s only if some blocks outlive 30 s before the recording ends, which depends on how
    # long the compressed run took).  TTL 15 is not ordered against them: the resumed turn's blocks,
    # no longer pulled at ~12 s, stay held until they expire at 15 s, which can outweigh what the
    # shorter TTL saves elsewhere (72.07 vs 71.03 GiB·s in one CI run).
    row = results[0]["by_ttl"]  # one recording replayed at each TTL
    if all(row[30.0][o] == row[120.0][o] for o in OUTCOMES):  # no recorded gap fell in 25-115 s
        assert row[30.0]["gib_s_held"] <= row[120.0]["gib_s_held"]
    _skip_if_unchecked(results)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_replay_predicts_the_simulator_at_another_threshold(tmp_path_factory):
    (result,) = compare(tmp_path_factory, 1, SETTINGS[3:])
    _check_1p(result)
    # a pull is about the previous answer (72-128 tokens): above 64, below 256
    assert result["sim"]["below_threshold"] == result["recorded"]["below_threshold"] + result["recorded"]["pulled"]
    assert result["recorded"]["pulled"] > 0 and result["sim"]["pulled"] == 0
    _skip_if_unchecked([result])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_two_prefill_workers_differ_only_where_routing_changed_the_local_hit(tmp_path_factory):
    results = compare(tmp_path_factory, 2, [SETTINGS[1], SETTINGS[3]])
    for result in results:
        same = [k for k, d in result["actual"].items() if result["recorded_hits"].get(k) == d["local_hit_tokens"]]
        changed = len(result["actual"]) - len(same)
        wrong = [k for k in same if result["predicted"][k] != result["actual"][k]["outcome"]]
        print(
            f"  {len(same)} decisions with the recorded local hit: {len(wrong)} mispredicted; {changed} routed to a "
            "P holding a different prefix"
        )
        assert set(result["actual"]) == set(result["predicted"])
        assert wrong == []
        if not result["unfaithful"]:
            predicted, actual = result["gib_s"]
            assert abs(_rel(predicted, actual)) <= 0.10, (result["setting"], predicted, actual)
    _skip_if_unchecked(results)
