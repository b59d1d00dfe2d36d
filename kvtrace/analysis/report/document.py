"""The static report behind ``kvtrace report``: key tables and a few PNG plots (matplotlib).

:func:`build` returns the Markdown text and the plots (name → PNG bytes); :func:`to_html`
renders the same document as one self-contained HTML page with the PNGs embedded as base64.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import logging
import re

from kvtrace import semconv as sc
from kvtrace.analysis import compare, instances, latency, palette, retention, reuse, sessions
from kvtrace.analysis.report import text
from kvtrace.analysis.whatif import summary as whatif_summary
from kvtrace.store.units import GIB
from kvtrace.store.views.breakdown import PRECEDENCE

TIME_NOTE = (
    "Times are wall-clock as recorded (wall ms). Traces of `kvtrace sim` or `kvtrace demo` replayed with "
    "`--time-scale S` ran S times faster than the simulated GPUs: multiply by S for model time."
)
VIRTUAL_TIME_NOTE = (
    "Times are simulated: this run is on the virtual clock (`kvtrace bench --clock virtual`), so every "
    "time below, those labelled wall included, is model time on the simulated GPUs, and so are the "
    "timestamps above; no host load is in them."
)
MIXED_TIME_NOTE = (
    "This directory holds runs on the virtual clock (simulated times) and on the wall clock (wall ms as "
    "recorded): their times are not on one clock."
)


def time_note(clocks: list[str]) -> str:
    """What the report's times are, from the clocks the simulated workers ran on
    (:func:`kvtrace.analysis.sessions.clocks`)."""
    if sc.CLOCK_VIRTUAL not in clocks:
        return TIME_NOTE
    return VIRTUAL_TIME_NOTE if clocks == [sc.CLOCK_VIRTUAL] else MIXED_TIME_NOTE


def build(
    con, directory: str, *, compare_con=None, compare_dir: str | None = None, plots: bool = True
) -> tuple[list[tuple[str, str]], dict[str, bytes]]:
    """(sections as (kind, content) with kind ``md`` or ``plot``, plots name → PNG bytes)."""
    facets = sessions.facets(con)
    when = "–"
    if facets.get("start_ns") is not None:
        when = f"{_utc(facets['start_ns'])} – {_utc(facets['end_ns'])} UTC"
    doc: list[tuple[str, str]] = [
        (
            "md",
            "\n".join(
                [
                    "# kvtrace report",
                    "",
                    f"- traces: `{directory}`",
                    f"- spans: {facets['spans']:,}",
                    f"- time: {when}",
                    f"- services: {', '.join(map(text.md_escape, facets['services'])) or '–'}",
                    f"- substrates: {', '.join(map(text.md_escape, facets['substrates'])) or '–'}",
                    "",
                    time_note(sessions.clocks(con, tuple(facets["substrates"]))),
                ]
            ),
        )
    ]
    doc.append(
        (
            "md",
            "## Where agent time goes\n\nEach session's wall time split into five parts that sum to "
            f"it; overlaps counted once by precedence {' > '.join(PRECEDENCE)}; app work includes "
            "unattributed time; user pauses are the spans an agent marks as waiting for its user.\n\n"
            + text.md_table(*text.breakdown_totals_rows(con))
            + "\n\n"
            + text.unplaced_warning(con, directory)
            + "Longest sessions (wall ms):\n\n"
            + text.md_table(*text.breakdown_rows(con, limit=20)),
        )
    )
    doc.append(("plot", "breakdown"))
    doc.append(
        (
            "md",
            "## KV reuse\n\n"
            + _verification(con)
            + text.md_table(*text.reuse_rows(con))
            + "\n\n"
            + text.md_table(*text.decision_mix_rows(con))
            + "\n\nP's prompt tokens by source:\n\n"
            + text.md_table(*text.tokens_by_source_rows(con)),
        )
    )
    doc.append(("plot", "tokens_by_source"))
    doc += _instances(con)
    doc.append(
        (
            "md",
            "## Retention on decode workers\n\n"
            + text.md_table(*text.retention_rows(con))
            + f"\n\n{text.NEVER_READ_NOTE[0].upper()}{text.NEVER_READ_NOTE[1:]}.",
        )
    )
    doc.append(("plot", "retention"))
    doc.append(("md", whatif_summary.report_section(con)))
    doc.append(("md", whatif_summary.arms_section(con)))
    doc.append(("md", "## Latency by turn index\n\n" + text.md_table(*text.latency_rows(con))))
    doc.append(("plot", "ttft_by_turn"))
    if compare_con is not None:
        rows = compare.compare_runs(compare_con, con)
        doc.append(
            (
                "md",
                f"## Comparison with `{compare_dir}` (baseline)\n\nPer metric and turn index: mean of "
                "each run, ratio = this run / baseline (below 1 = this run is faster), its bootstrap 95% "
                "interval, and the verdict (faster / slower when the interval excludes 1; "
                "`kvtrace.analysis.compare`).\n\n" + text.md_table(*text.compare_rows(rows)),
            )
        )
    images = render_plots(con) if plots else {}
    return [d for d in doc if d[0] == "md" or d[1] in images], images


def _verification(con) -> str:
    """Mismatched offers first: P loaded (or, under verify=enforce, refused) KV of other tokens."""
    cols, rows = text.verification_rows(con)
    if not rows:
        return ""
    out = "Offered KV checked against the prompt (D's digest):\n\n" + text.md_table(cols, rows) + "\n\n"
    mcols, mrows = text.mismatch_rows(con)
    if mrows:
        out += "Mismatched offers (D's blocks hold other tokens):\n\n" + text.md_table(mcols, mrows) + "\n\n"
    return out


def to_markdown(doc: list[tuple[str, str]], image_links: dict[str, str]) -> str:
    parts = [c if kind == "md" else f"![{c}]({image_links[c]})" for kind, c in doc]
    return "\n\n".join(parts) + "\n"


def to_html(doc: list[tuple[str, str]], images: dict[str, bytes]) -> str:
    """One HTML page; Markdown tables become <table>s, plots inline PNGs."""
    body = []
    for kind, content in doc:
        if kind == "plot":
            data = base64.b64encode(images[content]).decode("ascii")
            body.append(f'<img alt="{content}" src="data:image/png;base64,{data}">')
        else:
            body.append(_md_to_html(content))
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;"
        "text-align:right}td:first-child,th:first-child{text-align:left}img{max-width:100%}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>kvtrace report</title><style>{style}"
        f"</style></head><body>{''.join(body)}</body></html>\n"
    )


def _inline(md: str) -> str:
    """One line of Markdown text as HTML: `code` spans as <code>, the rest with its Markdown
    escapes (:func:`~kvtrace.analysis.report.text.md_escape`) undone; all of it HTML-escaped."""
    parts = re.split(r"(?<!\\)`([^`]+)`", md)  # odd items: code spans' contents
    return "".join(
        f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(text.md_unescape(p)) for i, p in enumerate(parts)
    )


_CELL_END = re.compile(r"(?<!\\)\|")
"""A table row's cell boundary: a ``|`` that :func:`~kvtrace.analysis.report.text.md_escape` did
not escape (a boundary is always preceded by a space or starts the line)."""


def _md_to_html(md: str) -> str:
    out, table = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            table.append([c.strip() for c in _CELL_END.split(line.strip()[1:-1])])
            continue
        if table:
            head, rows = table[0], [r for r in table[2:]]
            out.append(
                "<table><tr>"
                + "".join(f"<th>{_inline(c)}</th>" for c in head)
                + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows)
                + "</table>"
            )
            table = []
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("- "):
            out.append(f"<li>{_inline(line[2:])}</li>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    return "\n".join(out)


def render_plots(con) -> dict[str, bytes]:
    """The plots that have data, as PNG bytes."""
    # matplotlib logs "generated new fontManager" at INFO the first time it runs on a machine
    logging.getLogger("matplotlib.font_manager").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = {}
    for name, draw in (
        ("breakdown", _breakdown),
        ("tokens_by_source", _tokens),
        ("retention", _retention),
        ("ttft_by_turn", _ttft),
    ):
        fig, ax = plt.subplots(figsize=(9, 4))
        try:
            if draw(con, ax):
                fig.tight_layout()
                buf = io.BytesIO()
                fig.savefig(buf, format="png", dpi=90)
                out[name] = buf.getvalue()
        finally:
            plt.close(fig)
    return out


def _breakdown(con, ax) -> bool:
    rows = sessions.breakdown(con, limit=20).to_pylist()
    if not rows:
        return False
    labels = [r["session_id"] for r in rows][::-1]
    left = [0.0] * len(rows)
    for col, (name, colour) in palette.PARTS.items():
        vals = [r[col] for r in rows][::-1]
        ax.barh(labels, vals, left=left, label=name, color=colour)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlabel("wall ms")
    ax.set_title("Where agent time goes (longest sessions)")
    ax.legend(fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    return True


def _tokens(con, ax) -> bool:
    rows = [r for r in reuse.tokens_by_source(con).to_pylist() if r["turn"] is not None]
    if not rows:
        return False
    turns = [r["turn"] for r in rows]
    bottom = [0] * len(rows)
    for key, (name, colour) in palette.SOURCES.items():
        vals = [r[key] for r in rows]
        ax.bar(turns, vals, bottom=bottom, label=name, color=colour)
        bottom = [a + b for a, b in zip(bottom, vals, strict=True)]
    ax.set_xlabel("turn index")
    ax.set_ylabel("tokens")
    ax.set_title("P's prompt tokens by source")
    ax.legend(fontsize=8)
    return True


def _retention(con, ax) -> bool:
    rows = retention.series(con, max_points=800).to_pylist()
    if not rows:
        return False
    t0 = min(r["t"] for r in rows)
    for engine in sorted({r["engine_id"] for r in rows}, key=str):
        pts = [r for r in rows if r["engine_id"] == engine]
        ax.step(
            [(r["t"] - t0) / 1e9 for r in pts], [r["bytes_held"] / GIB for r in pts], where="post", label=str(engine)
        )
    ax.set_xlabel("wall s since the first retention")
    ax.set_ylabel("GiB held")
    ax.set_title("KV held on decode workers")
    ax.legend(fontsize=8)
    return True


def _ttft(con, ax) -> bool:
    rows = [r for r in latency.by_turn(con).to_pylist() if r["ttft_p50_ms"] is not None]
    if not rows:
        return False
    ax.plot([r["turn"] for r in rows], [r["ttft_p50_ms"] for r in rows], marker="o", label="TTFT p50")
    ax.plot([r["turn"] for r in rows], [r["ttft_p90_ms"] for r in rows], marker="o", label="TTFT p90")
    ax.set_xlabel("turn index")
    ax.set_ylabel("wall ms")
    ax.set_title("Time to first token by turn index")
    ax.legend(fontsize=8)
    return True


def _utc(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _instances(con) -> list[tuple[str, str]]:
    """A fleet's reuse per instance (nothing for one P and one D): where routing sent the turns, why,
    and what each instance reused itself (P: D's blocks pulled; D: P's, and its own prefix cache)."""
    found = instances.per_instance(con).to_pylist()
    if not instances.is_fleet(found):
        return []
    head = ["role", "endpoint", "requests", "routed by", "pulls", "local hit tokens", "pulled tokens"]
    head += ["recomputed tokens", "mean TTFT (ms)", "legs failed / sent", "ms in failed legs"]
    body = []
    for r in found:
        why = ", ".join(f"{x} {r[x]:,}" for x in sc.ROUTE_REASONS if r[x]) or "–"
        body.append(
            [r["role"], text.md_escape(r["endpoint"]), text.num(r["requests"]), why, text.num(r["pulled"])]
            + [text.num(r["local_hit_tokens"]), text.num(r["pulled_tokens"]), text.num(r["recomputed_tokens"])]
            + [text.ms(r["mean_ttft_ms"]), _failed_legs(r), text.ms(r["failed_leg_ms"])]
        )
    return [
        (
            "md",
            "## Reuse per instance\n\nThe proxy's routing over the fleet (`requests`: each turn's P and D and "
            "why), each instance's own decisions (P's pulls from D, D's from P; local hits in its own "
            "prefix cache) and the proxy's legs to it that failed (`proxy_legs`; unreachable: the worker "
            "never got the request, and the leg went on to another worker of its role):\n\n"
            + text.md_table(head, body),
        )
    ]


def _failed_legs(r: dict) -> str:
    """``failed / sent`` legs, with how many never reached the worker; – where the traces do not name
    the legs' workers."""
    if r["legs"] is None:
        return "–"
    cell = f"{r['failed_legs']:,} / {r['legs']:,}"
    return cell + (f" ({r['unreachable_legs']:,} unreachable)" if r["unreachable_legs"] else "")
