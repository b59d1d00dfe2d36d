"""ReadableSpans -> an Arrow table in :data:`kvtrace.store.schema.SCHEMA`, column-wise and fast.

Called by :class:`kvtrace.store.exporter.ParquetSpanExporter` once per exported batch (and by the
store benchmark).  The hot path avoids per-span pyarrow calls: one Python loop gathers scalar
columns, the attribute maps are built from flat key/value lists with offsets, and all type
dispatch on attribute values is done once per value with C-level ``map`` calls.

Attribute encoding (ClickHouse ``otel_traces`` compatible): every value is stringified into
``SpanAttributes`` (bools ``"true"``/``"false"``, sequences and mappings as JSON, bytes as
base64); ints (not bools) are also in ``SpanAttributesInt`` and floats in ``SpanAttributesFloat``.
Event and link attributes are string maps.  :func:`table_to_rows` reads a table back into plain
dicts (tests, debugging).
"""

from __future__ import annotations

import base64
import json
from itertools import chain, compress, repeat
from operator import attrgetter
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
from opentelemetry.sdk.trace import ReadableSpan, Span
from opentelemetry.trace import SpanKind, StatusCode

from kvtrace import semconv as sc
from kvtrace.store.schema import SCHEMA, SPAN_KINDS, STATUS_CODES, TS

_STR, _INT, _FLOAT, _BOOL, _OTHER = 0, 1, 2, 3, 4
_TYPE_CODE = {str: _STR, int: _INT, float: _FLOAT, bool: _BOOL}
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_KIND = {k: SPAN_KINDS[k.value] for k in SpanKind}
_STATUS = {c: STATUS_CODES[c.value] for c in StatusCode}
# exact SDK classes whose private slots are read directly (fast path); anything else (wrappers,
# subclasses that override properties) goes through the public ReadableSpan properties
_FAST_TYPES = (ReadableSpan, Span)
_FIELDS = ("context", "parent", "name", "kind", "start_time", "end_time", "status", "events", "links",
           "resource", "instrumentation_scope", "attributes")
_get_fast = attrgetter(*(f"_{f}" for f in _FIELDS))
_get_public = attrgetter(*_FIELDS)


def _other_to_str(value: Any) -> str:
    """Stringify a non-scalar attribute value: sequences/mappings as JSON, bytes as base64."""
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return json.dumps(value, default=_json_default, separators=(",", ":"), ensure_ascii=False)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (tuple, list, set, frozenset)):
        return list(value)
    if hasattr(value, "items"):
        return dict(value.items())
    return str(value)


def _as_dict(attributes) -> dict:
    """Attributes as a dict; the SDK's BoundedAttributes backing dict when there is one."""
    inner = getattr(attributes, "_dict", None)
    if type(inner) is dict:
        return inner
    if type(attributes) is dict:
        return attributes
    return dict(attributes or {})


def offsets(lengths) -> pa.Array:
    out = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=out[1:])
    return pa.array(out)


def _hex64(ids: list[int], present: np.ndarray | None = None) -> pa.Array:
    """16-char lowercase hex strings of 64-bit ids, vectorised; "" where ``present`` is False."""
    n = len(ids)
    raw = np.array(ids, dtype=np.uint64).astype(">u8").view(np.uint8).reshape(n, 8)
    if present is not None:
        raw = raw[present]
    chars = np.empty((len(raw), 16), dtype=np.uint8)
    chars[:, 0::2] = _HEX[raw >> 4]
    chars[:, 1::2] = _HEX[raw & 15]
    lengths = np.full(n, 16, dtype=np.int32) if present is None else np.where(present, 16, 0).astype(np.int32)
    return pa.StringArray.from_buffers(n, offsets(lengths).buffers()[1], pa.py_buffer(chars.tobytes()))


def string_maps(dicts: Sequence[dict]) -> pa.Array:
    """MapArray<string,string> of ``dicts`` (event/link/resource attributes: small, simple path)."""
    keys = list(chain.from_iterable(dicts))
    values = list(chain.from_iterable(d.values() for d in dicts))
    strs = [v if type(v) is str else _other_to_str(v) for v in values]
    return pa.MapArray.from_arrays(
        offsets([len(d) for d in dicts]), pa.array(keys, pa.string()), pa.array(strs, pa.string())
    )


def _typed_values(values: list, codes: np.ndarray) -> tuple[pa.Array, pa.Array, pa.Array, np.ndarray]:
    """(all values as strings, int values, float values, codes) - casts done by Arrow in C++.

    Floats are stringified by Arrow (shortest round-trip form); ints outside int64 are demoted
    to the generic path."""
    ints = list(compress(values, (codes == _INT).tolist()))
    try:
        int_arr = pa.array(ints, pa.int64())
    except OverflowError:
        big = np.array([type(v) is int and not -(2**63) <= v < 2**63 for v in values])
        codes = np.where(big, _OTHER, codes)
        int_arr = pa.array(list(compress(values, (codes == _INT).tolist())), pa.int64())
    float_arr = pa.array(list(compress(values, (codes == _FLOAT).tolist())), pa.float64())
    str_arr = pa.array(list(compress(values, (codes == _STR).tolist())), pa.string())
    other = [_other_to_str(v) for v in compress(values, (codes >= _BOOL).tolist())]
    order = np.argsort(codes, kind="stable")  # groups STR, INT, FLOAT, then BOOL/OTHER (in order)
    parts = pa.concat_arrays([str_arr, int_arr.cast(pa.string()), float_arr.cast(pa.string()),
                              pa.array(other, pa.string())])
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return parts.take(pa.array(inverse)), int_arr, float_arr, codes


def attribute_maps(attr_dicts: list[dict]) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(SpanAttributes, SpanAttributesInt, SpanAttributesFloat) for one batch."""
    n = len(attr_dicts)
    lengths = np.fromiter(map(len, attr_dicts), dtype=np.int32, count=n)
    keys = pa.array(list(chain.from_iterable(attr_dicts)), pa.string())
    values = list(chain.from_iterable(map(dict.values, attr_dicts)))
    codes = np.fromiter(map(_TYPE_CODE.get, map(type, values), repeat(_OTHER)), dtype=np.int8, count=len(values))
    strs, ints, floats, codes = _typed_values(values, codes)
    owner = np.repeat(np.arange(n), lengths)
    typed = []
    for code, arr in ((_INT, ints), (_FLOAT, floats)):
        mask = codes == code
        counts = np.bincount(owner[mask], minlength=n)
        typed.append(pa.MapArray.from_arrays(offsets(counts), keys.filter(pa.array(mask)), arr))
    return pa.MapArray.from_arrays(offsets(lengths), keys, strs), typed[0], typed[1]


def _nested(events_per_span: Sequence, links_per_span: Sequence) -> list[pa.Array]:
    """Events.* and Links.* columns (parallel lists, ClickHouse Nested layout)."""
    ev_off = offsets(list(map(len, events_per_span)))
    ln_off = offsets(list(map(len, links_per_span)))
    events = [e for evs in events_per_span if len(evs) for e in evs]
    links = [lk for lks in links_per_span if len(lks) for lk in lks]
    ctxs = [lk.context for lk in links]
    return [
        pa.ListArray.from_arrays(ev_off, pa.array([e.timestamp for e in events], pa.int64()).cast(TS)),
        pa.ListArray.from_arrays(ev_off, pa.array([e.name for e in events], pa.string())),
        pa.ListArray.from_arrays(ev_off, string_maps([_as_dict(e.attributes) for e in events])),
        pa.ListArray.from_arrays(ln_off, pa.array([format(c.trace_id, "032x") for c in ctxs], pa.string())),
        pa.ListArray.from_arrays(ln_off, _hex64([c.span_id for c in ctxs])),
        pa.ListArray.from_arrays(ln_off, pa.array([_trace_state(c) for c in ctxs], pa.string())),
        pa.ListArray.from_arrays(ln_off, string_maps([_as_dict(lk.attributes) for lk in links])),
    ]


def _trace_state(ctx) -> str:
    state = ctx.trace_state
    return state.to_header() if state else ""


def _unique(objs: Sequence) -> tuple[list, pa.Array]:
    """Distinct objects (by identity) and each row's index into them (for ``take``)."""
    index: dict[int, int] = {}
    items: list = []
    rows = []
    for obj in objs:
        i = index.get(id(obj))
        if i is None:
            i = index[id(obj)] = len(items)
            items.append(obj)
        rows.append(i)
    return items, pa.array(rows, pa.int32())


def _fields(spans: Sequence) -> list[tuple]:
    if all(type(s) in _FAST_TYPES for s in spans):
        return list(map(_get_fast, spans))
    return list(map(_get_public, spans))


def spans_to_table(spans: Sequence) -> pa.Table:
    """Convert SDK ReadableSpans to one Arrow table in SCHEMA (row order = input order)."""
    if not spans:
        return SCHEMA.empty_table()
    (ctxs, parents, names, kinds, starts, ends, statuses, events, links, resources, scopes,
     attrs) = zip(*_fields(spans))
    trace_ids = list(map(attrgetter("trace_id"), ctxs))
    hex_of = {t: format(t, "032x") for t in set(trace_ids)}
    has_parent = np.fromiter((p is not None for p in parents), dtype=bool, count=len(spans))
    start = np.array([t or 0 for t in starts], dtype=np.int64)
    end = np.array([t or 0 for t in ends], dtype=np.int64)
    res_items, res_take = _unique(resources)
    res_attrs = [_as_dict(r.attributes) for r in res_items]
    scope_items, scope_take = _unique(scopes)
    span_map, int_map, float_map = attribute_maps(list(map(_as_dict, attrs)))
    columns = [
        pa.array(start).cast(TS),
        pa.array(list(map(hex_of.__getitem__, trace_ids)), pa.string()),
        _hex64(list(map(attrgetter("span_id"), ctxs))),
        _hex64([p.span_id if p is not None else 0 for p in parents], has_parent),
        pa.array([_trace_state(c) for c in ctxs], pa.string()),
        pa.array(names, pa.string()),
        pa.array(list(map(_KIND.__getitem__, kinds)), pa.string()),
        pa.array([str(r.get(sc.SERVICE_NAME, "")) for r in res_attrs], pa.string()).take(res_take),
        string_maps(res_attrs).take(res_take),
        pa.array([(s.name if s else "") for s in scope_items], pa.string()).take(scope_take),
        pa.array([((s.version or "") if s else "") for s in scope_items], pa.string()).take(scope_take),
        span_map,
        pa.array(np.where(end > 0, end - start, 0)),
        pa.array([_STATUS[st.status_code] for st in statuses], pa.string()),
        pa.array([st.description or "" for st in statuses], pa.string()),
        *_nested(events, links),
        int_map,
        float_map,
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def table_to_rows(table: pa.Table) -> list[dict]:
    """Rows of a SCHEMA table as dicts: maps as dicts, timestamps as epoch ns (tests, debugging)."""
    table = table.set_column(0, "Timestamp", table["Timestamp"].cast(pa.int64()))
    i = table.schema.get_field_index("Events.Timestamp")
    table = table.set_column(i, "Events.Timestamp", table["Events.Timestamp"].cast(pa.list_(pa.int64())))
    rows = table.to_pylist()
    for row in rows:
        for key, field in zip(table.column_names, table.schema):
            if pa.types.is_map(field.type):
                row[key] = dict(row[key] or [])
            elif pa.types.is_list(field.type) and pa.types.is_map(field.type.value_type):
                row[key] = [dict(m or []) for m in row[key]]
    return rows
