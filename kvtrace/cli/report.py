"""``kvtrace report``: the key tables and plots of a trace directory as Markdown or HTML."""

from __future__ import annotations

import os

from kvtrace.cli import options
from kvtrace.store import source


def add_arguments(parser) -> None:
    options.add_source_arguments(parser)
    parser.add_argument("--format", choices=("md", "html"), default="md", help="output format (default md)")
    parser.add_argument("--output", "-o", help="file to write (default: stdout; Markdown to stdout has no plots)")
    parser.add_argument("--compare", help="a baseline run's trace directory: adds the per-turn comparison against it")
    parser.add_argument("--no-plots", action="store_true", help="tables only")


def run(args) -> int:
    """Write a static report of one run's trace directory: session breakdown, KV reuse, retention,
    a what-if replay of other retention TTLs and recompute thresholds, latency by turn index (and,
    with --compare DIR2, the per-turn comparison against a baseline run: ratios, bootstrap
    intervals and verdicts).  A directory holding several runs is refused, unless they are the
    runs of `kvtrace bench --arms` (P prefix cache off/on x bidirectional off/on, per preset): then
    the report is their table per preset, the published gain beside the incremental gain; for the
    prefix-N points of `kvtrace bench --arms --sweep`, that table per preset over the points.

    --format md writes Markdown, with the plots as PNG files beside --output (FILE-<plot>.png);
    --format html writes one self-contained page with the plots embedded.  Plots need matplotlib:
    pip install 'kvtrace[report]'.  With --clickhouse URL [--table NAME] the report reads an OTel
    Collector otel_traces table on ClickHouse instead (docs/clickhouse.md); --compare is still a
    trace directory.
    """
    from kvtrace.analysis.report import document as report
    from kvtrace.errors import CLIError
    from kvtrace.store.clickhouse import ClickHouseError
    from kvtrace.store.reader import StoreError, connect

    try:
        con = source.open_store(args)
        base = connect(args.compare) if args.compare else None
    except StoreError as exc:
        arms = None if args.compare or source.clickhouse_url(args) else _arms(source.describe(args))
        if arms is None:
            raise CLIError(str(exc)) from None
        options.write_output(args.output, arms if args.format == "md" else report.to_html([("md", arms)], {}))
        return 0
    plots = not args.no_plots and (args.format == "html" or bool(args.output))
    if plots and _missing("matplotlib"):
        raise CLIError("plots need matplotlib: pip install 'kvtrace[report]' (or pass --no-plots)")
    try:
        doc, images = report.build(con, source.describe(args), compare_con=base, compare_dir=args.compare, plots=plots)
    except ClickHouseError as exc:
        raise CLIError(str(exc)) from None
    if args.format == "html":
        options.write_output(args.output, report.to_html(doc, images))
        return 0
    links = {}
    if args.output:
        stem = os.path.splitext(args.output)[0]
        for name, png in images.items():
            path = f"{stem}-{name}.png"
            with open(path, "wb") as f:
                f.write(png)
            links[name] = os.path.basename(path)
    options.write_output(args.output, report.to_markdown(doc, links))
    return 0


def _arms(directory: str) -> str | None:
    """The four-arm report of a directory holding the runs of ``kvtrace bench --arms`` (or the
    points of ``--arms --sweep``), else None."""
    from kvtrace.analysis import arms_table as arms

    try:
        tables = arms.tables(arms.from_directory(directory))
    except (ValueError, OSError):
        try:
            points = arms.sweep_from_directory(directory)
        except (ValueError, OSError):
            return None
        return "# kvtrace report: the four arms per prefix length\n\n" + arms.sweep_markdown(points)
    return "# kvtrace report: published vs production configuration\n\n" + arms.markdown(tables)


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None
