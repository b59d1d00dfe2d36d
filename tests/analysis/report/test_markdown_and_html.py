"""``kvtrace report``: Markdown with PNGs beside it, self-contained HTML, clear errors."""

from __future__ import annotations

import base64
import re

import pytest

from kvtrace.analysis import reuse, sessions
from kvtrace.cli import main
from kvtrace.store import connect
from kvtrace.testing.synth import sample_store

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    sample_store(root / "bidir")
    sample_store(root / "baseline", pull=False)
    return root


def _cell(md: str, label: str) -> str:
    m = re.search(rf"^\| {re.escape(label)} +\| ([^|]+?) +\|", md, re.M)
    assert m, label
    return m.group(1)


def test_markdown_with_plots_and_comparison(runs, tmp_path, capsys):
    out = tmp_path / "r.md"
    assert (
        main(["report", "--traces", str(runs / "bidir"), "--output", str(out), "--compare", str(runs / "baseline")])
        == 0
    )
    md = out.read_text()
    plots = sorted(p.name for p in tmp_path.glob("r-*.png"))
    assert plots == ["r-breakdown.png", "r-retention.png", "r-tokens_by_source.png", "r-ttft_by_turn.png"]
    assert all((tmp_path / p).read_bytes().startswith(PNG) for p in plots)
    for p in plots:
        assert f"]({p})" in md
    con = connect(runs / "bidir")
    tot = sessions.totals(con)
    assert _cell(md, "generation") == f"{tot['generation_ms']:,.1f}"
    assert _cell(md, "pulled tokens") == f"{reuse.summary(con)['pulled_tokens']:,}"
    assert "## Comparison with" in md
    assert "wrote" in capsys.readouterr().err
    # the what-if section: the recommendation and the recorded setting's row (TTL 480 s, threshold 64)
    assert "## What-if: retention TTL and recompute threshold" in md and "\nRecommendation: decoder_kv_blocks_ttl" in md
    assert re.search(r"^\| 480 +\| 64 +\|.*\| yes +\|$", md, re.M)


def test_html_embeds_plots(runs, tmp_path):
    out = tmp_path / "r.html"
    assert main(["report", "--traces", str(runs / "bidir"), "--format", "html", "-o", str(out)]) == 0
    page = out.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 4 and all(base64.b64decode(i).startswith(PNG) for i in images)
    # 9 tables: the four arms of the recorded traffic is one of them
    assert page.count("<table>") == 9 and "<h2>KV reuse</h2>" in page
    assert "<h2>The four arms of this traffic</h2>" in page


def test_stdout_markdown_has_tables_only(runs, capsys):
    assert main(["report", "--traces", str(runs / "bidir")]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# kvtrace report") and "![" not in md
    assert "| D engine" in md


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--traces", "/nonexistent/kvtrace"], "does not exist"),
        (["--traces", "{empty}"], "no trace files"),
        (["--traces", "{bidir}", "-o", "/nonexistent/dir/r.md", "--no-plots"], "cannot write"),
    ],
)
def test_errors_are_one_line(runs, tmp_path, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    argv = [a.format(empty=tmp_path / "empty", bidir=runs / "bidir") for a in argv]
    assert main(["report", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_html_header_renders_code_not_backticks(runs, tmp_path):
    out = tmp_path / "r.html"
    assert main(["report", "--traces", str(runs / "bidir"), "--format", "html", "-o", str(out), "--no-plots"]) == 0
    page = out.read_text()
    assert f"<li>traces: <code>{runs / 'bidir'}</code></li>" in page
    text_only = re.sub(r"<[^>]+>", "", page.split("<body>", 1)[1])
    assert "`" not in text_only


def test_every_time_column_says_wall_or_model(runs, capsys):
    assert main(["report", "--traces", str(runs / "bidir"), "--compare", str(runs / "baseline")]) == 0
    md = capsys.readouterr().out
    headers = [c.strip() for line in md.splitlines() if line.startswith("| ") for c in line.strip("|").split("|")]
    timed = [h for h in headers if re.search(r"\bms\b|\(s\)|\bs\b", h)]
    assert timed and [h for h in timed if "wall" not in h and "model" not in h] == []
    assert "wall ms" in md.split("## Where agent time goes", 1)[1].split("\n\n")[2]  # the totals table


def test_plots_use_the_shared_palette(runs):
    """The report's stacked bars carry the colours the dashboard uses (kvtrace.analysis.palette)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from kvtrace.analysis import palette
    from kvtrace.analysis.report import document as report

    con = connect(runs / "bidir")
    for draw, parts in ((report._breakdown, palette.PARTS), (report._tokens, palette.SOURCES)):
        fig, ax = plt.subplots()
        try:
            assert draw(con, ax)
            legend = {
                t.get_text(): to_hex(h.patches[0].get_facecolor())
                for t, h in zip(ax.get_legend().get_texts(), ax.get_legend_handles_labels()[0], strict=True)
            }
        finally:
            plt.close(fig)
        assert legend == {label: colour for label, colour in parts.values()}


def test_first_run_on_a_machine_logs_no_font_cache_line(runs, tmp_path):
    """A fresh matplotlib config directory makes matplotlib build its font cache (what a first
    run on a machine does); the report must not pass its INFO line on."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvtrace.cli",
            "report",
            "--traces",
            str(runs / "bidir"),
            "--format",
            "html",
            "-o",
            str(tmp_path / "r.html"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "mpl").glob("fontlist-*.json")), "matplotlib did not build its cache here"
    assert proc.stderr.splitlines() == [f"kvtrace report: wrote {tmp_path / 'r.html'}"]
