"""Per-file partials of the per-span views the KV reuse, retention and per-instance questions read:
each immutable trace file's rows of those views written once beside it, read instead of extracting
them from the attribute maps again for every question.

The KV reuse page asks eight questions of a day; each read the day's spans through ``requests``,
``proxy_legs``, ``kv_decisions``, ``kv_transfers``, ``kv_retention``, ``engine_requests`` or
``continuity``, and most of each question's time went to decoding the day's attribute maps again
(docs/benchmarks.md, "Per-file partials of the KV views").  Most of those views select single spans
(no join, no aggregate), so a file's rows of the view are the view's SELECT over that file alone: a
*partial*, a small Parquet file of the view's typed columns, sorted by start.

- **Written** by :func:`kvtrace.store.scan_index.build_one` with the file's scan index and lookups
  (same directory, same key: they go stale and are swept with it), so whoever builds indexes builds
  them (``connect``, ``kvtrace compact``, the dashboard's keeper); writers pay nothing.
- **Read** by the views as :func:`bind` defines them: the partials of the files indexed (the scan's
  rule: every sidecar current), bounded and narrowed like the raw relation
  (:mod:`kvtrace.store.bounds`, :mod:`kvtrace.store.narrow`), and the view's own SQL over the raw
  rows of the other files, so an answer never depends on which files are indexed.
- **``requests``** names the substrate of its trace's engine spans: a join across spans and files.
  Its partial keeps each span's own substrate, and one more partial, every span's ``(trace_id,
  start_ns, substrate)`` where it has one, gives each trace's at query time, over the same bounds.
- **``continuity``** joins the spans it reads by request, trace and session: its partial holds those
  spans, one row each with the attributes it reads
  (:data:`kvtrace.store.views.continuity.BASE_SQL`), and the joins run at query time.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtrace.store import bounds, lookup, narrow
from kvtrace.store.sql import glob_escape
from kvtrace.store.views.continuity import BASE_SQL, CONTINUITY, continuity_sql
from kvtrace.store.views.raw import spans_sql
from kvtrace.store.views.spans import (
    ENGINE_REQUESTS,
    KV_DECISIONS,
    KV_RETENTION,
    KV_TRANSFERS,
    NO_TRACE_SUBSTRATE,
    PROXY_LEGS,
    REQUESTS,
    requests_select,
    trace_substrate,
)


@dataclass(frozen=True)
class Partial:
    key: str
    """Short name: the file suffix (``.kvp_<key>``) and the cursor's list variable."""
    view: str
    """The view it holds rows of ('' for the trace substrates)."""
    select: str
    """Its rows, a SELECT over a relation named ``spans`` (one file's)."""

    @property
    def suffix(self) -> str:
        return f".kvp_{self.key}"

    @property
    def variable(self) -> str:
        return f"kvtrace_part_{self.key}"


_PER_SPAN = {"leg": PROXY_LEGS, "dec": KV_DECISIONS, "xfer": KV_TRANSFERS, "ret": KV_RETENTION, "eng": ENGINE_REQUESTS}
for _view in _PER_SPAN.values():  # a partial holds a view's rows only if each row is one span's own
    assert _view.source.startswith("FROM spans WHERE") and "JOIN" not in _view.source, _view.name
    assert "start_ns" in _view.column_names, _view.name

SUBSTRATES = Partial("sub", "", "SELECT trace_id, start_ns, substrate FROM spans WHERE substrate IS NOT NULL")
PARTIALS: tuple[Partial, ...] = (
    Partial("req", REQUESTS.name, requests_select(NO_TRACE_SUBSTRATE)),
    *(Partial(key, v.name, v.select) for key, v in _PER_SPAN.items()),
    Partial("cont", CONTINUITY.name, BASE_SQL),
    SUBSTRATES,
)
SUFFIXES = tuple(p.suffix for p in PARTIALS)
VIEWS = tuple(p.view for p in PARTIALS if p.view)
"""The views :func:`bind` redefines."""
VERSION_TEXT = "".join(p.key + p.select for p in PARTIALS)
"""What the partials' rows depend on (part of the index key: :data:`kvtrace.store.scan_index.VERSION`)."""
assert len(set(SUFFIXES)) == len(SUFFIXES)


def copy_sql(partial: Partial, target: str) -> str:
    """``COPY`` of one file's ``partial`` to ``target`` (a quoted path), on a connection whose
    ``spans`` view reads that file only."""
    return f"COPY ({partial.select} ORDER BY start_ns) TO {target} {lookup.COPY_OPTIONS}"


def complete(sidecars: dict[str, str]) -> bool:
    """Whether a file's current sidecars (suffix -> path) include every partial."""
    return all(suffix in sidecars for suffix in SUFFIXES)


def entries(indexed: dict[str, dict[str, str]]) -> list[tuple[str, str, str]]:
    """The narrowing entries (:func:`kvtrace.store.narrow.record`) of the partials of ``indexed``
    (trace file -> its current sidecars)."""
    return [(p.variable, glob_escape(have[p.suffix]), path) for path, have in indexed.items() for p in PARTIALS]


def bind(con, indexed: dict[str, dict[str, str]], rest_raw: str | None) -> None:
    """(Re)define :data:`VIEWS` on ``con`` over the partials of ``indexed`` (trace file -> its current
    sidecars, non-empty) and, when some files have none, the views' own SQL over ``rest_raw`` (the
    relation of those files' raw rows, bounded)."""
    rest = None if rest_raw is None else f"WITH spans AS ({spans_sql(rest_raw)}) "
    params = {p.key: [glob_escape(have[p.suffix]) for have in indexed.values()] for p in PARTIALS}

    def read(p: Partial) -> str:
        listed = narrow.listed(p.variable, f"${p.key}")
        return f"SELECT * FROM read_parquet({listed}, hive_partitioning = false){bounds.INDEX_FILTER}"

    for p in PARTIALS:
        if not p.view:
            continue
        sql = read(p) if rest is None else f"{read(p)}\nUNION ALL\n({rest}{p.select})"
        if p.view == REQUESTS.name:
            sql = _requests(sql, read(SUBSTRATES), rest)
        elif p.view == CONTINUITY.name:
            sql = continuity_sql(sql)
        con.sql(sql, params={k: v for k, v in params.items() if f"${k}" in sql}).create_view(p.view, replace=True)


# the view's own substrate column (each span's, else its trace's), over ``p`` and ``t`` below
_SUBSTRATE = next(c for c in REQUESTS.columns if c.name == "substrate").selected()


def _requests(rows: str, substrates: str, rest: str | None) -> str:
    """``requests`` from its rows with their own substrate and the trace substrates' rows."""
    if rest is not None:
        substrates += f"\nUNION ALL\n({rest}{SUBSTRATES.select})"
    return f"""
WITH p AS ({rows})
SELECT p.* REPLACE ({_SUBSTRATE})
FROM p LEFT JOIN {trace_substrate(f"({substrates})")} t ON t.trace_id = p.trace_id
"""
