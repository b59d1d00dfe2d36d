"""The proxy's JSON codec gives the standard library's results, with or without orjson."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace.proxy import codec

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # includes integers beyond 64 bits
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _same(a, b) -> bool:
    """Equal values of equal types (an int must not come back as a float)."""
    return repr(a) == repr(b)


@pytest.fixture(params=["orjson", "stdlib"])
def backend(request, monkeypatch):
    if request.param == "orjson":
        pytest.importorskip("orjson")
    else:
        monkeypatch.setattr(codec, "_orjson", None)
    monkeypatch.setattr(codec, "_nonfinite_seen", False)
    return request.param


@given(value=_values)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_round_trip_equals_stdlib(value, backend):
    raw = json.dumps(value).encode()
    assert _same(codec.loads(raw), json.loads(raw))
    std = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    assert _same(json.loads(codec.dumps(value)), json.loads(std))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"max_tokens": 18446744073709551616}',  # beyond 64 bits: stays an int
        b'{"n": -9223372036854775809}',
        b'{"t": 1e400}',  # overflows a double
        b'{"t": NaN, "u": [-Infinity]}',
        b'\xef\xbb\xbf{"a": 1}',  # BOM
        '{"a": "\u00e9"}'.encode("utf-16"),
        b'{"s": "\\ud800"}',  # lone surrogate
        b'{"a": 1, "a": 2}',
    ],
)
def test_edge_inputs_decode_like_stdlib(raw, backend):
    assert _same(codec.loads(raw), json.loads(raw))


@pytest.mark.parametrize("raw", [b"{", b"\xff", b"[" * 5000 + b"]" * 5000, b'{"a": 1}x'])
def test_errors_are_stdlib_errors(raw, backend):
    with pytest.raises(Exception) as std:
        json.loads(raw)
    with pytest.raises(std.type):
        codec.loads(raw)


def test_nonfinite_floats_are_written_as_stdlib_writes_them(backend):
    obj = codec.loads(b'{"t": NaN, "u": [1e999, -Infinity], "v": 2}')
    out = codec.dumps({"body": obj})
    assert out == b'{"body":{"t":NaN,"u":[Infinity,-Infinity],"v":2}}'
    assert math.isnan(json.loads(out)["body"]["t"])
    assert codec.dumps({"big": 2**70, 1: "k"}) == b'{"big":1180591620717411303424,"1":"k"}'


@pytest.mark.parametrize(
    ("raw", "unpaired"),
    [
        (b'{"s": "\\ud800"}', True),  # lone high surrogate escape
        (b'{"s": ["x", {"k\\udfff": 1}]}', True),  # lone low surrogate, in a key
        (b'{"s": "\xed\xa0\x80"}', True),  # its UTF-8-style bytes (json decodes with surrogatepass)
        ('{"s": "\ud800"}'.encode("utf-16", "surrogatepass"), True),  # a UTF-16 body
        (b'{"s": "\\ud83d\\ude00"}', False),  # a valid pair: one character
        (b'{"s": "\\\\ud800"}', False),  # an escaped backslash: plain text
        ('{"s": "\ud55c\uad6d\uc5b4"}'.encode(), False),  # Hangul (bytes ED xx xx) is text
    ],
)
def test_loads_text_rejects_unpaired_surrogates(raw, unpaired, backend):
    if unpaired:
        with pytest.raises(codec.UnpairedSurrogate):
            codec.loads_text(raw)
    else:
        assert _same(codec.loads_text(raw), json.loads(raw))


def test_dumps_never_raises_on_text(backend):
    out = codec.dumps({"s": "a\ud800b", "k\udfff": ["\ud83d"]})
    assert json.loads(out) == {"s": "a\ud800b", "k\udfff": ["\ud83d"]}  # the escapes json.dumps would write
    out.decode("utf-8")  # valid UTF-8


_kept = st.recursive(
    _scalars | st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010, exclude_categories=()), max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@given(value=_kept)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_pack_unpack_round_trip(value, backend):
    packed = codec.pack(value)
    assert _same(codec.unpack(packed), json.loads(json.dumps(value)))  # big ints stay ints, surrogates survive
    assert packed[:1] in (b"o", b"j")


def test_pack_is_exact_size(backend):
    import tracemalloc

    value = {"remote_block_ids": [[1, 2, 3]], "remote_engine_id": "d"}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [codec.pack(value) for _ in range(1000)]
        held = (tracemalloc.get_traced_memory()[0] - before) / len(kept)
    finally:
        tracemalloc.stop()
    assert held < len(kept[0]) + 100, held  # not orjson's 4 KiB buffer
