"""Checked-in corpus of hostile and odd OTLP requests for ``kvtrace collect``.

Each :class:`Case` is a request body, its Content-Type and Content-Encoding, and the HTTP
statuses allowed in answer (never 500).  Bodies are built by code so the corpus stays small and
readable; the names say what each one is.  ``tests/collect/test_fuzz.py`` sends every case over
OTLP/HTTP (protobuf cases over gRPC too) and checks the collector still answers a good request
after each; Hypothesis then explores around them.
"""

from __future__ import annotations

import gzip
import json
import struct
import zlib
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
TRACE_ID, SPAN_ID = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    content_type: str
    expect: frozenset
    encoding: str | None = None


def _json_span(**fields) -> bytes:
    span = {
        "traceId": TRACE_ID,
        "spanId": SPAN_ID,
        "name": "op",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000000001000",
        **fields,
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


def _raw_json_span(fragment: str) -> bytes:
    """A span whose JSON text contains ``fragment`` verbatim (escapes json.dumps would not write)."""
    return (
        f'{{"resourceSpans":[{{"scopeSpans":[{{"spans":[{{"traceId":"{TRACE_ID}","spanId":"{SPAN_ID}",{fragment}}}]}}]}}]}}'
    ).encode()


def _nested_kvlist(depth: int) -> str:
    """JSON text of an AnyValue nesting ``depth`` kvlists (text: json.dumps would recurse)."""
    return '{"kvlistValue":{"values":[{"key":"k","value":' * depth + '{"stringValue":"leaf"}' + "}]}}" * depth


def _proto_nested_anyvalue(depth: int) -> bytes:
    """Protobuf bytes of a request whose one attribute nests ``depth`` array values."""
    # AnyValue.array_value = field 5 (ArrayValue), ArrayValue.values = field 1 (AnyValue)
    inner = b"\x0a\x01x"  # AnyValue.string_value = "x"
    for _ in range(depth):
        array = b"\x0a" + _varint(len(inner)) + inner
        inner = b"\x2a" + _varint(len(array)) + array
    kv = b"\x0a\x01k" + b"\x12" + _varint(len(inner)) + inner  # KeyValue(key, value)
    span = (
        b"\x0a\x10"
        + bytes.fromhex(TRACE_ID)
        + b"\x12\x08"
        + bytes.fromhex(SPAN_ID)
        + b"\x2a\x02op"
        + b"\x4a"
        + _varint(len(kv))
        + kv
    )  # trace_id, span_id, name, attributes(9)
    scope_spans = b"\x12" + _varint(len(span)) + span
    resource_spans = b"\x12" + _varint(len(scope_spans)) + scope_spans
    return b"\x0a" + _varint(len(resource_spans)) + resource_spans


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _invalid_utf8_name() -> bytes:
    good = _proto_span_name(b"ab")
    return good.replace(b"\x2a\x02ab", b"\x2a\x02\xff\xfe")


def _proto_span_name(name: bytes) -> bytes:
    span = (
        b"\x0a\x10"
        + bytes.fromhex(TRACE_ID)
        + b"\x12\x08"
        + bytes.fromhex(SPAN_ID)
        + b"\x2a"
        + _varint(len(name))
        + name
    )
    scope_spans = b"\x12" + _varint(len(span)) + span
    resource_spans = b"\x12" + _varint(len(scope_spans)) + scope_spans
    return b"\x0a" + _varint(len(resource_spans)) + resource_spans


def bomb(inflated: int, encoding: str = "gzip") -> bytes:
    """A ``gzip`` (or zlib, ``deflate``) body of ``inflated`` zero bytes (a multiple of 1 MiB),
    about 1/1000 of that on the wire.  Built from one compressed MiB: after a full flush the
    compressor starts afresh, so every further MiB of zeros compresses to the same bytes."""
    mib = 1 << 20
    zeros, z = bytes(mib), zlib.compressobj(9, zlib.DEFLATED, -15)
    block = z.compress(zeros) + z.flush(zlib.Z_FULL_FLUSH)
    last = z.compress(zeros) + z.flush()
    deflate = block * (inflated // mib - 1) + last
    if encoding == "deflate":
        adler = 1
        for _ in range(inflated // mib):
            adler = zlib.adler32(zeros, adler)
        return b"\x78\xda" + deflate + struct.pack(">I", adler)
    crc = 0
    for _ in range(inflated // mib):
        crc = zlib.crc32(zeros, crc)
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + deflate + struct.pack("<II", crc, inflated & 0xFFFFFFFF)


OK, BAD = frozenset({200}), frozenset({400})
GOOD_JSON = _json_span()

CASES = [
    # malformed ids and encodings: once answered 500
    Case("json-non-hex-trace-id", _json_span(traceId="zz" * 16), JSON, BAD),
    Case("json-odd-length-span-id", _json_span(spanId="abc"), JSON, BAD),
    Case("json-100k-deep-array", b'{"resourceSpans":' + b"[" * 100_000 + b"]" * 100_000 + b"}", JSON, BAD),
    Case(
        "json-100k-deep-attribute",
        _raw_json_span(
            '"name":"op","attributes":[{"key":"k","value":'
            + '{"arrayValue":{"values":[' * 100_000
            + '{"stringValue":"x"}'
            + "]}}" * 100_000
            + "}]"
        ),
        JSON,
        BAD,
    ),
    Case(
        "gzip-header-on-plain-protobuf",
        ExportTraceServiceRequest().SerializeToString() + b"\x0a\x00",
        PROTOBUF,
        BAD,
        "gzip",
    ),
    Case("gzip-header-on-plain-json", GOOD_JSON, JSON, BAD, "gzip"),
    # text that is not valid UTF-8, and bodies that expand without bound
    Case("json-unpaired-surrogate-in-name", _raw_json_span('"name":"op-\\ud800"'), JSON, BAD),
    Case(
        "json-unpaired-surrogate-in-attribute",
        _raw_json_span('"name":"op","attributes":[{"key":"gen_ai.conversation.id","value":{"stringValue":"\\udfff"}}]'),
        JSON,
        BAD,
    ),
    Case(
        "json-unpaired-surrogate-in-key",
        _raw_json_span('"name":"op","attributes":[{"key":"\\ud800","value":{"intValue":"1"}}]'),
        JSON,
        BAD,
    ),
    Case("gzip-bomb-1gib", bomb(1 << 30), PROTOBUF, frozenset({413}), "gzip"),
    Case("deflate-bomb-256mib", bomb(256 << 20, "deflate"), PROTOBUF, frozenset({413}), "deflate"),
    # encodings
    Case("gzip-truncated", gzip.compress(GOOD_JSON)[:-9], JSON, BAD, "gzip"),
    Case("gzip-good", gzip.compress(GOOD_JSON), JSON, OK, "gzip"),
    Case("gzip-two-members", gzip.compress(GOOD_JSON[:20]) + gzip.compress(GOOD_JSON[20:]), JSON, OK, "gzip"),
    Case("deflate-zlib", zlib.compress(GOOD_JSON), JSON, OK, "deflate"),
    Case("encoding-br", GOOD_JSON, JSON, frozenset({415}), "br"),
    Case("encoding-identity", GOOD_JSON, JSON, OK, "identity"),
    # JSON shapes
    Case("json-not-utf8", b'{"resourceSpans":[{"x":"\xff\xfe"}]}', JSON, BAD),
    Case("json-null", b"null", JSON, BAD),
    Case("json-array", b"[]", JSON, BAD),
    Case("json-number", b"5", JSON, BAD),
    Case("json-resource-spans-string", b'{"resourceSpans":"x"}', JSON, BAD),
    Case("json-scope-spans-number", b'{"resourceSpans":[{"scopeSpans":5}]}', JSON, BAD),
    Case("json-span-not-object", b'{"resourceSpans":[{"scopeSpans":[{"spans":[5]}]}]}', JSON, BAD),
    Case("json-links-not-list", _json_span(links=7), JSON, BAD),
    Case("json-unknown-kind-ignored", _json_span(kind="SPAN_KIND_NOPE"), JSON, OK),  # unknown enum names: ignored
    Case("json-int-overflow", _json_span(startTimeUnixNano="1" + "0" * 30), JSON, BAD),
    Case("json-int-value-float", _raw_json_span('"attributes":[{"key":"k","value":{"intValue":1.5}}]'), JSON, BAD),
    Case(
        "json-nested-kvlist-30",
        _raw_json_span(f'"name":"op","attributes":[{{"key":"k","value":{_nested_kvlist(30)}}}]'),
        JSON,
        OK,
    ),
    Case(
        "json-nested-kvlist-200",
        _raw_json_span(f'"name":"op","attributes":[{{"key":"k","value":{_nested_kvlist(200)}}}]'),
        JSON,
        frozenset({200, 400}),
    ),
    Case(
        "json-nested-kvlist-5000",
        _raw_json_span(f'"name":"op","attributes":[{{"key":"k","value":{_nested_kvlist(5000)}}}]'),
        JSON,
        BAD,
    ),
    Case(
        "json-double-nan-inf",
        _raw_json_span(
            '"attributes":[{"key":"a","value":{"doubleValue":"NaN"}},{"key":"b","value":{"doubleValue":"-Infinity"}}]'
        ),
        JSON,
        OK,
    ),
    Case("json-end-before-start", _json_span(endTimeUnixNano="1"), JSON, OK),
    Case("json-zero-trace-id", _json_span(traceId="0" * 32), JSON, OK),  # rejected span: partial success
    Case("json-empty-object", b"{}", JSON, OK),
    Case("json-unknown-fields", b'{"resourceSpans":[],"extra":{"deep":[1,2,3]}}', JSON, OK),
    # protobuf shapes
    Case("proto-empty", b"", PROTOBUF, OK),
    Case("proto-garbage", b"\xff\xff\xff\xff not protobuf", PROTOBUF, BAD),
    Case("proto-truncated-length", b"\x0a\xff\xff\xff\x0f", PROTOBUF, BAD),
    Case("proto-invalid-utf8-name", _invalid_utf8_name(), PROTOBUF, BAD),
    Case("proto-anyvalue-nested-20", _proto_nested_anyvalue(20), PROTOBUF, OK),
    Case("proto-anyvalue-nested-10000", _proto_nested_anyvalue(10_000), PROTOBUF, BAD),
    Case("proto-name-with-nul", _proto_span_name(b"a\x00b"), PROTOBUF, OK),
]
