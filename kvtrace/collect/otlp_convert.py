"""OTLP ``ExportTraceServiceRequest`` -> an Arrow table in :data:`kvtrace.store.schema.SCHEMA`.

Called by the ``kvtrace collect`` receivers (:mod:`kvtrace.collect.grpc_server`,
:mod:`kvtrace.collect.http_server`) once per export request.  Spans arriving over OTLP land in
exactly the rows kvtrace's own :class:`~kvtrace.store.exporter.ParquetSpanExporter` writes for the
same spans: AnyValues are turned into the Python values the SDK holds and the attribute maps are
built by the same functions of :mod:`kvtrace.store.convert` (one stringification rule, not two).

OTLP/JSON differs from the protobuf JSON mapping in one place: trace and span ids are hex, not
base64 (OTLP spec, "JSON Protobuf Encoding").  :func:`parse_json` rewrites them before handing the
document to protobuf's parser, which also ignores unknown fields as the spec requires.

A span's session id (``session.id``, ``gen_ai.conversation.id``) that is not a valid id
(:func:`kvtrace.semconv.ids.id_problem`: a NUL, a newline, 300 bytes) is dropped from the span, never
stored raw, and counted in :data:`INVALID_SESSION_IDS` (one rate-limited warning line names the
problem, never the value); the span itself is kept.
"""

from __future__ import annotations

import base64
import binascii
import json

import pyarrow as pa
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from kvtrace import semconv as sc
from kvtrace.semconv.ids import id_problem
from kvtrace.store import convert
from kvtrace.store.sanitise import BadValueLog
from kvtrace.store.schema import SCHEMA, SPAN_KIND_UNSPECIFIED, SPAN_KINDS, STATUS_CODES, TS

# OTLP enum value -> ClickHouse spelling (OTLP kinds are the SDK's SpanKind.value + 1)
_KINDS = {0: SPAN_KIND_UNSPECIFIED, **{k + 1: v for k, v in SPAN_KINDS.items()}}
SESSION_KEYS = (sc.SESSION_ID, sc.GEN_AI_CONVERSATION_ID)
INVALID_SESSION_IDS = BadValueLog("kvtrace collect: dropped %d invalid session id attribute(s) (%s)")
"""Session id attributes dropped (``.total``)."""
_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


class MalformedPayload(ValueError):
    """The request body is not a valid OTLP ExportTraceServiceRequest (HTTP 400 / INVALID_ARGUMENT)."""


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """Decode an OTLP/protobuf body."""
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(body)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise MalformedPayload(f"invalid OTLP protobuf payload: {exc}") from None
    return req


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    """Decode an OTLP/JSON body (hex ids, enums as ints or names, unknown fields ignored)."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedPayload(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise MalformedPayload("invalid JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise MalformedPayload("OTLP/JSON body must be an object")
    try:
        for rs in doc.get("resourceSpans") or doc.get("resource_spans") or []:
            for ss in rs.get("scopeSpans") or rs.get("scope_spans") or []:
                for span in ss.get("spans") or []:
                    _hex_ids_to_base64(span)
                    for link in span.get("links") or []:
                        _hex_ids_to_base64(link)
        return json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (AttributeError, TypeError, ValueError, binascii.Error, json_format.ParseError) as exc:
        raise MalformedPayload(f"invalid OTLP/JSON payload: {exc}") from None
    except RecursionError:
        raise MalformedPayload("invalid OTLP/JSON payload: nested too deeply") from None


def _hex_ids_to_base64(obj: dict) -> None:
    for key in _ID_FIELDS:
        value = obj.get(key)
        if isinstance(value, str) and value:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
            except ValueError:
                raise MalformedPayload(f"{key} {value[:40]!r} is not hex") from None


def to_json(message) -> bytes:
    """A response message in OTLP/JSON (lowerCamelCase field names)."""
    return json_format.MessageToJson(message, indent=None).encode()


def any_value(v):
    """An OTLP AnyValue as the Python value the OTel SDK would hold for it."""
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which)


def _attrs(key_values) -> dict:
    return {kv.key: any_value(kv.value) for kv in key_values}


class _Columns:
    """Column lists gathered in one pass over the request."""

    def __init__(self) -> None:
        self.scalars: dict[str, list] = {
            name: []
            for name in (
                "ts",
                "tid",
                "sid",
                "pid",
                "state",
                "name",
                "kind",
                "svc",
                "scope",
                "scope_ver",
                "dur",
                "code",
                "msg",
            )
        }
        self.res_idx: list[int] = []
        self.resources: list[dict] = []
        self.attrs: list[dict] = []
        self.n_events: list[int] = []
        self.n_links: list[int] = []
        self.events: list = []
        self.links: list = []
        self.rejected = 0
        self.reasons: list[str] = []


def _valid(span) -> str | None:
    if len(span.trace_id) != 16 or span.trace_id == bytes(16):
        return "trace_id must be 16 non-zero bytes"
    if len(span.span_id) != 8 or span.span_id == bytes(8):
        return "span_id must be 8 non-zero bytes"
    if len(span.parent_span_id) not in (0, 8):
        return "parent_span_id must be empty or 8 bytes"
    return None


def _without_invalid_ids(attrs: dict) -> dict:
    """``attrs`` minus any session id attribute that is not a valid id (module doc)."""
    for key in SESSION_KEYS:
        if key in attrs:
            problem = id_problem(attrs[key])
            if problem is not None:
                del attrs[key]
                INVALID_SESSION_IDS.note(1, f"{key} {problem}")
    return attrs


def _add_span(c: _Columns, span, svc: str, scope) -> None:
    s = c.scalars
    start = span.start_time_unix_nano
    s["ts"].append(start)
    s["tid"].append(span.trace_id.hex())
    s["sid"].append(span.span_id.hex())
    s["pid"].append(span.parent_span_id.hex())
    s["state"].append(span.trace_state)
    s["name"].append(span.name)
    s["kind"].append(_KINDS.get(span.kind, "Unspecified"))
    s["svc"].append(svc)
    s["scope"].append(scope.name)
    s["scope_ver"].append(scope.version)
    s["dur"].append(max(0, span.end_time_unix_nano - start) if span.end_time_unix_nano else 0)
    s["code"].append(STATUS_CODES.get(span.status.code, STATUS_CODES[0]))
    s["msg"].append(span.status.message)
    c.attrs.append(_without_invalid_ids(_attrs(span.attributes)))
    c.n_events.append(len(span.events))
    c.n_links.append(len(span.links))
    c.events.extend(span.events)
    c.links.extend(span.links)


def _gather(req: ExportTraceServiceRequest) -> _Columns:
    c = _Columns()
    for rs in req.resource_spans:
        res = _attrs(rs.resource.attributes)
        svc = res.get(sc.SERVICE_NAME)
        svc = "" if svc is None else str(svc)
        r_index = len(c.resources)
        c.resources.append(res)
        for ss in rs.scope_spans:
            for span in ss.spans:
                problem = _valid(span)
                if problem:
                    c.rejected += 1
                    if problem not in c.reasons:
                        c.reasons.append(problem)
                    continue
                _add_span(c, span, svc, ss.scope)
                c.res_idx.append(r_index)
    return c


def _nested(c: _Columns) -> list[pa.Array]:
    """Events.* and Links.* columns (ClickHouse Nested layout), as kvtrace.store.convert does."""
    ev_off = convert.offsets(c.n_events)
    ln_off = convert.offsets(c.n_links)
    ev, ln = c.events, c.links
    return [
        pa.ListArray.from_arrays(ev_off, pa.array([e.time_unix_nano for e in ev], pa.int64()).cast(TS)),
        pa.ListArray.from_arrays(ev_off, pa.array([e.name for e in ev], pa.string())),
        pa.ListArray.from_arrays(ev_off, convert.string_maps([_attrs(e.attributes) for e in ev])),
        pa.ListArray.from_arrays(ln_off, pa.array([lk.trace_id.hex() for lk in ln], pa.string())),
        pa.ListArray.from_arrays(ln_off, pa.array([lk.span_id.hex() for lk in ln], pa.string())),
        pa.ListArray.from_arrays(ln_off, pa.array([lk.trace_state for lk in ln], pa.string())),
        pa.ListArray.from_arrays(ln_off, convert.string_maps([_attrs(lk.attributes) for lk in ln])),
    ]


def request_to_table(req: ExportTraceServiceRequest) -> tuple[pa.Table, int, str]:
    """(table in SCHEMA, rejected span count, rejection reason) for one export request.

    Spans with invalid ids are rejected (reported back as OTLP partial success); every other
    span becomes one row, in request order.
    """
    c = _gather(req)
    s = c.scalars
    take = pa.array(c.res_idx, pa.int32())
    span_map, int_map, float_map = convert.attribute_maps(c.attrs)
    columns = [
        pa.array(s["ts"], pa.int64()).cast(TS),
        pa.array(s["tid"], pa.string()),
        pa.array(s["sid"], pa.string()),
        pa.array(s["pid"], pa.string()),
        pa.array(s["state"], pa.string()),
        pa.array(s["name"], pa.string()),
        pa.array(s["kind"], pa.string()),
        pa.array(s["svc"], pa.string()),
        convert.string_maps(c.resources).take(take),
        pa.array(s["scope"], pa.string()),
        pa.array(s["scope_ver"], pa.string()),
        span_map,
        pa.array(s["dur"], pa.int64()),
        pa.array(s["code"], pa.string()),
        pa.array(s["msg"], pa.string()),
        *_nested(c),
        int_map,
        float_map,
    ]
    table = pa.Table.from_arrays(columns, schema=SCHEMA)
    return table, c.rejected, "; ".join(c.reasons)
