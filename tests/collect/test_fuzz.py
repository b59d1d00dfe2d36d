"""Fuzzing ``kvtrace collect``: the checked-in corpus (:mod:`support.collect_corpus`) and
Hypothesis-generated requests, over OTLP/HTTP and OTLP/gRPC.  Every request gets a 2xx/4xx/503
answer of its own, never a 500 or a dropped connection, and after each one the collector still
accepts a good request and writes it."""

from __future__ import annotations

import base64
import gzip
import http.client
import json

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace.collect.server import Collector

from support.collect_corpus import CASES, JSON, PROTOBUF
from support.otlp_client import export_request, grpc_export
from support.sim_workload import read_rows

HTTP_OK = {200, 400, 413, 415}
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    traces = tmp_path_factory.mktemp("fuzz") / "t"
    with Collector(traces, grpc_address="127.0.0.1:0", http_address="127.0.0.1:0", batch_delay_s=0) as c:
        c.health_checks = 0
        yield c
    written = read_rows(traces)
    assert sum(r["SpanName"] == "health-0" for r in written) == c.health_checks


def _post(port: int, body: bytes, ctype: str, encoding: str | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": ctype, **({"Content-Encoding": encoding} if encoding else {})}
    try:
        conn.request("POST", "/v1/traces", body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _still_healthy(c: Collector) -> None:
    status, _ = _post(c.http_port, export_request(1, name="health").SerializeToString(), PROTOBUF)
    assert status == 200
    response, err = grpc_export(c.grpc_port, export_request(1, name="health").SerializeToString())
    assert err is None
    c.health_checks += 2


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_corpus_over_http(collector, case):
    status, body = _post(collector.http_port, case.body, case.content_type, case.encoding)
    assert status in case.expect, (status, body[:300])
    if status != 200 and status != 415:  # a google.rpc.Status in the request's encoding
        if case.content_type == JSON:
            assert json.loads(body)["message"]
    _still_healthy(collector)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.content_type == PROTOBUF and not c.encoding], ids=lambda case: case.name
)
def test_corpus_over_grpc(collector, case):
    response, err = grpc_export(collector.grpc_port, case.body)
    if case.expect == frozenset({200}):
        assert err is None
    else:
        assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    _still_healthy(collector)


@FUZZ
@given(
    body=st.binary(max_size=2048),
    ctype=st.sampled_from([PROTOBUF, JSON]),
    encoding=st.sampled_from([None, "gzip", "deflate"]),
)
def test_random_bytes(collector, body, ctype, encoding):
    status, _ = _post(collector.http_port, body, ctype, encoding)
    assert status in HTTP_OK
    response, err = grpc_export(collector.grpc_port, body)
    assert err is None or err.code() == grpc.StatusCode.INVALID_ARGUMENT
    _still_healthy(collector)


_GOOD_PROTO = export_request(3, name="mut").SerializeToString()


@FUZZ
@given(data=st.data())
def test_mutated_protobuf(collector, data):
    """Byte flips, truncations and insertions of a valid request (plain and gzip)."""
    body = bytearray(_GOOD_PROTO)
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, len(body) - 1))
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if op == "flip":
            body[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del body[i:]
            if not body:
                break
        else:
            body[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    body = bytes(body)
    zipped = data.draw(st.booleans())
    status, _ = _post(
        collector.http_port, gzip.compress(body) if zipped else body, PROTOBUF, "gzip" if zipped else None
    )
    assert status in {200, 400}
    _still_healthy(collector)


_json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=20)
)
_json_any = st.recursive(
    _json_scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=20,
)
_hex = st.one_of(st.text("0123456789abcdef", min_size=0, max_size=34), st.text(max_size=34))
_any_value = st.recursive(
    st.one_of(
        st.builds(lambda v: {"stringValue": v}, st.text(max_size=30)),
        st.builds(lambda v: {"intValue": v}, st.one_of(st.integers(-(2**64), 2**64), st.text(max_size=5))),
        st.builds(lambda v: {"doubleValue": v}, st.one_of(st.floats(), st.sampled_from(["NaN", "x"]))),
        st.builds(lambda v: {"boolValue": v}, _json_scalar),
        st.builds(
            lambda v: {"bytesValue": v},
            st.one_of(st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()), st.text(max_size=8)),
        ),
        _json_any,
    ),
    lambda inner: st.one_of(
        st.builds(lambda vs: {"arrayValue": {"values": vs}}, st.lists(inner, max_size=3)),
        st.builds(
            lambda kvs: {"kvlistValue": {"values": [{"key": k, "value": v} for k, v in kvs]}},
            st.lists(st.tuples(st.text(max_size=8), inner), max_size=3),
        ),
    ),
    max_leaves=8,
)
_attributes = st.lists(st.fixed_dictionaries({"key": st.text(max_size=12), "value": _any_value}), max_size=4)
_span = st.fixed_dictionaries(
    {"traceId": _hex, "spanId": _hex, "name": st.text(max_size=20)},
    optional={
        "parentSpanId": _hex,
        "kind": st.one_of(st.integers(-2, 9), st.text(max_size=12)),
        "startTimeUnixNano": st.one_of(st.integers(-5, 2**64 + 5), st.text(max_size=22)),
        "endTimeUnixNano": st.integers(0, 2**63),
        "attributes": _attributes,
        "events": st.lists(
            st.fixed_dictionaries({"name": st.text(max_size=8)}, optional={"attributes": _attributes}), max_size=2
        ),
        "links": st.lists(
            st.fixed_dictionaries({"traceId": _hex, "spanId": _hex}, optional={"attributes": _attributes}), max_size=2
        ),
        "status": st.fixed_dictionaries({}, optional={"code": st.integers(-1, 5), "message": st.text(max_size=10)}),
        "junk": _json_any,
    },
)
_document = st.fixed_dictionaries(
    {
        "resourceSpans": st.lists(
            st.fixed_dictionaries(
                {
                    "scopeSpans": st.lists(
                        st.fixed_dictionaries({"spans": st.lists(_span, max_size=3)}, optional={"scope": _json_any}),
                        max_size=2,
                    )
                },
                optional={"resource": st.fixed_dictionaries({"attributes": _attributes})},
            ),
            max_size=2,
        )
    }
)


@FUZZ
@given(doc=_document, zipped=st.booleans())
def test_generated_otlp_json(collector, doc, zipped):
    """OTLP-shaped JSON with arbitrary ids, values, nesting and types (surrogates included:
    Hypothesis text may hold them)."""
    body = json.dumps(doc).encode()
    status, answer = _post(
        collector.http_port, gzip.compress(body) if zipped else body, JSON, "gzip" if zipped else None
    )
    assert status in {200, 400}, answer[:300]
    _still_healthy(collector)
