"""What ``kvtrace demo`` prints once both runs are done: the setup, where the bidirectional run's
agent time went, its KV reuse and retention, and the comparison of the two runs, every number
from :mod:`kvtrace.analysis` (tables from :mod:`kvtrace.analysis.report.text`).  Everything fits
:data:`kvtrace.analysis.report.text.WIDTH` (120) columns: prose is wrapped, tables are kept narrow."""

from __future__ import annotations

from kvtrace.analysis import compare
from kvtrace.analysis.report import text
from kvtrace.demo.run import LEASE_S, PREFILL_WORKERS, PROXY_MARGIN_S, RESUME_PAUSE_S, SCENARIOS, SYSTEM_TOKENS, TTL_S


def summarize(bidir_dir: str, baseline_dir: str, time_scale: float, sessions: int = 2) -> str:
    """The printed summary: the setup, breakdown and reuse of the bidirectional run, and the
    comparison of the two runs."""
    from kvtrace.store import connect

    bidir, baseline = connect(bidir_dir), connect(baseline_dir)
    out = [
        *setup_lines(time_scale, sessions),
        "",
        "== Where agent time goes (bidirectional run; wall ms) ==",
        text.md_table(*text.breakdown_totals_rows(bidir)),
        "",
        text.wrap(
            f"User pauses: the simulated users' think time before a turn (research-assistant, short-followups) "
            f"and pause-resume's {RESUME_PAUSE_S:g} model-second pause, marked by the agent (user_pause spans); "
            "app work: the agent's own work plus time no span covers."
        ),
        "",
        "Longest sessions:",
        text.md_table(*text.breakdown_rows(bidir, limit=12)),
        "",
        "== KV reuse (bidirectional run; times in wall ms) ==",
        text.md_table(*text.reuse_rows(bidir)),
        "",
        text.md_table(*text.decision_mix_rows(bidir)),
        "",
        text.wrap(
            f"KV held on D for next turns (GiB·s in wall seconds; 'expired': nobody read them within {TTL_S:g} "
            f"model s; {text.NEVER_READ_NOTE}):"
        ),
        "",
        text.md_table(*text.retention_rows(bidir)),
        "",
        *comparison_sections(baseline, bidir, time_scale),
    ]
    return "\n".join(out)


def comparison_sections(baseline, bidir, time_scale: float) -> list[str]:
    """TTFT by turn index with the verdict of :mod:`kvtrace.analysis.compare` (turn 0, where
    neither run has anything to reuse, is the check of the harness's noise), TTFT by the prefill
    work reuse saved (calls paired across the runs), P's work and the completed-turn latency by
    turn, and the result."""
    rows = compare.compare_runs(baseline, bidir)
    groups = text.saved_groups(baseline, bidir)
    return [
        "== Mean TTFT by turn index (ratio = bidir / baseline; < 1 = faster with reuse) ==",
        text.md_table(*text.ttft_rows(rows, time_scale)),
        "",
        text.wrap(
            "95% CI: bootstrap interval of the ratio; the verdict is faster/slower when it excludes 1 (the rule "
            "of kvtrace bench, kvtrace report and the dashboard). Turn 0 is the check: neither run has anything "
            "to reuse there, so it should be within noise."
        ),
        "",
        text.wrap(
            "== Mean TTFT by prompt tokens the baseline's P computed and the bidir run's P did not (turns >= 1, "
            "each call paired with the same call of the other run) =="
        ),
        text.md_table(*text.saved_rows(groups, time_scale)),
        "",
        text.wrap(
            "A turn routed to the P that computed the conversation's previous turn finds the history in that P's "
            "prefix cache in both runs (few tokens saved); one routed to the other P recomputes it in the "
            f"baseline and pulls it from D with bidirectional transfer. With {PREFILL_WORKERS} P workers and "
            "round-robin this is about half the turns, and a P that served the conversation some turns earlier "
            "still holds an older prefix. Negative token counts: the bidir run's call landed on a P holding "
            "less of the history."
        ),
        "",
        "== Prefill work on P per request by turn index (mean tokens) ==",
        text.md_table(*text.prefill_work_rows(baseline, bidir, rows)),
        "",
        "== Mean completed-turn latency by turn index (ratio = bidir / baseline) ==",
        text.md_table(*text.ttft_rows(rows, time_scale, metric="turn_latency_ms")),
        "",
        text.wrap(conclusion(rows, groups, time_scale)),
    ]


def setup_lines(time_scale: float, sessions: int) -> list[str]:
    """What ran and how to read its times."""
    S = f"{time_scale:g}"
    return [
        text.wrap(p)
        for p in (
            f"Setup: simulated vLLM P/D cluster (Qwen3-32B preset), {PREFILL_WORKERS} prefill workers "
            "+ 1 decode worker behind the instrumented proxy (round-robin over P).",
            f"Workload (same seed in both runs): {sessions} session(s) each of {', '.join(SCENARIOS)}; a "
            f"~{sum(SYSTEM_TOKENS) // 2:,}-token system prompt, files, documents and pages of 3-12k tokens, test logs "
            "of 1-2k per turn; contexts of 6-25k tokens.",
            f"KV config (model time): decoder_kv_blocks_ttl {TTL_S:g} s (vLLM's default is 480 s; shortened so "
            f"pause-resume's {RESUME_PAUSE_S:g} s pause outlasts D's retention within the demo), proxy offers D's "
            f"blocks for {TTL_S - PROXY_MARGIN_S:g} s, kv_lease_duration {LEASE_S:g} s, kv_recompute_threshold 64.",
            f"Time: the replay is compressed {S}x. 'wall ms' is measured wall-clock time; 'model s' is wall x {S}, "
            "the time on the simulated GPUs. Each request also carries the harness's own HTTP/Python overhead "
            f"(tens of wall ms, not compressed), which 'model s' inflates {S}x: small model times are overstated.",
        )
    ]


def conclusion(rows: list[dict], groups: list[dict], time_scale: float) -> str:
    """One paragraph: the pooled turns >= 1 TTFT of both runs with its verdict, the calls where
    reuse saved the most, and turn 0's ratio."""
    later, first = compare.row(rows, "ttft_ms", compare.LATER), compare.row(rows, "ttft_ms", 0)
    if later is None or later["ratio"] is None:
        return "Not enough LLM calls in both runs to compare TTFT."
    model = lambda v: text.model_s(v, time_scale)  # noqa: E731
    line = (
        f"Result: over {later['n_b']} LLM calls at turns >= 1, mean TTFT {model(later['a_mean'])} model s without "
        f"bidirectional reuse -> {model(later['b_mean'])} with it (ratio {text.ratio(later['ratio'])}, 95% CI "
        f"{text.ci(later)}: {later['verdict']})"
    )
    most = groups[-1] if groups else None
    if most and most["ratio"] is not None:
        line += (
            f"; on the {most['calls']} calls whose baseline recomputed {most['label']} tokens more: "
            f"{model(most['baseline_ms'])} -> {model(most['candidate_ms'])} model s (ratio "
            f"{text.ratio(most['ratio'])})"
        )
    if first is not None and first["ratio"] is not None:
        line += f"; turn 0 (nothing to reuse): ratio {text.ratio(first['ratio'])}, {first['verdict']}"
        if first["verdict"] != compare.WITHIN_NOISE:
            line += (
                ". Turn 0 should be within noise: something else slowed one run down (other work on these "
                "cores?), so rerun before trusting this comparison"
            )
    return line + "."
