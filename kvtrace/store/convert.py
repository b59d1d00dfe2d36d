"""SpanColumns -> an Arrow table in :data:`kvtrace.store.schema.SCHEMA`, column-wise and fast.

Stage two of the Parquet export (stage one, reading the SDK's spans into plain lists, is
:mod:`kvtrace.store.spancols`): :func:`columns_to_table` runs in the writer process of
:mod:`kvtrace.store.writer_process`, or in-process through :func:`spans_to_table` (both stages) for
:class:`kvtrace.store.exporter.ParquetSpanExporter`; :mod:`kvtrace.collect.otlp_convert` reuses
:func:`offsets`, :func:`string_maps` and :func:`attribute_maps`.  The hot path has no per-span
Python code: every per-span or per-value step is a C-level ``map``/``zip``/``compress``/``chain``
pass or a numpy/Arrow kernel, and values shared by many spans (resources, scopes, trace ids) are
converted once per batch.  The store benchmark (``benchmarks/store/bench_store.py``) measures it;
keep it that way when adding columns.

Attribute encoding (ClickHouse ``otel_traces`` compatible): every value is stringified into
``SpanAttributes`` (bools ``"true"``/``"false"``, sequences and mappings as JSON, bytes as
base64); ints (not bools) are also in ``SpanAttributesInt`` and floats in ``SpanAttributesFloat``.
Event and link attributes are string maps.  :func:`table_to_rows` reads a table back into plain
dicts (tests, debugging).

Every text column is built by :func:`kvtrace.store.sanitise.strings`: one ``pa.array`` call, and
only when Arrow refuses a value (an unpaired surrogate ``"\\ud800"``, non-UTF-8 bytes) that
column is redone with the bad values escaped; the rest of the batch is untouched.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from itertools import chain, compress, repeat
from typing import Any

import numpy as np
import pyarrow as pa

from kvtrace import semconv as sc
from kvtrace.store.sanitise import strings, text
from kvtrace.store.schema import SCHEMA, TS
from kvtrace.store.spancols import SpanColumns, span_columns

_STR, _INT, _FLOAT, _BOOL, _OTHER = 0, 1, 2, 3, 4
_TYPE_CODE = {str: _STR, int: _INT, float: _FLOAT, bool: _BOOL}
_BOOL_STR = {True: "true", False: "false"}
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_JSON_CACHE_MAX = 4096
_json_cache: dict = {}


def _other_to_str(value: Any) -> str:
    """Stringify a non-scalar attribute value: sequences/mappings as JSON, bytes as base64; a
    value none of that works for (a cyclic list, a mapping with tuple keys) as
    :func:`kvtrace.store.sanitise.text` of it."""
    try:
        if isinstance(value, (bytes, bytearray)):
            return base64.b64encode(bytes(value)).decode("ascii")
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (str, int, float)):
            return str(value)
        return json.dumps(value, default=_json_default, separators=(",", ":"), ensure_ascii=False)
    except Exception:
        return text(value)


def _tuple_to_str(value: Any) -> str:
    """:func:`_other_to_str`, memoised for tuples (the SDK's sequence attributes; a span kind's
    ``finish_reasons`` repeat endlessly).  The key includes the element types: ``(1,)`` and
    ``(True,)`` are equal but stringify differently."""
    if type(value) is not tuple:
        return _other_to_str(value)
    key = (value, tuple(map(type, value)))
    try:
        return _json_cache[key]
    except KeyError:
        pass
    except TypeError:  # unhashable element
        return _other_to_str(value)
    if len(_json_cache) >= _JSON_CACHE_MAX:
        _json_cache.clear()
    out = _json_cache[key] = _other_to_str(value)
    return out


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (tuple, list, set, frozenset)):
        return list(value)
    if hasattr(value, "items"):
        return dict(value.items())
    return str(value)


def offsets(lengths) -> pa.Array:
    out = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=out[1:])
    return pa.array(out)


def _hex64(ids: list[int], present: np.ndarray | None = None) -> pa.Array:
    """16-char lowercase hex strings of 64-bit ids, vectorised; "" where ``present`` is False
    (``ids`` then holds only the present ones)."""
    n = len(ids) if present is None else len(present)
    raw = np.fromiter(ids, dtype=np.uint64, count=len(ids)).astype(">u8").view(np.uint8).reshape(len(ids), 8)
    chars = np.empty((len(ids), 16), dtype=np.uint8)
    chars[:, 0::2] = _HEX[raw >> 4]
    chars[:, 1::2] = _HEX[raw & 15]
    lengths = np.full(n, 16, dtype=np.int32) if present is None else np.where(present, 16, 0).astype(np.int32)
    return pa.StringArray.from_buffers(n, offsets(lengths).buffers()[1], pa.py_buffer(chars))


def string_maps(dicts: Sequence[dict], where: str = "attributes") -> pa.Array:
    """MapArray<string,string> of ``dicts`` (event/link/resource attributes: small, simple path)."""
    keys = list(chain.from_iterable(dicts))
    values = list(chain.from_iterable(d.values() for d in dicts))
    strs = [v if type(v) is str else _other_to_str(v) for v in values]
    return pa.MapArray.from_arrays(
        offsets([len(d) for d in dicts]),
        strings(keys, f"{where} key"),
        strings(strs, where, lambda i: f"{where}[{text(keys[i])!r}]"),
    )


def _group_by_keys(attr_dicts: list[dict]) -> tuple[dict, np.ndarray]:
    """(distinct key tuples in first-seen order, each dict's group number).  Spans of one kind
    carry the same keys in the same order, so a batch has a handful of groups."""
    distinct = dict.fromkeys(map(tuple, attr_dicts))  # tuples built twice, never all alive (GC)
    index = {kt: g for g, kt in enumerate(distinct)}
    return distinct, np.fromiter(map(index.__getitem__, map(tuple, attr_dicts)), np.intp, len(attr_dicts))


def _classify(attr_dicts: list[dict], distinct: dict, gid: np.ndarray, starts: np.ndarray):
    """Values by type code, and each value's position in the flattened (span-major) map.

    Works a key group at a time: the group's values form a rows x keys matrix; when every row
    has the first row's value types (the usual case) whole columns are routed by type at once,
    otherwise each value is dispatched on its own type."""
    vals: list[list] = [[] for _ in range(_OTHER + 1)]
    poss: list[list] = [[] for _ in range(_OTHER + 1)]
    order = np.argsort(gid, kind="stable")
    bounds = np.zeros(len(distinct) + 1, np.intp)
    np.cumsum(np.bincount(gid, minlength=len(distinct)), out=bounds[1:])
    get = _TYPE_CODE.get
    for g, keys in enumerate(distinct):
        k = len(keys)
        if not k:
            continue
        rows = order[bounds[g] : bounds[g + 1]]
        flat = list(chain.from_iterable(map(dict.values, map(attr_dicts.__getitem__, rows.tolist()))))
        types = list(map(type, flat))
        pos = starts[rows] + np.arange(k)[:, None]  # keys x rows
        if types == types[:k] * len(rows):
            col_codes = list(map(get, types[:k], repeat(_OTHER)))
            columns = [flat[j::k] for j in range(k)]
            for code in set(col_codes):
                mask = list(map(code.__eq__, col_codes))
                vals[code].extend(chain.from_iterable(compress(columns, mask)))
                poss[code].append(pos[mask].ravel())
        else:
            codes = np.fromiter(map(get, types, repeat(_OTHER)), np.int8, len(types))
            flat_pos = pos.T.ravel()  # row-major, like flat
            for code in set(codes.tolist()):
                mask = codes == code
                vals[code].extend(compress(flat, mask.tolist()))
                poss[code].append(flat_pos[mask])
    return vals, [np.concatenate(p) if p else np.empty(0, np.intp) for p in poss]


def _demote_big_ints(vals: list[list], poss: list[np.ndarray]) -> pa.Array:
    """Int values as int64; ints outside int64 move to the generic (stringified) path."""
    try:
        return pa.array(vals[_INT], pa.int64())
    except OverflowError:
        small = [-(2**63) <= v < 2**63 for v in vals[_INT]]
        keep = np.array(small, dtype=bool)
        vals[_OTHER] = vals[_OTHER] + list(compress(vals[_INT], [not s for s in small]))
        poss[_OTHER] = np.concatenate([poss[_OTHER], poss[_INT][~keep]])
        vals[_INT], poss[_INT] = list(compress(vals[_INT], small)), poss[_INT][keep]
        return pa.array(vals[_INT], pa.int64())


def _key_at(keys: pa.Array, pos: np.ndarray):
    """Names the attribute at index ``i`` of a value list whose map positions are ``pos``
    (for the sanitised-value log line, never on the fast path)."""
    return lambda i: f"SpanAttributes[{keys[int(pos[i])].as_py()!r}]"


def attribute_maps(attr_dicts: list[dict]) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(SpanAttributes, SpanAttributesInt, SpanAttributesFloat) for one batch.

    Ints and floats are stringified by Arrow (floats in shortest round-trip form), bools as
    ``true``/``false``, everything else by :func:`_other_to_str`."""
    n = len(attr_dicts)
    lengths = np.fromiter(map(len, attr_dicts), dtype=np.int32, count=n)
    off = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=off[1:])
    total = int(off[-1])
    distinct, gid = _group_by_keys(attr_dicts)
    vals, poss = _classify(attr_dicts, distinct, gid, off[:-1].astype(np.intp))
    key_pool = strings(list(chain.from_iterable(distinct)), "SpanAttributes key")
    key_start = np.zeros(len(distinct) + 1, dtype=np.int64)
    np.cumsum(list(map(len, distinct)), out=key_start[1:])
    keys = key_pool.take(pa.array(np.repeat(key_start[gid] - off[:-1], lengths) + np.arange(total)))
    ints = _demote_big_ints(vals, poss)
    floats = pa.array(vals[_FLOAT], pa.float64())
    parts = [
        strings(vals[_STR], "SpanAttributes", _key_at(keys, poss[_STR])),
        ints.cast(pa.string()),
        floats.cast(pa.string()),
        pa.array(list(map(_BOOL_STR.__getitem__, vals[_BOOL])), pa.string()),
        strings(list(map(_tuple_to_str, vals[_OTHER])), "SpanAttributes", _key_at(keys, poss[_OTHER])),
    ]
    inverse = np.empty(total, dtype=np.intp)
    inverse[np.concatenate(poss)] = np.arange(total)
    strs = pa.concat_arrays(parts).take(pa.array(inverse))
    owner = np.repeat(np.arange(n), lengths)
    typed = []
    for code, arr in ((_INT, ints), (_FLOAT, floats)):
        order = np.argsort(poss[code], kind="stable")
        pos = poss[code][order]
        counts = np.bincount(owner[pos], minlength=n)
        typed.append(pa.MapArray.from_arrays(offsets(counts), keys.take(pa.array(pos)), arr.take(pa.array(order))))
    return pa.MapArray.from_arrays(pa.array(off), keys, strs), typed[0], typed[1]


def _nested(c: SpanColumns) -> list[pa.Array]:
    """Events.* and Links.* columns (parallel lists, ClickHouse Nested layout)."""
    ev_off, ln_off = offsets(c.event_counts), offsets(c.link_counts)
    return [
        pa.ListArray.from_arrays(ev_off, pa.array(c.event_times, pa.int64()).cast(TS)),
        pa.ListArray.from_arrays(ev_off, strings(c.event_names, "Events.Name")),
        pa.ListArray.from_arrays(ev_off, string_maps(c.event_attributes, "Events.Attributes")),
        pa.ListArray.from_arrays(ln_off, pa.array([format(t, "032x") for t in c.link_trace_ids], pa.string())),
        pa.ListArray.from_arrays(ln_off, _hex64(c.link_span_ids)),
        pa.ListArray.from_arrays(ln_off, strings(c.link_states, "Links.TraceState")),
        pa.ListArray.from_arrays(ln_off, string_maps(c.link_attributes, "Links.Attributes")),
    ]


def _ints(values: Sequence) -> np.ndarray:
    """int64 array of epoch-ns times; ``None`` (a span never started/ended) as 0."""
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except TypeError:
        return np.array([t or 0 for t in values], dtype=np.int64)


def _trace_ids(ids: list[int]) -> pa.Array:
    """32-char hex of 128-bit trace ids, each distinct id formatted once."""
    hex_of = {t: format(t, "032x") for t in set(ids)}
    return pa.array(list(map(hex_of.__getitem__, ids)), pa.string())


def _by_row(values: pa.Array, index: list[int]) -> pa.Array:
    """``values`` (one per distinct resource / scope) spread to the rows by ``index``."""
    return values.take(pa.array(index, pa.int32()))


def columns_to_table(c: SpanColumns) -> pa.Table:
    """Stage two of the export: :class:`~kvtrace.store.spancols.SpanColumns` -> a table in SCHEMA."""
    if not c.names:
        return SCHEMA.empty_table()
    start, end = _ints(c.starts), _ints(c.ends)
    span_map, int_map, float_map = attribute_maps(c.attributes)
    services = [str(r.get(sc.SERVICE_NAME, "")) for r in c.resources]
    columns = [
        pa.array(start).cast(TS),
        _trace_ids(c.trace_ids),
        _hex64(c.span_ids),
        _hex64(c.parent_ids, np.array(c.has_parent, dtype=bool)),
        strings(c.trace_states, "TraceState"),
        strings(c.names, "SpanName"),
        pa.array(c.kinds, pa.string()),
        _by_row(strings(services, "ServiceName"), c.resource_index),
        _by_row(string_maps(c.resources, "ResourceAttributes"), c.resource_index),
        _by_row(strings([s[0] for s in c.scopes], "ScopeName"), c.scope_index),
        _by_row(strings([s[1] for s in c.scopes], "ScopeVersion"), c.scope_index),
        span_map,
        pa.array(np.where(end > 0, end - start, 0)),
        pa.array(c.status_codes, pa.string()),
        strings([d or "" for d in c.status_messages], "StatusMessage"),
        *_nested(c),
        int_map,
        float_map,
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


def spans_to_table(spans: Sequence) -> pa.Table:
    """Convert SDK ReadableSpans to one Arrow table in SCHEMA (row order = input order)."""
    if not spans:
        return SCHEMA.empty_table()
    return columns_to_table(span_columns(spans))


def table_to_rows(table: pa.Table) -> list[dict]:
    """Rows of a SCHEMA table as dicts: maps as dicts, timestamps as epoch ns (tests, debugging)."""
    table = table.set_column(0, "Timestamp", table["Timestamp"].cast(pa.int64()))
    i = table.schema.get_field_index("Events.Timestamp")
    table = table.set_column(i, "Events.Timestamp", table["Events.Timestamp"].cast(pa.list_(pa.int64())))
    rows = table.to_pylist()
    for row in rows:
        for key, field in zip(table.column_names, table.schema, strict=True):
            if pa.types.is_map(field.type):
                row[key] = dict(row[key] or [])
            elif pa.types.is_list(field.type) and pa.types.is_map(field.type.value_type):
                row[key] = [dict(m or []) for m in row[key]]
    return rows
