"""``kvtrace whatif``: replay a trace directory under other retention TTLs and recompute thresholds."""

from __future__ import annotations

import sys

from kvtrace.cli import options
from kvtrace.store import source

FORMATS = ("table", "json", "csv")


def _numbers(kind):
    def parse(text: str):
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"not a comma-separated list of numbers: {text!r}") from None
        if not values or any(v < 0 for v in values):
            raise ValueError(f"expected non-negative numbers: {text!r}")
        return values

    parse.__name__ = "list"
    return parse


def add_arguments(parser) -> None:
    from kvtrace.analysis.whatif.replay import DEFAULT_THRESHOLDS, DEFAULT_TTLS

    options.add_source_arguments(parser)
    parser.add_argument(
        "--ttl",
        type=_numbers(float),
        default=list(DEFAULT_TTLS),
        metavar="S,S,...",
        help=f"decoder_kv_blocks_ttl values to replay, model seconds (default {','.join(map(str, DEFAULT_TTLS))})",
    )
    parser.add_argument(
        "--threshold",
        type=_numbers(int),
        default=list(DEFAULT_THRESHOLDS),
        metavar="N,N,...",
        help=f"kv_recompute_threshold values (default {','.join(map(str, DEFAULT_THRESHOLDS))})",
    )
    parser.add_argument(
        "--offer-margin",
        type=float,
        metavar="S",
        help="the proxy offers D's blocks while younger than TTL minus S (default: the recorded "
        "decoder_kv_blocks_ttl minus the recorded --conversation-ttl)",
    )
    parser.add_argument(
        "--budget-gib",
        type=float,
        metavar="G",
        help="recommend the best TTFT whose peak KV held on one D stays within G GiB",
    )
    parser.add_argument(
        "--arms",
        action="store_true",
        help="instead of the TTL/threshold grid: the four arms of the recorded run (P prefix cache off/on x "
        "bidirectional off/on), TTFT priced by the run's own calibration",
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    parser.add_argument("--output", "-o", metavar="FILE", help="write the rows here instead of stdout")


def run(args) -> int:
    """Replay the recorded traffic of a trace directory under other decoder_kv_blocks_ttl and
    kv_recompute_threshold settings and recommend one.  Pure computation over the traces: every
    recorded d2p decision (P pulling D's blocks of the previous turn, or recomputing) is decided
    again with vLLM's rules (kvtrace.kvrules, the simulator's code) from its recorded prompt,
    local-hit and reusable tokens and the recorded gap since the previous turn; D's retention
    intervals are rebuilt under each TTL.  The setting the traces ran with is always replayed
    (its row equals the recorded outcomes).  Times are model seconds (wall x the simulator's time
    scale; wall on vLLM).

    One row per setting; JSON (array of objects) and CSV have exactly these keys:

      ttl_s               decoder_kv_blocks_ttl replayed (s); the proxy offers D's blocks while
                          younger than ttl_s minus the offer margin.  Empty (null) in the
                          recorded row when the decode workers ran different TTLs: each D
                          keeps its own there (every other row applies ttl_s to every D)
      threshold           kv_recompute_threshold replayed (tokens)
      decisions           recorded d2p decisions (the same in every row)
      pulled              P pulled D's blocks
      expired             P was offered blocks D had dropped or would drop within vLLM's 5 s margin:
                          vLLM declines the read, and under kv_load_failure_policy=fail (the
                          default) the request fails: the predicted failures
      below_threshold     fewer than `threshold` tokens to pull: P recomputed them
      no_remote           nothing offered (no previous turn, or its entry too old for the proxy)
      local_hit           P's own prefix cache already held everything D had
      failed              pulls recorded as failed for other reasons that the replay still makes
      unverified          P ran verify=enforce and too few of the offered tokens were proven its
                          prompt's (D's digest) to clear `threshold`: P recomputed them
      pulled_tokens       tokens pulled from D
      recomputed_tokens   prompt tokens P computed
      gib_s_held          KV held on every D for next turns, GiB x model s
      peak_gib_held       the most KV held at once on one D, GiB
      ttft_mean_ms        mean time to first token (model ms) of the requests with a recorded TTFT
      ttft_p90_ms         its 90th percentile
      recorded            true for the setting the traces ran with

    TTFT = recorded TTFT - recorded prefill compute and transfer + the replay's (recomputed tokens
    at the P engine's observed prefill rate, pulled tokens at the observed transfer cost).  Then a
    recommendation (stderr with --format json/csv or --output): the threshold nearest the observed
    break-even, and the smallest TTL within 5 % of the best mean TTFT (or, with --budget-gib G, the
    best TTFT whose peak held on one D fits G GiB), with the numbers and the spans behind them.

    With --clickhouse URL (and --table) the spans come from an OTel Collector otel_traces table on
    a ClickHouse server or in chDB instead of a trace directory (docs/clickhouse.md).

    With --arms the rows are instead the four arms of kvtrace bench --arms, from this one recorded
    run: every recorded P request decided again with P's prefix cache off / on and bidirectional
    transfer off / on (vLLM's rules; P's local hit and D's offer as recorded where the run had
    them, else rebuilt from the session's previous turn), TTFT = recorded TTFT - P's recorded
    prefill and transfer + the arm's, priced by the run's calibration (kvtrace sim
    --calibrate-from's fit).  Table/CSV keys: arm, prefix_caching, bidirectional, recorded,
    requests, pulled, pulled_tokens, computed_tokens, ttft_mean_ms, ttft_turns_ge1_mean_ms,
    kv_gib_s, kv_peak_gib; JSON: {"recorded", "requests", "arms": [rows], "summary":
    {"this_deployment", "published_setup"}: ttft_off_ms, ttft_on_ms, saved_ms, gain, kv_gib_s,
    kv_peak_gib; "calibration"}.  The summary lines (what reverse transfer saved here, what it
    would show with P's cache off, the KV it held) follow the table, or go to stderr.

    Example:  kvtrace whatif --traces kvtrace-traces/bidir --ttl 30,120,480 --threshold 64,256
    """
    from kvtrace.analysis.whatif.replay import WhatIfError, recommend, recommendation_lines
    from kvtrace.analysis.whatif.replay import run as replay_all
    from kvtrace.errors import CLIError
    from kvtrace.store.clickhouse import ClickHouseError
    from kvtrace.store.reader import StoreError

    if args.arms:
        return _arms(args)
    if args.offer_margin is not None and args.offer_margin < 0:
        raise CLIError("--offer-margin must be >= 0")
    if args.budget_gib is not None and not args.budget_gib > 0:
        raise CLIError("--budget-gib must be > 0")
    try:
        con = source.open_store(args)
        rec, results = replay_all(con, args.ttl, args.threshold, args.offer_margin)
    except (StoreError, WhatIfError, ClickHouseError) as exc:
        raise CLIError(str(exc)) from None
    rows = [r.row for r in results]
    advice = "\n".join(recommendation_lines(rec, recommend(rec, results, args.budget_gib))) + "\n"
    text = render(args.format, rows)
    if args.format == "table" and not args.output:
        sys.stdout.write(text + "\n" + advice)
        return 0
    options.write_output(args.output, text, "whatif")
    sys.stderr.write(advice)
    return 0


def _arms(args) -> int:
    from kvtrace.analysis.calibrate import CalibrationError
    from kvtrace.analysis.whatif import arms
    from kvtrace.errors import CLIError
    from kvtrace.store.clickhouse import ClickHouseError
    from kvtrace.store.reader import StoreError

    try:
        result = arms.counterfactual(source.open_store(args))
    except (StoreError, arms.ArmsError, CalibrationError, ClickHouseError) as exc:
        raise CLIError(str(exc)) from None
    lines = "\n".join(result.lines()) + "\n"
    if args.format == "json":
        import json

        text = json.dumps(result.to_dict(), indent=1) + "\n"
    else:
        text = render(args.format, result.rows, arms.COLUMNS)
    if args.format == "table" and not args.output:
        sys.stdout.write(text + "\n" + lines)
        return 0
    options.write_output(args.output, text, "whatif")
    sys.stderr.write(lines)
    return 0


def render(fmt: str, rows: list[dict], columns=None) -> str:
    """The rows as an aligned table, a JSON array of objects or CSV (keys: ``columns``, default whatif.COLUMNS)."""
    from kvtrace.analysis.whatif.replay import COLUMNS

    COLUMNS = tuple(columns or COLUMNS)  # noqa: N806 - the keys of every row below

    if fmt == "json":
        import json

        return json.dumps([{k: r[k] for k in COLUMNS} for r in rows], indent=1) + "\n"
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows([{k: _csv(r[k]) for k in COLUMNS} for r in rows])
        return buf.getvalue()
    from kvtrace.analysis.report.text import md_table
    from kvtrace.analysis.whatif.summary import cell

    return md_table(list(COLUMNS), [[cell(k, r[k]) for k in COLUMNS] for r in rows]) + "\n"


def _csv(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else value
