"""``kvtrace doctor``: what the session breakdown understood of a trace directory's agent spans."""

from __future__ import annotations

from kvtrace.cli import options
from kvtrace.store import source


def add_arguments(parser) -> None:
    options.add_source_arguments(parser)
    parser.add_argument("--limit", type=int, default=50, help="rows per list (default 50)")


def run(args) -> int:
    """List what the breakdown saw of the agent spans in the traces and what it ignored: per
    convention (OTel GenAI, OpenInference, OpenLLMetry, kvtrace's own) the spans placed and their
    role, the spans seen but not placed (a convention's attribute with a value kvtrace does not
    map: their sessions are flagged in `unplaced_spans`), the spans in no session, how each LLM
    call found its proxy request (trace, session_time, none) and the flagged sessions.  Exits 1
    when something was ignored.  The mapping is in docs/semconv.md ("Agent spans by convention").
    """
    from kvtrace.analysis.agents import doctor
    from kvtrace.errors import CLIError
    from kvtrace.store.reader import StoreError

    try:
        store = source.open_store(args)
        sections = doctor(store, limit=args.limit)
    except StoreError as exc:
        raise CLIError(str(exc)) from None
    ignored = 0
    for key, title, rows in sections:
        print(f"## {title}")
        print(_table(rows) if rows else "(none)")
        print()
        if key in ("unplaced", "no_session"):
            ignored += sum(r["spans"] for r in rows)
    print(f"{ignored} agent-side span(s) ignored" if ignored else "every agent-side span was placed")
    note = _lookup_note(args, store)
    if note:
        print(note)
    return 1 if ignored else 0


def _lookup_note(args, store) -> str | None:
    """On ClickHouse without kvtrace's current materialized tables: one line saying how to add them."""
    if not getattr(store, "is_clickhouse", False):
        return None
    from kvtrace.store.clickhouse import mviews
    from kvtrace.store.clickhouse.backend import redact

    return mviews.note(store, redact(source.clickhouse_url(args) or "URL"))


def _table(rows: list[dict]) -> str:
    cols = list(rows[0])
    cells = [["" if r[c] is None else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)
