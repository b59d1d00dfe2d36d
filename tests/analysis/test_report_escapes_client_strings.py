"""Session ids are chosen by clients: in ``kvtrace report``'s Markdown a newline, ``|``, HTML or
link syntax in one neither breaks the table nor injects markup, and the HTML report shows each id
exactly as recorded, escaped once."""

from __future__ import annotations

import html
import re

import pytest

from kvtrace.analysis.report import text
from kvtrace.analysis.report.document import to_html
from kvtrace.cli import main
from kvtrace.testing.synth import SpanBuilder

HOSTILE = {
    # recorded id -> how the Markdown table cell spells it
    "evil\n| forged | row |": r"evil\x0a\| forged \| row \|",
    "a|b": r"a\|b",
    "<img src=x onerror=alert(1)>": r"\<img src=x onerror=alert(1)>",
    "</td><script>&amp;": r"\</td>\<script>\&amp;",
    "< 1 & 2 >": "< 1 & 2 >",  # no tag, no entity: left as it reads
    "[click](http://example.invalid)": r"\[click\](http://example.invalid)",
    "tick`code`\\": r"tick\`code\`\\",
    "nul\x00bell\x07": r"nul\x00bell\x07",
}
BOUNDARY = re.compile(r"(?<!\\)\|")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    b = SpanBuilder()
    for i, sid in enumerate(HOSTILE):
        start = i * 10_000.0
        sess = b.session(sid, start, start + 5_000)
        b.turn(sid, 0, start + 10, start + 4_000, parent=sess)
    b.write(root)
    return root


def _session_rows(markdown: str) -> dict[str, list[str]]:
    """The breakdown table's data rows (from the line after its header), keyed by first cell."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| session "))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in BOUNDARY.split(line.strip()[1:-1])]
        rows[cells[0]] = cells
    return rows


def test_md_escape_keeps_every_id_on_one_cell_of_one_line():
    for sid, cell in HOSTILE.items():
        assert text.md_escape(sid) == cell
        assert "\n" not in cell and not BOUNDARY.search(cell)


def test_the_markdown_report_keeps_its_table_whole(store, tmp_path):
    out = tmp_path / "r.md"
    assert main(["report", "--traces", str(store), "--no-plots", "-o", str(out)]) == 0
    markdown = out.read_text()
    rows = _session_rows(markdown)
    assert sorted(rows) == sorted(HOSTILE.values())
    header = next(line for line in markdown.splitlines() if line.startswith("| session "))
    assert {len(r) for r in rows.values()} == {len(BOUNDARY.split(header.strip()[1:-1]))}
    # no raw HTML, no forged row, no link: every such character reaches the reader escaped
    assert not re.search(r"(?<!\\)(<[A-Za-z/!?]|&[A-Za-z#]|\[[^\]\n]*(?<!\\)\]\()", markdown)
    assert "| forged |" not in markdown


def test_the_html_report_shows_each_id_as_recorded(store, tmp_path):
    out = tmp_path / "r.html"
    assert main(["report", "--traces", str(store), "--no-plots", "--format", "html", "-o", str(out)]) == 0
    page = out.read_text()
    cells = re.findall(r"<tr><td>(.*?)</td>", page)
    shown = {html.unescape(c) for c in cells}
    for cell in HOSTILE.values():
        visible = text.md_unescape(cell)  # control characters stay visible as \xNN
        assert visible in shown, visible
        assert f"<td>{html.escape(visible)}</td>" in page
    assert "<img" not in page and "<script" not in page


def test_html_inline_text_is_unescaped_from_markdown_then_escaped_for_html():
    doc = [("md", "- services: " + ", ".join(map(text.md_escape, ["<b>svc</b>", "a&b"])) + " in `dir<x>`")]
    assert to_html(doc, {}).split("<body>")[1].split("</body>")[0] == (
        "<li>services: &lt;b&gt;svc&lt;/b&gt;, a&amp;b in <code>dir&lt;x&gt;</code></li>"
    )
