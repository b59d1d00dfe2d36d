"""The benchmarks still run: each script at a scale of seconds, as docs/benchmarks.md runs it.

No figure is checked here (speed belongs to the benchmarks, on a quiet machine); what is checked is
that each script starts, drives what it measures and prints every line its targets are read from.
``bench_analysis.py`` also checks behaviour: it fails unless the breakdown views' sums equal the
pre-#27 SQL's, with scan indexes and without, over its synthetic store.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.require import require_vllm

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    path = f"{ROOT}{os.pathsep}{ROOT / 'tests'}"
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _lines_starting(out: str, prefix: str) -> list[str]:
    return [line for line in out.splitlines() if line.strip().startswith(prefix)]


def test_bench_analysis_agrees_with_the_pre_27_sql_with_and_without_scan_indexes(tmp_path):
    scale = ("--spans", "40000", "--dashboard-spans", "0", "--repeat", "1", "--dir", str(tmp_path))
    got = _run("analysis/bench_analysis.py", *scale)
    assert got.returncode == 0, got.stderr[-3000:]
    for label in (
        "session_breakdown before #27",
        "session_breakdown (all sessions)",
        "turn_breakdown (all turns)",
        "sessions.turns of one session",
        "agent_llm_calls (all calls)",
        "agents.doctor (every section)",
        "scan indexes built",
        "session_breakdown, no scan index",
        "turn_breakdown, no scan index",
    ):
        assert len(_lines_starting(got.stdout, label)) == 1, (label, got.stdout)


def test_bench_history_answers_each_question_at_both_history_lengths(tmp_path):
    scale = ("--spans-per-day", "20000", "--days", "2,4", "--repeat", "1", "--dir", str(tmp_path))
    got = _run("analysis/bench_history.py", *scale)
    assert got.returncode == 0, got.stderr[-3000:]
    for question in ("one day", "one session", "first page", "KV reuse page", "retention page"):
        assert len(_lines_starting(got.stdout, f"| {question} |")) == 3, (question, got.stdout)  # 2 stores, ratio
    [reuse_ratio] = [x for x in _lines_starting(got.stdout, "| KV reuse page |") if "not a target" in x]
    assert reuse_ratio.count("|") == 6, reuse_ratio
    assert len(_lines_starting(got.stdout, "| before #40: one day |")) == 1, got.stdout  # equal answers checked
    for page in ("KV reuse page", "retention page"):
        assert len(_lines_starting(got.stdout, f"| before: {page} |")) == 1, got.stdout  # likewise


def test_bench_clickhouse_tiles_a_longer_history_and_answers_alike_on_every_table(tmp_path):
    """``--tile``: the two-day history is the one-day Parquet inserted twice (new ids, a day later):
    twice the spans, and every question's answer the same raw, shaped, staged and as one statement."""
    pytest.importorskip("chdb")
    scale = ("--history", "1", "2", "--tile", "1", "--spans-per-day", "3000", "--repeat", "2")
    got = _run("clickhouse/bench_clickhouse.py", *scale, "--dir", str(tmp_path))
    assert got.returncode == 0, got.stderr[-3000:]
    inserted = {}
    for line in _lines_starting(got.stdout, "1 d, ") + _lines_starting(got.stdout, "2 d, "):
        head, _, rest = line.partition(": ")
        inserted[head] = int(rest.split()[0].replace(",", ""))
    assert set(inserted) == {"1 d, raw", "1 d, shaped", "2 d, raw", "2 d, shaped"}, got.stdout
    assert inserted["2 d, raw"] == inserted["2 d, shaped"] == 2 * inserted["1 d, raw"] > 0
    heads = ("| 1 d |", "| 2 d |", "| small |", "| session_breakdown |", "| turn_breakdown |")
    rows = [line for line in got.stdout.splitlines() if line.startswith(heads)]
    answers = [line.rstrip(" |").rsplit("| ", 1)[1] for line in rows if line.endswith(("same |", "DIFFERENT |"))]
    # per history: five questions raw against shaped, three staged against one statement; the small store's two
    assert len(answers) == (5 + 3) * 2 + 2 + 2 and set(answers) == {"same"}, got.stdout
    for page in ("KV reuse page", "retention page"):
        assert len(_lines_starting(got.stdout, f"| {page} |")) == 1, got.stdout  # its flatness ratios


def test_bench_clickhouse_prices_each_insert_size_with_and_without_the_views(tmp_path):
    """``--insert-batches``: a row per batch size and variant (raw, shaped, each view alone, the scan's
    table unclassified), and the spans each variant's table then holds are the spans staged."""
    pytest.importorskip("chdb")
    args = ("--insert-batches", "1000", "3000", "--insert-spans", "6000", "--repeat", "1", "--per-view")
    got = _run("clickhouse/bench_clickhouse.py", *args, "--dir", str(tmp_path))
    assert got.returncode == 0, got.stderr[-3000:]
    rows = [line.strip("| ").split(" | ") for line in _lines_starting(got.stdout, "| ") if line[2:3].isdigit()]
    tables = ("scan", "sessions", "traces", "windows", "requests", "prefills", "d2p")
    variants = ["raw", "shaped", *(f"_kvtrace_{t}" for t in tables), "floor"]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (size, inserts, v) for size, inserts in (("1,000", "6"), ("3,000", "2")) for v in variants
    ], got.stdout
    assert all(r[4] == "1.00" for r in rows if r[2] == "raw")


def test_bench_proxy_drives_every_mode_and_prints_the_targets():
    got = _run("proxy/bench_proxy.py", "--requests", "8", "--rounds", "1", "--concurrency", "1", "--lag-requests", "0")
    assert got.returncode == 0, got.stderr[-3000:] + got.stdout[-3000:]
    rows = {line.split()[0] for line in got.stdout.splitlines() if line.split()[1:2] == ["1"]}
    assert {"direct_d", "direct_pd", "direct_reuse", "forwarder", "kvtrace", "kv_nometric", "kv_stateless"} <= rows
    for target in ("c=1 +p99 vs direct P->D", "c=1 +p50 vs direct P->D", "c=1 CPU/request"):
        assert len(_lines_starting(got.stdout, target)) == 1, (target, got.stdout)


def test_bench_fleet_replays_a_given_mooncake_trace_and_tiles_it_past_its_sessions(tmp_path):
    from kvtrace.bench import mooncake

    lines = mooncake.shipped("mooncake-conversation").read_text().splitlines()
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines[:30]) + "\n")
    n = len(mooncake.sessions(mooncake.read_rows(trace)))
    fleet = ("--prefillers", "2", "--decoders", "2")
    got = _run("sim/bench_fleet.py", "--trace", str(trace), "--sessions", str(n + 3), *fleet, timeout=120)
    assert got.returncode == 0, got.stderr[-3000:]
    (workload,) = _lines_starting(got.stdout, "workload:")
    assert workload.startswith(f"workload: {n + 3} sessions,"), workload  # a second copy for the last 3
    (arm,) = _lines_starting(got.stdout, "pcache-on_bidir-on:")
    assert " 0 failed " in arm, arm
    assert len(_lines_starting(got.stdout, "CPU per arm")) == 1, got.stdout


def test_bench_hop_prices_one_exchange_on_the_virtual_loop_and_over_tcp():
    got = _run("sim/bench_hop.py", "--exchanges", "30", "--body-kb", "1", "16", "--per-request-ms", "5")
    assert got.returncode == 0, got.stderr[-3000:]
    rows = [line.strip("| ").split(" | ") for line in _lines_starting(got.stdout, "| ") if line[2:3].isdigit()]
    assert [r[0] for r in rows] == ["1", "16"], got.stdout
    assert all(float(c) > 0 for r in rows for c in r[1:]), got.stdout
    shares = _lines_starting(got.stdout, "1 KB bodies:") + _lines_starting(got.stdout, "16 KB bodies:")
    assert len(shares) == 2 and all(line.endswith("of 5.0 ms") for line in shares), got.stdout


@pytest.mark.vllm
def test_bench_connector_times_every_hook_and_each_verify_arm():
    require_vllm()
    got = _run("connector/bench_connector.py", "--requests", "40", "--metrics", "on")
    # 1 is also the exit code of an uncaught exception: it passes only as the printed verdict of a target
    # missed, which a loaded test machine may show
    assert got.returncode in (0, 1) and "Traceback" not in got.stderr, got.stderr[-3000:]
    if got.returncode == 1:
        assert _lines_starting(got.stdout, "worst added median:")[0].endswith("OVER"), got.stdout
    for hook in (
        "on_new_request",
        "get_num_new_matched_tokens",
        "update_state_after_alloc",
        "build_connector_meta",
        "update_connector_output",
        "get_kv_connector_stats",
        "request_finished_all_groups",
    ):
        assert len(_lines_starting(got.stdout, hook)) == 1, (hook, got.stdout)
    for arm in ("v2 record", "v2 enforce", "v1 record"):
        assert len(_lines_starting(got.stdout, arm)) == 1, (arm, got.stdout)
    assert len(_lines_starting(got.stdout, "worst added median:")) == 1, got.stdout
