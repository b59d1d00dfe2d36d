"""What a view is: its name, what it shows, its columns (name, DuckDB type, meaning, values) and SQL.

:class:`View` and :class:`Column` are the registry's entries; the modules of this package define
the views, :mod:`kvtrace.store.views` lists them in creation order, :mod:`kvtrace.store.reader`
creates them on every connection and :mod:`.docs` writes docs/query.md from them.
``tests/store/test_views.py`` checks every declared column (name, order and type) against what
DuckDB makes of the SQL, and every documented value against rows of a store.

Derived columns that several views share (:data:`COMMON`) have one meaning everywhere.  Their
enumerated values are spelled as stored: ``kind`` and ``status_code`` carry the raw ``SpanKind`` /
``StatusCode`` strings (``SPAN_KIND_SERVER``, ``STATUS_CODE_ERROR``), the spelling of the OTel
Collector ClickHouse exporter, so a filter reads the same on the raw and the derived column and in
ClickHouse.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvtrace import semconv as sc
from kvtrace.store.schema import SPAN_KIND_UNSPECIFIED, SPAN_KINDS, STATUS_CODES
from kvtrace.store.sql import ident

VARCHAR, BIGINT, INTEGER, DOUBLE, BOOLEAN = "VARCHAR", "BIGINT", "INTEGER", "DOUBLE", "BOOLEAN"
TIMESTAMPTZ = "TIMESTAMP WITH TIME ZONE"

SPAN_KIND_VALUES = (*SPAN_KINDS.values(), SPAN_KIND_UNSPECIFIED)
STATUS_CODE_VALUES = tuple(STATUS_CODES.values())


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    """The DuckDB type, as ``DESCRIBE`` prints it."""
    meaning: str
    values: tuple[str, ...] = ()
    """Every value the column can hold, for enumerated columns (besides NULL)."""
    sql: str = field(default="", compare=False)
    """Its expression in a view declared with ``source`` (``""``: the source's column of that name);
    not part of the column's contract (a shared column computed another way is still that column)."""

    def selected(self) -> str:
        return f"{self.sql} AS {self.name}" if self.sql else self.name


@dataclass(frozen=True)
class View:
    name: str
    description: str
    columns: tuple[Column, ...]
    select: str = ""
    """The view's SELECT (it may start with a WITH); derived from the columns when ``source`` is given."""
    helper: bool = False
    """Internal building block of other views (``kvtrace_*``); documented briefly, may change."""
    source: str = ""
    """``FROM ... [WHERE ...]``: the view selects its columns (each :attr:`Column.sql`) from it, so
    the column list is written once."""

    def __post_init__(self) -> None:
        if bool(self.select) == bool(self.source):
            raise ValueError(f"view {self.name}: give either select or source")
        if self.source:
            listed = ", ".join(c.selected() for c in self.columns)
            object.__setattr__(self, "select", f"SELECT {listed}\n{self.source.strip()}")

    def create(self) -> str:
        return f"CREATE OR REPLACE VIEW {ident(self.name)} AS\n{self.select.strip()}\n"

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


COMMON: dict[str, Column] = {
    c.name: c
    for c in (
        Column("trace_id", VARCHAR, "32 hex trace id"),
        Column("span_id", VARCHAR, "16 hex span id"),
        Column("parent_span_id", VARCHAR, "parent's span id, `''` for roots"),
        Column("request_id", VARCHAR, f"`{sc.GEN_AI_REQUEST_ID}` (the X-Request-Id shared by proxy, P and D)"),
        Column("session_id", VARCHAR, f"`{sc.SESSION_ID}`, else `{sc.GEN_AI_CONVERSATION_ID}`"),
        Column("turn", INTEGER, f"`{sc.TURN_INDEX}` (0-based)"),
        Column("engine_id", VARCHAR, f"`{sc.ENGINE_ID}` of the span, else of its resource"),
        Column("engine_role", VARCHAR, f"`{sc.ENGINE_ROLE}` of the span, else of its resource", sc.ROLES),
        Column("substrate", VARCHAR, f"`{sc.SUBSTRATE}` of the span or its resource", sc.SUBSTRATES),
        Column("service_name", VARCHAR, "resource `service.name`"),
        Column("start_time", TIMESTAMPTZ, "span start (µs precision)"),
        Column("end_time", TIMESTAMPTZ, "span end (µs precision)"),
        Column("start_ns", BIGINT, "span start, epoch ns"),
        Column("end_ns", BIGINT, "span end, epoch ns"),
        Column("duration_ms", DOUBLE, "span duration, ms"),
        Column("status_code", VARCHAR, "span status, spelled as stored in `StatusCode`", STATUS_CODE_VALUES),
    )
}


def common(*names: str) -> tuple[Column, ...]:
    """The shared columns ``names``, in that order."""
    return tuple(COMMON[n] for n in names)


def common_as(name: str, sql: str) -> Column:
    """The shared column ``name``, computed by ``sql`` in this view."""
    return replace(COMMON[name], sql=sql)


def col(name: str, type_: str, meaning: str, values: tuple[str, ...] = (), sql: str = "") -> Column:
    return Column(name, type_, meaning, tuple(values), sql)
