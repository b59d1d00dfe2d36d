"""The direct chat client's request bytes are the openai SDK's (``json.dumps(ensure_ascii=False,
separators=(",", ":"), allow_nan=False)``), whether orjson writes them or the standard library does."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.agent import direct

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12) | st.sampled_from(
    ["\x00\x1f\x7f", "\u2028", '"\\']
)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([1e-4, 9.9e-5, 1e16, 9.99e15, -0.0, 5e-324])
    | _text
)
_values = st.recursive(
    _scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(_text, c, max_size=4), max_leaves=20
)


def _sdk(body) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


@given(st.dictionaries(_text, _values, max_size=6))
@settings(max_examples=500, deadline=None)
def test_request_bytes_are_the_sdks(body):
    assert direct.sdk_json(body) == _sdk(body)


def test_a_long_conversation_goes_through_orjson_with_the_same_bytes(monkeypatch):
    pytest.importorskip("orjson")
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "word é\n" * 999}] * 30}
    body["temperature"] = 0.7
    assert direct._orjson_writes_as_json(body)
    assert direct.sdk_json(body) == _sdk(body)
    monkeypatch.setattr(direct, "_orjson", None)  # without orjson: the standard library, the same bytes
    assert direct.sdk_json(body) == _sdk(body)


@pytest.mark.parametrize(
    "body",
    [{"t": 1e-05}, {"t": 1e16 * 10}, {"n": 2**64}, {"n": -(2**63) - 1}, {1: "a"}, {"s": ("a",)}],
)
def test_what_orjson_writes_otherwise_takes_the_standard_library(body):
    assert not direct._orjson_writes_as_json(body)
    assert direct.sdk_json(body) == _sdk(body)


def test_a_lone_surrogate_fails_as_the_sdks_encode_fails():
    """orjson refuses it, and the standard library's text cannot be encoded: UnicodeEncodeError both ways."""
    with pytest.raises(UnicodeEncodeError):
        _sdk({"s": "\ud800"})
    with pytest.raises(UnicodeEncodeError):
        direct.sdk_json({"s": "\ud800"})


def test_nan_is_refused_as_the_sdk_refuses_it():
    assert not direct._orjson_writes_as_json({"t": math.nan})
    with pytest.raises(ValueError):
        direct.sdk_json({"t": math.nan})
