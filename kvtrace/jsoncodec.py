"""JSON of the serving hot paths: ``orjson`` when it is installed, else the standard library.

Every body the proxy reads (the client request, P's response, D's final/usage chunks, aggregated
streams) goes through :func:`loads`, and every body it writes through :func:`dumps`; so do the
simulated workers' requests, responses and stream chunks.  ``orjson`` is optional (not a kvtrace
dependency; the ``proxy`` and ``sim`` extras install it) and several times faster on these bodies
(docs/benchmarks.md); it is used only where its result equals the standard library's, so the proxy
and the simulator behave the same with or without it:

- :func:`loads`: orjson rejects what it cannot represent as ``json`` does (NaN/Infinity literals,
  numbers that overflow a double, lone surrogates, non-UTF-8, BOMs), and those bodies fall back to
  ``json.loads``.  It reads integers beyond 64 bits as floats and nests deeper than ``json`` may, so
  bodies with a run of 19+ digits or many brackets go to ``json.loads`` directly.
- :func:`dumps`: orjson raises where ``json`` may not (integers beyond 64 bits, deep nesting,
  surrogates, non-str keys) and the call falls back to ``json.dumps``.  It writes non-finite floats
  as ``null`` where ``json`` writes ``NaN``/``Infinity``; those can only come from a ``json.loads``
  fallback, so once one has produced a non-finite float, :func:`dumps` stays on ``json``.  An
  unpaired surrogate (which UTF-8 cannot carry) is written as its ``\\udXXX`` escape, as
  ``json.dumps(ensure_ascii=True)`` writes it, so :func:`dumps` never raises on text.
Numbers may be spelled differently (``1e16`` vs ``1e+16``); they are the same JSON values.

:func:`pack` / :func:`unpack` keep a value as compact bytes and read it back (the conversation
table's entries).  :func:`loads_text` is :func:`loads` for client bodies: it also rejects text with an unpaired
surrogate (:class:`UnpairedSurrogate`), at no cost when orjson decoded the body.
"""

from __future__ import annotations

import json
import math
import re
import sys

try:
    import orjson as _orjson
except ImportError:  # optional accelerator
    _orjson = None  # type: ignore[assignment]  # every use checks for None first

# bytes.translate maps every digit to "0" and anything else to " "; a run of 19 zeros then marks a
# 19+ digit number (faster than a regex search: docs/benchmarks.md)
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_LONG_RUN = 19  # digits: a run this long may be an integer beyond 64 bits
# what a non-finite float can be decoded from: NaN/Infinity literals, or a literal that overflows
_MAYBE_NONFINITE = re.compile(rb"NaN|Infinity|\d[eE]\+?\d{3}|\d{19}")
_NESTING_MARGIN = 200  # stack frames the proxy itself may use below the recursion limit
_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_nonfinite_seen = False


class UnpairedSurrogate(ValueError):
    """The JSON is valid but holds text with an unpaired UTF-16 surrogate (raised by :func:`loads_text`)."""


def loads(data: bytes) -> object:
    """``json.loads(data)``; raises what it raises (ValueError, UnicodeDecodeError, RecursionError)."""
    return _loads(data)[0]


def loads_text(data: bytes) -> object:
    """:func:`loads`, raising :class:`UnpairedSurrogate` when a string of the result holds an
    unpaired surrogate.  Free when orjson decoded the body (it rejects such text, so the body then
    took the ``json`` path, which is checked)."""
    obj, checked = _loads(data)
    if not checked and has_lone_surrogate(data, obj):
        raise UnpairedSurrogate("unpaired UTF-16 surrogate")
    return obj


def _loads(data: bytes) -> tuple[object, bool]:
    """The decoded value, and whether orjson decoded it (then it holds no unpaired surrogate)."""
    if _orjson is not None and _orjson_safe(data):
        try:
            return _orjson.loads(data), True
        except _orjson.JSONDecodeError:
            pass
    obj = json.loads(data)
    if _orjson is not None and not _nonfinite_seen and _MAYBE_NONFINITE.search(data) and _has_nonfinite(obj):
        _saw_nonfinite()
    return obj, False


def dumps(obj: object) -> bytes:
    """Compact UTF-8 JSON (``json.dumps(obj, separators=(",", ":"), ensure_ascii=False)``)."""
    if _orjson is not None and not _nonfinite_seen:
        try:
            return _orjson.dumps(obj)
        except TypeError:  # orjson.JSONEncodeError
            pass
    return _encoder.encode(obj).encode("utf-8", "backslashreplace")


def pack(obj: object) -> bytes:
    """``obj`` as compact bytes for keeping (the conversation table): :func:`unpack` gives it back.

    A one-byte tag says which library wrote it, so :func:`unpack` reads orjson's output with orjson
    directly (it reads back exactly what it wrote) and the rest with ``json``.  The result is a new
    object of exactly its length (orjson's own results keep a 4 KiB+ buffer)."""
    if _orjson is not None and not _nonfinite_seen:
        try:
            return b"o" + _orjson.dumps(obj)
        except TypeError:  # orjson.JSONEncodeError
            pass
    return b"j" + _encoder.encode(obj).encode("utf-8", "backslashreplace")


def unpack(data: bytes) -> object:
    """The value :func:`pack` wrote."""
    if data[:1] == b"o" and _orjson is not None:
        return _orjson.loads(memoryview(data)[1:])
    return json.loads(data[1:])


def has_lone_surrogate(data: bytes, obj: object) -> bool:
    """``obj`` (decoded from ``data``) holds a string with an unpaired UTF-16 surrogate.

    ``json.loads`` produces one from a ``\\udXXX`` escape, from the bytes ``ED A0..BF xx`` (it
    decodes with ``surrogatepass``) or from a UTF-16/32 body; bodies with none of those cost three
    byte searches, the others a walk over their strings.
    """
    if not (
        b"\\ud" in data or b"\\uD" in data or b"\xed" in data or b"\x00" in data[:4] or data[:1] in (b"\xff", b"\xfe")
    ):
        return False
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            if not o.isascii():
                try:
                    o.encode()
                except UnicodeEncodeError:
                    return True
        elif isinstance(o, dict):
            stack.extend(o)
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
    return False


def _py_orjson_safe(data: bytes, run: int, limit: int) -> bool:
    """No run of ``run`` digits (an integer orjson may read as a float) and fewer than ``limit``
    brackets (nesting json may not follow)."""
    if b"0" * run in data.translate(_DIGITS_AS_ZERO):
        return False
    return data.count(b"[") + data.count(b"{") < limit


try:  # the same answer in one pass (kvtrace/_cjson.c), where the extension was built
    from kvtrace._cjson import orjson_safe as _safe
except ImportError:  # pragma: no cover - a build without a compiler
    _safe = _py_orjson_safe


def _orjson_safe(data: bytes) -> bool:
    return _safe(data, _LONG_RUN, sys.getrecursionlimit() - _NESTING_MARGIN)


def _has_nonfinite(obj: object) -> bool:
    """A float ``json`` would write as NaN/Infinity, anywhere in ``obj`` (fallback path only)."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, float):
            if not math.isfinite(o):
                return True
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
    return False


def _saw_nonfinite() -> None:
    global _nonfinite_seen
    _nonfinite_seen = True
