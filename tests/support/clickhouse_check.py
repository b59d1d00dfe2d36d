"""Do kvtrace's views give the same rows on ClickHouse as on DuckDB?  A helper for any trace
directory (the demo's, the simulator's, the real vLLM end-to-end test's).

    from support.clickhouse_check import check_views
    report = check_views(trace_dir)          # AssertionError naming the view and the first difference
    # report: view -> number of rows compared

The directory's spans go into chDB exactly as the OTel Collector's ClickHouse exporter would write
them (:mod:`kvtrace.store.clickhouse.load`: its DDL, string-typed attribute maps, numbers spelled
by pdata), in a table of their own; every view of :data:`kvtrace.store.views.VIEWS` is then read
from that table (:class:`~kvtrace.store.clickhouse.store.ClickHouseStore`) and from the Parquet
directory (:func:`kvtrace.store.connect`) and compared row by row, both sorted the same way:
counts, tokens, ids and strings exactly; floats to 1e-9 relative (the same double, barring
summation order); ``TIMESTAMP`` columns to 1 µs.

The raw attribute columns of ``spans`` hold what each store holds: the table has the exporter's
spelling of float values (``3`` where Parquet says ``3.0``) and typed maps rebuilt from strings
(a float with an integral value reads as an integer there); they are compared after applying that
rule to the Parquet side (:func:`expected_raw`).  Needs chDB (the ``clickhouse`` extra).
"""

from __future__ import annotations

import itertools
import math
import os
import tempfile
from datetime import datetime

import pyarrow as pa

from kvtrace.store import connect
from kvtrace.store.clickhouse import load
from kvtrace.store.clickhouse.backend import ChdbBackend
from kvtrace.store.clickhouse.store import ClickHouseStore
from kvtrace.store.views import VIEWS

REL = 1e-9
TIME_TOL_US = 1
_tables = itertools.count()


def chdb_backend() -> ChdbBackend:
    """chDB on the directory this process already opened, else on a new temporary one (chDB opens
    one directory per process)."""
    path = ChdbBackend._path or tempfile.mkdtemp(prefix="kvtrace-chdb-")
    return ChdbBackend(path)


def load_dir(directory, backend: ChdbBackend | None = None, table: str | None = None) -> ClickHouseStore:
    """``directory``'s spans in a fresh exporter table; the store over it."""
    backend = backend or chdb_backend()
    table = table or f"kvtrace_check.t{os.getpid()}_{next(_tables)}"
    load.load(directory, backend, table)
    return ClickHouseStore(backend, table)


def tiled_store(root, copies: int, spacing_ns: int, *, sessions: int = 3, turns: int = 4):
    """``root/traces``: :func:`~kvtrace.testing.synth.sample_store`'s sessions ``copies`` times
    (new ids), copy k starting ``k * spacing_ns`` later; returns that directory."""
    import numpy as np
    import pyarrow.parquet as pq

    from kvtrace.store.files import list_files
    from kvtrace.store.schema import SCHEMA
    from kvtrace.testing.synth import sample_store, tile, write_table

    sample_store(root / "template", sessions=sessions, turns=turns)
    tpl = pa.concat_tables(pq.read_table(p, schema=SCHEMA) for p in list_files(root / "template"))
    ks = np.arange(copies)
    write_table(tile(tpl, ks, ks * spacing_ns), root / "traces", writer="tiles")
    return root / "traces"


def _go_map(strings: dict, floats: dict) -> dict:
    return {**strings, **{k: load.go_float(v) for k, v in floats.items()}}


def expected_raw(row: dict) -> dict:
    """A Parquet ``spans`` row's raw attribute columns as the exporter's table has them."""
    out = dict(row)
    strings = _go_map(dict(row["SpanAttributes"] or []), dict(row["SpanAttributesFloat"] or []))
    out["SpanAttributes"] = strings
    ints, floats = {}, {}
    for key, text in strings.items():
        as_int, as_float = _int(text), _float(text)
        if as_int is not None:
            ints[key] = as_int
        elif as_float is not None:
            floats[key] = as_float
    out["SpanAttributesInt"], out["SpanAttributesFloat"] = ints, floats
    out["ResourceAttributes"] = {k: load._respelled(v) for k, v in row["ResourceAttributes"] or []}
    for name in ("Events.Attributes", "Links.Attributes"):
        out[name] = [{k: load._respelled(v) for k, v in m or []} for m in row[name] or []]
    return out


def _int(text: str):
    try:
        value = int(text, 10)
    except ValueError:
        return None
    return value if -(2**63) <= value < 2**63 and text.strip() == text else None


def _float(text: str):
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) or text.strip().lower() in ("inf", "-inf", "+inf", "infinity") else value


def _norm(value):
    """A comparable form: maps as sorted item tuples, timestamps as epoch µs."""
    if isinstance(value, datetime):
        return round(value.timestamp() * 1_000_000)
    if isinstance(value, dict):
        return tuple(sorted((k, _norm(v)) for k, v in value.items()))
    if isinstance(value, list):
        if value and isinstance(value[0], tuple) and len(value[0]) == 2:  # Arrow map as list of pairs
            return tuple(sorted((k, _norm(v)) for k, v in value))
        return tuple(_norm(v) for v in value)
    return value


def _sort_key(row: tuple):
    return tuple((v is None, "" if v is None else (f"{v:.6g}" if isinstance(v, float) else repr(v))) for v in row)


def _same(a, b, column: str) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)
    if isinstance(a, int) and isinstance(b, int) and column.endswith(("_time", "Timestamp")):
        return abs(a - b) <= TIME_TOL_US
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y, column) for x, y in zip(a, b, strict=True))
    return a == b


def compare_view(duck, ch: ClickHouseStore, name: str) -> int:
    """Compare one view; returns its row count, raises AssertionError at the first difference."""
    expected = duck.sql(f"SELECT * FROM {name}").to_arrow_table()
    got = ch.query(f"SELECT * FROM {name}")
    columns = expected.column_names
    assert got.column_names == columns, f"{name}: columns {got.column_names} != {columns}"
    want = expected.to_pylist()
    if name == "spans":
        want = [expected_raw(r) for r in want]
    want_rows = sorted((tuple(_norm(r[c]) for c in columns) for r in want), key=_sort_key)
    got_rows = sorted((tuple(_norm(r[c]) for c in columns) for r in got.to_pylist()), key=_sort_key)
    assert len(got_rows) == len(want_rows), f"{name}: {len(got_rows)} rows on ClickHouse, {len(want_rows)} on DuckDB"
    for i, (g, w) in enumerate(zip(got_rows, want_rows, strict=True)):
        for c, a, b in zip(columns, g, w, strict=True):
            assert _same(a, b, c), (
                f"{name} row {i}: {c} = {a!r} on ClickHouse, {b!r} on DuckDB\n{dict(zip(columns, w, strict=True))}"
            )
    return len(want_rows)


def check_views(directory, store: ClickHouseStore | None = None, views=None) -> dict[str, int]:
    """Load ``directory`` into chDB (unless ``store`` is given) and compare every view (or
    ``views``) with DuckDB over the directory; view -> rows compared."""
    store = store or load_dir(directory)
    duck = connect(directory)
    return {v.name: compare_view(duck, store, v.name) for v in VIEWS if views is None or v.name in views}
