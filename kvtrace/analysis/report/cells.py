"""What one value looks like in a table cell, and the Markdown pipe table made of such cells.

Split from :mod:`kvtrace.analysis.report.text` (which re-exports every public name here) so the primitives
stand apart from the tables of analysis results: the number formats (:func:`ms`, :func:`num`,
:func:`ratio`, :func:`gib`), the Markdown escaping of text a client chose (:func:`md_escape`,
:func:`md_unescape`) and :func:`md_table`.  It imports nothing from the analysis queries.
"""

from __future__ import annotations

import re

from kvtrace.store.units import GIB


def ms(value) -> str:
    return "–" if value is None else f"{value:,.1f}"


def num(value) -> str:
    return "–" if value is None else f"{value:,}"


def ratio(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def gib(value) -> str:
    return "–" if value is None else f"{value / GIB:,.2f}"


MD_SPECIAL = re.compile(r"[\\|`]|\[(?=[^\]\n]*\]\()|\](?=\()|<(?=[A-Za-z/!?])|&(?=[A-Za-z#])")
"""What a Markdown cell backslash-escapes: ``|`` (a cell's end), ``[`` and ``]`` where they would
make a link (``[text](url)``; a bare ``[1.13-1.81]`` interval stays as it is), backticks
(code spans), ``\\`` itself, and ``<`` / ``&`` where they would open an HTML tag, an autolink
or an entity (``< 1,000`` and ``a & b`` stay as they are: they read well on a terminal)."""
MD_ESCAPED = re.compile(r"\\([\\|<&\[\]`])")


def md_escape(value: str) -> str:
    """``value`` (a session id, a service name: text a client chose) as Markdown text that renders
    as itself and cannot end a table cell, break its line or open HTML: :data:`MD_SPECIAL`
    characters backslash-escaped, control and other non-printing characters as ``\\xNN`` /
    ``\\uNNNN`` (a newline would end the table row)."""
    text = MD_SPECIAL.sub(lambda m: "\\" + m.group(0), str(value))
    return "".join(c if c.isprintable() else _visible(c) for c in text)


def md_unescape(value: str) -> str:
    """:func:`md_escape`'s backslash escapes undone (the HTML report escapes for HTML instead)."""
    return MD_ESCAPED.sub(r"\1", value)


def _visible(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def md_table(columns: list[str], rows: list[list[str]]) -> str:
    """A Markdown pipe table, columns padded so it also reads well on a terminal; every cell is
    plain text, often chosen by clients, and escaped (:func:`md_escape`)."""
    columns = [md_escape(c) for c in columns]
    rows = [[md_escape(c) for c in r] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(columns), sep, *(line(r) for r in rows)])
