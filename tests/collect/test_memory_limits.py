"""kvtrace collect's memory bounds and the answers for bad encodings:
compressed bodies are inflated in bounded steps and stop at the limit, all requests in flight
share one byte budget, the queue is bounded in bytes.  Memory is measured on a real collector
subprocess (``VmHWM``, its peak resident set, from /proc); loads are bounded, on 127.0.0.1."""

from __future__ import annotations

import concurrent.futures as cf
import gzip
import os
import zlib

import pytest
from google.rpc import code_pb2, status_pb2

from kvtrace import semconv as sc
from kvtrace.collect.limits import STEP, Body, ByteBudget, Hold, RequestRefused
from kvtrace.collect.receiver import MALFORMED, RETRY, TOO_LARGE, UNSUPPORTED

from support.collect_corpus import bomb
from support.otlp_client import export_request, post, post_until_accepted, start_cli, stop_cli
from support.sim_workload import read_rows

MIB = 1 << 20
pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc (Linux)")


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def healthy(port: int, name: str = "health") -> bool:
    return post(port, export_request(1, name=name).SerializeToString())[0] == 200


def test_the_bombs_are_what_they_claim():
    assert gzip.decompress(bomb(8 * MIB)) == bytes(8 * MIB)
    assert zlib.decompress(bomb(8 * MIB, "deflate")) == bytes(8 * MIB)


@pytest.fixture(scope="module")
def bomb_1gib() -> bytes:
    return bomb(1 << 30)


def test_eight_concurrent_gzip_bombs_stay_bounded(tmp_path, bomb_1gib):
    """8 senders each POST 1 MiB of gzip that inflates to 1 GiB.  Before: all answered 413 but
    the collector peaked at 2.3 GB (7.3 GB in the report) and kept it.  Now each is inflated
    in 1 MiB steps and dropped at the 64 MiB limit."""
    assert len(bomb_1gib) < 1.1 * MIB
    proc, port, _ = start_cli(tmp_path / "t")
    try:
        base = peak_rss_mb(proc.pid)
        with cf.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: post(port, bomb_1gib, {"Content-Encoding": "gzip"}), range(8)))
        assert {status for status, _ in answers} <= {413, 503}, answers
        assert [status for status, _ in answers].count(413) >= 1
        status = status_pb2.Status.FromString(next(body for s, body in answers if s == 413))
        assert status.code == code_pb2.RESOURCE_EXHAUSTED and "after decompression" in status.message
        peak = peak_rss_mb(proc.pid)
        assert peak < 500, f"peak RSS {peak:.0f} MB (started at {base:.0f} MB)"
        assert healthy(port)
    finally:
        out = stop_cli(proc)
    assert "1 spans written, 0 lost" in out


def test_many_large_requests_are_capped_by_the_byte_budgets(tmp_path):
    """16 concurrent one-span requests of 16 MiB each (256 MiB in all) against a 32 MiB
    in-flight budget and a 32 MiB queue: those over a budget are told to retry later (503 +
    Retry-After), memory stays bounded, and a refused request sent again once the queue has
    drained is stored.  Before (the queue counted spans only, bodies were read whatever their
    number): all 16 taken at once, 576 MB peak; now about 255 MB."""
    req = export_request(1, name="big")
    attr = req.resource_spans[0].scope_spans[0].spans[0].attributes.add()
    # the bulk in an attribute that may be long (a session id is at most 256 bytes: dropped)
    attr.key, attr.value.string_value = sc.GEN_AI_REQUEST_MODEL, "x" * (16 * MIB)
    body = req.SerializeToString()
    proc, port, _ = start_cli(tmp_path / "t", "--otlp-grpc", "off", "--max-inflight-mib", "32", "--max-queue-mib", "32")
    try:
        with cf.ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(lambda _: post(port, body)[0], range(16)))
        assert set(statuses) <= {200, 503} and 503 in statuses, statuses
        peak = peak_rss_mb(proc.pid)
        assert peak < 400, f"peak RSS {peak:.0f} MB"
        assert post_until_accepted(port, body) == 200  # a refused sender's retry
    finally:
        out = stop_cli(proc)
    stored = statuses.count(200) + 1
    assert f"{stored} spans written, 0 lost" in out
    rows = read_rows(tmp_path / "t")
    assert len(rows) == stored and all(len(r["SpanAttributes"][sc.GEN_AI_REQUEST_MODEL]) == 16 * MIB for r in rows)


# -- Body: bounded inflation, encodings ----------------------------------------------------------


def _body(data_chunks, encoding="gzip", limit=64 * MIB, budget=None) -> bytes:
    with Hold(budget or ByteBudget(1 << 40)) as hold:
        body = Body(encoding, limit, hold)
        for chunk in data_chunks:
            body.feed(chunk)
        return bytes(body.finish())


def _chunks(data: bytes, size: int = 4096) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_encodings_inflate_exactly():
    payload = os.urandom(3000) + bytes(5 * STEP) + b"tail"  # forces several bounded steps
    assert _body(_chunks(gzip.compress(payload))) == payload
    assert _body(_chunks(gzip.compress(payload[:10]) + gzip.compress(payload[10:]))) == payload  # 2 members
    assert _body(_chunks(zlib.compress(payload)), "deflate") == payload
    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    assert _body(_chunks(raw.compress(payload) + raw.flush()), "deflate") == payload  # raw deflate
    assert _body(_chunks(payload), "identity") == payload
    assert _body([payload], "") == payload


@pytest.mark.parametrize(
    "chunks, encoding, kind, words",
    [
        ([b"\x0a\x00 not gzip"], "gzip", MALFORMED, "not valid gzip"),
        ([gzip.compress(b"x" * 100)[:-12]], "gzip", MALFORMED, "ends before"),
        ([b""], "gzip", MALFORMED, "ends before"),
        ([zlib.compress(b"abc") + b"junk"], "deflate", MALFORMED, "after the end"),
        ([b"x"], "br", UNSUPPORTED, "'br' not supported"),
        ([gzip.compress(bytes(3 * MIB + 1))], "gzip", TOO_LARGE, "after decompression"),
        ([bytes(2 * MIB), bytes(MIB + 1)], "identity", TOO_LARGE, "larger than"),
        ([gzip.compress(b"")] * 1025, "gzip", MALFORMED, "1024 gzip members"),
    ],
)
def test_bad_bodies_are_refused_with_their_reason(chunks, encoding, kind, words):
    with pytest.raises(RequestRefused) as err:
        _body(chunks, encoding, limit=3 * MIB)
    assert err.value.kind == kind and words in str(err.value)


def test_inflation_stops_at_the_limit_after_bounded_work():
    budget = ByteBudget(1 << 40)
    with pytest.raises(RequestRefused):
        _body([bomb(256 * MIB)], limit=8 * MIB, budget=budget)
    assert budget.peak <= 8 * MIB and budget.used == 0  # never past the limit; all given back


def test_the_budget_refuses_a_second_request_not_a_lone_one():
    budget = ByteBudget(10 * MIB)
    with Hold(budget) as first:
        first.grow(12 * MIB)  # alone: may exceed (a request larger than the budget still gets through)
        with pytest.raises(RequestRefused) as err, Hold(budget) as second:
            second.grow(1)
        assert err.value.kind == RETRY and "retry later" in str(err.value)
    assert budget.used == 0 and budget.refusals == 1


def test_http_encoding_answers(tmp_path):
    """Over HTTP: gzip accepted, fake gzip 400 (was 500), unknown encoding 415, an announced
    Content-Length over the limit 413 without reading the body."""
    proc, port, _ = start_cli(tmp_path / "t", "--otlp-grpc", "off", "--max-request-mib", "1")
    try:
        assert (
            post(port, gzip.compress(export_request(3, name="gz").SerializeToString()), {"Content-Encoding": "gzip"})[0]
            == 200
        )
        status, body = post(port, b"\x0a\x00 not gzip", {"Content-Encoding": "gzip"})
        assert status == 400 and status_pb2.Status.FromString(body).code == code_pb2.INVALID_ARGUMENT
        assert post(port, b"x", {"Content-Encoding": "br"})[0] == 415
        assert post(port, bytes(2 * MIB))[0] == 413
        assert healthy(port)
    finally:
        out = stop_cli(proc)
    assert "4 spans written, 0 lost" in out
