"""A kvtrace trace directory into an ``otel_traces`` table, exactly as the Collector's ClickHouse
exporter would have written its spans.

kvtrace's Parquet files already have the exporter's columns (plus two typed attribute maps, which
this drops).  What differs is how numbers are spelled: the exporter writes every attribute with
pdata's ``Value.AsString``, so a double is spelled like JavaScript/JSON does (``3``, ``0.25``,
``1e-7``; :func:`go_float`), where kvtrace's string map holds Python's ``str`` (``3.0``, ``1e-07``).
:func:`exporter_table` re-spells them: span attributes from ``SpanAttributesFloat`` (the exact type
is known there), resource, event and link attribute values that are exactly Python's spelling of a
float (kvtrace keeps no typed map for those).  Integers, booleans (``true`` / ``false``) and strings
are spelled the same by both; arrays and maps keep kvtrace's JSON.

:func:`load` creates the table with the exporter's DDL (:data:`.ddl.TRACES_TABLE_DDL`; the
database too, for ``db.table``) when missing and inserts every complete Parquet file of the
directory (one run, as :func:`kvtrace.store.connect` reads it).  The equivalence test
(``tests/store/clickhouse/test_views_match_duckdb.py``) and ``tests/support/clickhouse_check.py`` load with it.
"""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kvtrace.store.clickhouse import ddl
from kvtrace.store.clickhouse.backend import ChdbBackend, ServerBackend
from kvtrace.store.schema import SCHEMA
from kvtrace.store.sql import CLICKHOUSE, ident, literal

TYPED = ("SpanAttributesInt", "SpanAttributesFloat")
COLUMNS = tuple(n for n in SCHEMA.names if n not in TYPED)
_MAPS = ("ResourceAttributes",)
_MAP_LISTS = ("Events.Attributes", "Links.Attributes")


def go_float(value: float) -> str:
    """``value`` as pdata's ``Value.AsString`` spells a double (Go's ``float64AsString``: shortest
    digits, positional unless ``|v| < 1e-6`` or ``>= 1e21``, exponent without leading zeros)."""
    if math.isnan(value) or math.isinf(value):
        return "json: unsupported value: " + ("NaN" if math.isnan(value) else "+Inf" if value > 0 else "-Inf")
    a = abs(value)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        mantissa, exp = repr(value).split("e")
        sign, digits = exp[0], exp[1:].lstrip("0") or "0"
        if sign == "+" or len(digits) > 1:
            digits = digits.rjust(2, "0")
        return f"{mantissa}e{sign}{digits}"
    return np.format_float_positional(value, unique=True, trim="-")


def _respelled(text: str) -> str:
    """A string attribute value that is exactly Python's spelling of a float, in Go's."""
    if not text or not (text[0].isdigit() or text[0] in "-i" or text == "nan"):
        return text
    try:
        value = float(text)
    except ValueError:
        return text
    return go_float(value) if repr(value) == text and not text.lstrip("-").isdigit() else text


def _span_attrs(strings: list | None, floats: list | None) -> list:
    out = dict(strings or [])
    for key, value in floats or []:
        out[key] = go_float(value)
    return list(out.items())


def exporter_table(table: pa.Table) -> pa.Table:
    """Rows of a kvtrace (:data:`~kvtrace.store.schema.SCHEMA`) table as the exporter writes them."""
    cols = {n: table[n] for n in COLUMNS}
    span = [
        _span_attrs(s, f)
        for s, f in zip(table["SpanAttributes"].to_pylist(), table["SpanAttributesFloat"].to_pylist(), strict=True)
    ]
    cols["SpanAttributes"] = pa.array(span, SCHEMA.field("SpanAttributes").type)
    for name in _MAPS:
        values = [[(k, _respelled(v)) for k, v in m or []] for m in table[name].to_pylist()]
        cols[name] = pa.array(values, SCHEMA.field(name).type)
    for name in _MAP_LISTS:
        lists = [[[(k, _respelled(v)) for k, v in m or []] for m in row or []] for row in table[name].to_pylist()]
        cols[name] = pa.array(lists, SCHEMA.field(name).type)
    return pa.table(cols, schema=pa.schema([SCHEMA.field(n) for n in COLUMNS]))


def create_table(backend, table: str = ddl.TABLE) -> None:
    """The exporter's table (and its database) unless they exist."""
    if "." in table:
        backend.command(f"CREATE DATABASE IF NOT EXISTS {ident(table.rsplit('.', 1)[0])}")
    backend.command(ddl.render(ddl.TRACES_TABLE_DDL, table))


def insert(backend, table: str, rows: pa.Table, settings: dict | None = None) -> None:
    """Insert exporter rows (:func:`exporter_table`): chDB reads them from a temporary Parquet
    file, a server receives them over clickhouse-connect; ``settings``: the insert's (e.g.
    :func:`exporter_settings`)."""
    if isinstance(backend, ServerBackend):
        backend.client.insert_arrow(table, rows, settings=settings)
        return
    if not isinstance(backend, ChdbBackend):
        raise TypeError(f"cannot insert into {backend!r}")
    with tempfile.TemporaryDirectory(prefix="kvtrace-ch-") as tmp:
        path = os.path.join(tmp, "rows.parquet")
        pq.write_table(rows, path)
        listed = ", ".join(f"{k} = {literal(v, CLICKHOUSE)}" for k, v in (settings or {}).items())
        backend.command(
            f"INSERT INTO {ident(table)} SELECT * FROM file({literal(path, CLICKHOUSE)}, Parquet)"
            + (f" SETTINGS {listed}" if listed else "")
        )


def exporter_settings(backend) -> dict[str, str]:
    """ClickHouse's defaults of the settings kvtrace's queries change (:data:`.dialect.SETTINGS`): what
    the exporter's inserts, and so kvtrace's materialized views, run with."""
    from kvtrace.store.clickhouse.dialect import SETTINGS

    listed = ", ".join(literal(k, CLICKHOUSE) for k in SETTINGS)
    rows = backend.query(f"SELECT name, default FROM system.settings WHERE name IN ({listed})").to_pylist()
    return {r["name"]: r["default"] for r in rows}


def load(directory: str | os.PathLike, backend, table: str = ddl.TABLE, *, replace: bool = False) -> int:
    """Every span of the trace directory (one run) into ``table`` as the exporter writes them;
    creates the table when missing (``replace``: drops it first).  ``backend``: a backend of
    :mod:`.backend` or a ``--clickhouse`` URL.  Returns the number of spans."""
    from kvtrace.store.clickhouse.backend import open_backend
    from kvtrace.store.reader import check_one_run, trace_files

    if isinstance(backend, str):
        backend = open_backend(backend)
    files = trace_files(directory)
    check_one_run(directory, files)
    if replace:
        backend.command(f"DROP TABLE IF EXISTS {ident(table)}")
    create_table(backend, table)
    total = 0
    for path in files:
        part = pq.read_table(path, schema=SCHEMA)
        if part.num_rows:
            insert(backend, table, exporter_table(part))
            total += part.num_rows
    return total
