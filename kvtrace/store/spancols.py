"""SDK spans -> :class:`SpanColumns`: a batch's plain values, column by column (export, stage one).

The Parquet export is two stages: :func:`span_columns` reads the SDK's span objects into lists of
builtins (ints, strs, floats, bools, None, tuples, dicts), and
:func:`kvtrace.store.convert.columns_to_table` turns those into Arrow.  Stage one is the cheap part
(no Arrow, no stringification) and must run where the span objects live; stage two is the costly
part and can run anywhere: :mod:`kvtrace.store.writer_process` pickles the columns (builtins only, so the
C pickler does it fast) and ships them to a writer process, so the process that made the spans
never holds the GIL for an Arrow conversion.

Every per-span step is a C-level ``map``/``compress``/``chain`` pass: SDK properties are bypassed
by reading the SDK's private slots (exact SDK classes only; anything else goes through the public
properties), enum members are looked up by ``id``, ``SpanContext`` is read as the tuple it is, and
objects shared by many spans (resources, scopes, trace states) are converted once per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate, chain, compress, repeat
from operator import attrgetter, is_not, itemgetter
from typing import NamedTuple

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import ReadableSpan, Span
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import SpanContext, SpanKind, StatusCode
from opentelemetry.trace.status import Status

from kvtrace.store.schema import SPAN_KINDS, STATUS_CODES


class SpanColumns(NamedTuple):
    """One batch of spans as plain columns.  Per span: ``trace_ids`` ... ``attributes``,
    ``event_counts``, ``link_counts``, ``resource_index``, ``scope_index``; ``parent_ids`` holds one
    id per true ``has_parent``; ``event_*`` / ``link_*`` are flattened in span order;
    ``resources`` (attribute dicts) and ``scopes`` ((name, version)) are the distinct ones."""

    trace_ids: list
    span_ids: list
    has_parent: list
    parent_ids: list
    trace_states: list  # W3C header, "" when none
    names: list
    kinds: list  # schema.SPAN_KINDS spelling
    starts: list  # epoch ns, None when never started
    ends: list
    status_codes: list  # schema.STATUS_CODES spelling
    status_messages: list  # str or None
    attributes: list  # a dict per span
    event_counts: list
    event_names: list
    event_times: list
    event_attributes: list
    link_counts: list
    link_trace_ids: list
    link_span_ids: list
    link_states: list
    link_attributes: list
    resources: list
    resource_index: list
    scopes: list
    scope_index: list


_KIND = {k: SPAN_KINDS[k.value] for k in SpanKind}
_STATUS = {c: STATUS_CODES[c.value] for c in StatusCode}
# enum members are singletons: look them up by id (Enum.__hash__ is Python code)
_KIND_BY_ID = {id(k): v for k, v in _KIND.items()}
_STATUS_BY_ID = {id(c): v for c, v in _STATUS.items()}
_FAST_TYPES = frozenset((ReadableSpan, Span))
_FIELDS = (
    "context",
    "parent",
    "name",
    "kind",
    "start_time",
    "end_time",
    "status",
    "events",
    "links",
    "resource",
    "instrumentation_scope",
    "attributes",
)
_GET_FAST = [attrgetter(f"_{f}") for f in _FIELDS]
_GET_PUBLIC = [attrgetter(f) for f in _FIELDS]
_get_dq = attrgetter("_dq")
_get_dict = attrgetter("_dict")
_GET_STATUS_FAST = (attrgetter("_status_code"), attrgetter("_description"))
_GET_STATUS_PUBLIC = (attrgetter("status_code"), attrgetter("description"))
# SpanContext is a tuple: (trace_id, span_id, is_remote, trace_flags, trace_state, is_valid)
_GET_CTX_FAST = (itemgetter(0), itemgetter(1), itemgetter(4))
_GET_CTX_PUBLIC = (attrgetter("trace_id"), attrgetter("span_id"), attrgetter("trace_state"))
_SPAN_ID = itemgetter(1)
_GET_EVENT = (attrgetter("name"), attrgetter("timestamp"), attrgetter("attributes"))
_GET_LINK = (attrgetter("context"), attrgetter("attributes"))


def size(cols: SpanColumns) -> int:
    """Number of spans in ``cols``."""
    return len(cols.names)


def as_dict(attributes) -> dict:
    """Attributes as a dict; the SDK's BoundedAttributes backing dict when there is one."""
    inner = getattr(attributes, "_dict", None)
    if type(inner) is dict:
        return inner
    if type(attributes) is dict:
        return attributes
    return dict(attributes or {})


def _dicts(attrs: Sequence) -> list[dict]:
    """Each span's attributes as a dict: the SDK's BoundedAttributes' backing dicts, plain dicts
    (:mod:`kvtrace.telemetry.fastspans`) as they are."""
    kinds = set(map(type, attrs))
    if kinds == {BoundedAttributes}:
        out = list(map(_get_dict, attrs))
        if set(map(type, out)) == {dict}:
            return out
    elif kinds <= {dict}:
        return list(attrs)
    return list(map(as_dict, attrs))


def _per_row(objs: Sequence, convert: Callable) -> list:
    """``convert(obj)`` per row, each distinct object (by identity) converted once."""
    ids = list(map(id, objs))
    done = {key: convert(obj) for key, obj in dict(zip(ids, objs, strict=True)).items()}
    return list(map(done.__getitem__, ids))


def _distinct(objs: Sequence, convert: Callable) -> tuple[list, list[int]]:
    """(``convert(obj)`` per distinct object by identity, each row's index into that list)."""
    ids = list(map(id, objs))
    distinct = dict(zip(ids, objs, strict=True))
    index = {key: i for i, key in enumerate(distinct)}
    return list(map(convert, distinct.values())), list(map(index.__getitem__, ids))


def _state_header(state) -> str:
    return state.to_header() if state else ""


def _items(seqs: Sequence) -> list:
    """The SDK's BoundedLists (events, links) as their backing deques (``len`` in C)."""
    if set(map(type, seqs)) == {BoundedList}:
        return list(map(_get_dq, seqs))
    return list(seqs)


def _ids(ctxs: Sequence, parents: Sequence) -> tuple[list, list, list, list, list]:
    getters = _GET_CTX_FAST if set(map(type, ctxs)) == {SpanContext} else _GET_CTX_PUBLIC
    trace_ids, span_ids, states = (list(map(get, ctxs)) for get in getters)
    has_parent = list(map(is_not, parents, repeat(None)))
    present = list(compress(parents, has_parent))
    parent_ids = (
        list(map(_SPAN_ID, present)) if set(map(type, present)) <= {SpanContext} else [p.span_id for p in present]
    )
    return trace_ids, span_ids, has_parent, parent_ids, _per_row(states, _state_header)


def _status(statuses: Sequence) -> tuple[list, list]:
    get_code, get_desc = _GET_STATUS_FAST if set(map(type, statuses)) == {Status} else _GET_STATUS_PUBLIC
    codes = list(map(get_code, statuses))
    try:
        code_strs = list(map(_STATUS_BY_ID.__getitem__, map(id, codes)))
    except KeyError:
        code_strs = [_STATUS[c] for c in codes]
    return code_strs, list(map(get_desc, statuses))


def _kinds(kinds: Sequence) -> list:
    try:
        return list(map(_KIND_BY_ID.__getitem__, map(id, kinds)))
    except KeyError:
        return [_KIND[k] for k in kinds]


def _events(events_per_span: Sequence) -> tuple[list, list, list, list]:
    per_span = _items(events_per_span)
    counts = list(map(len, per_span))
    events = list(chain.from_iterable(compress(per_span, counts)))
    names, times, attrs = ([*map(get, events)] for get in _GET_EVENT)
    return counts, names, times, list(map(as_dict, attrs))


def _links(links_per_span: Sequence) -> tuple[list, list, list, list, list]:
    per_span = _items(links_per_span)
    counts = list(map(len, per_span))
    links = list(chain.from_iterable(compress(per_span, counts)))
    ctxs, attrs = ([*map(get, links)] for get in _GET_LINK)
    return (
        counts,
        [c.trace_id for c in ctxs],
        [c.span_id for c in ctxs],
        list(map(_state_header, map(attrgetter("trace_state"), ctxs))),
        list(map(as_dict, attrs)),
    )


def _scope(scope) -> tuple[str, str]:
    return (scope.name, scope.version or "") if scope else ("", "")


def span_columns(spans: Sequence) -> SpanColumns:
    """Stage one of the export: the spans' values as :class:`SpanColumns` (row order = input order)."""
    getters = _GET_FAST if set(map(type, spans)) <= _FAST_TYPES else _GET_PUBLIC
    (ctxs, parents, names, kinds, starts, ends, statuses, events, links, resources, scopes, attrs) = (
        list(map(get, spans)) for get in getters
    )
    trace_ids, span_ids, has_parent, parent_ids, states = _ids(ctxs, parents)
    codes, messages = _status(statuses)
    resource_dicts, resource_index = _distinct(resources, lambda r: as_dict(r.attributes))
    scope_pairs, scope_index = _distinct(scopes, _scope)
    return SpanColumns(
        trace_ids,
        span_ids,
        has_parent,
        parent_ids,
        states,
        names,
        _kinds(kinds),
        starts,
        ends,
        codes,
        messages,
        _dicts(attrs),
        *_events(events),
        *_links(links),
        resource_dicts,
        resource_index,
        scope_pairs,
        scope_index,
    )


_PER_SPAN = (
    "trace_ids",
    "span_ids",
    "has_parent",
    "trace_states",
    "names",
    "kinds",
    "starts",
    "ends",
    "status_codes",
    "status_messages",
    "attributes",
    "event_counts",
    "link_counts",
)
_EVENT_FIELDS = ("event_names", "event_times", "event_attributes")
_LINK_FIELDS = ("link_trace_ids", "link_span_ids", "link_states", "link_attributes")


def cut(cols: SpanColumns, lo: int, hi: int) -> SpanColumns:
    """Spans ``lo:hi`` of ``cols`` (the distinct resources and scopes are kept whole)."""
    parts = {f: getattr(cols, f)[lo:hi] for f in _PER_SPAN}
    p0 = sum(cols.has_parent[:lo])
    parts["parent_ids"] = cols.parent_ids[p0 : p0 + sum(parts["has_parent"])]
    for counts, fields in ((cols.event_counts, _EVENT_FIELDS), (cols.link_counts, _LINK_FIELDS)):
        first = sum(counts[:lo])
        last = first + sum(counts[lo:hi])
        parts.update({f: getattr(cols, f)[first:last] for f in fields})
    return SpanColumns(
        **parts,
        resources=cols.resources,
        resource_index=cols.resource_index[lo:hi],
        scopes=cols.scopes,
        scope_index=cols.scope_index[lo:hi],
    )


def join(parts: Sequence[SpanColumns]) -> SpanColumns:
    """One :class:`SpanColumns` of ``parts`` in order (their resource / scope indexes shifted)."""
    if len(parts) == 1:
        return parts[0]
    out = {
        f: list(chain.from_iterable(map(attrgetter(f), parts)))
        for f in SpanColumns._fields
        if f not in ("resource_index", "scope_index")
    }
    for distinct, index in (("resources", "resource_index"), ("scopes", "scope_index")):
        shifts = accumulate((len(getattr(p, distinct)) for p in parts[:-1]), initial=0)
        out[index] = [i + shift for p, shift in zip(parts, shifts, strict=True) for i in getattr(p, index)]
    return SpanColumns(**out)
