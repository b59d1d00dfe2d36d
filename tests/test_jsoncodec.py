"""The serving paths' JSON codec (the proxy's and the simulated workers') gives the standard
library's results, with or without orjson."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtrace import jsoncodec as codec

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


@given(st.lists(st.sampled_from([b"0", b"9", b"1", b"[", b"{", b"]", b"a", b" ", b"-", b".", b"\xff"]), max_size=80))
@settings(max_examples=400, deadline=None)
def test_the_c_pre_check_answers_as_the_python_one(parts):
    """kvtrace._cjson.orjson_safe (what an install with a compiler runs) = _py_orjson_safe."""
    from support.require import require_vllm

    # the README's test command (KVTRACE_REQUIRE_VLLM=1) builds the extension: fail there, skip elsewhere
    c = require_vllm("kvtrace._cjson").orjson_safe
    data = b"".join(parts)
    for run, limit in ((19, 800), (3, 4), (1, 1), (2, 0)):
        assert c(data, run, limit) == codec._py_orjson_safe(data, run, limit), (data, run, limit)
    assert c(bytearray(data), 19, 800) == c(data, 19, 800)


def test_the_installed_codec_runs_the_c_pre_check():
    from support.require import require_vllm

    assert codec._safe is require_vllm("kvtrace._cjson").orjson_safe
    assert not codec._orjson_safe(b'{"n": 1234567890123456789}') and codec._orjson_safe(b'{"n": 123456789012345678}')
