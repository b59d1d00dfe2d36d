"""Memory bounds of ``kvtrace collect``: request bodies read and inflated in bounded steps, and
one budget for the bytes of every request in flight.

The OTLP/HTTP receiver reads a body chunk by chunk and inflates ``Content-Encoding: gzip`` (or
``deflate``) bodies itself, at most :data:`STEP` bytes of output per ``zlib`` call, stopping as
soon as the inflated size passes the request limit (413): a 1 MiB body that would inflate to
1 GiB costs at most the limit, not the gigabyte.  Every byte held for a request (read or
inflated) is first taken from a :class:`ByteBudget` shared by both receivers; when the budget is
spent the request is answered "retry later" (HTTP 503, gRPC UNAVAILABLE), so many concurrent
large requests cannot add up past it.  The budget is given back once the request's spans are
queued (the queue bounds its own bytes, :class:`kvtrace.collect.queue.SpanQueue`).
"""

from __future__ import annotations

import threading
import zlib

from kvtrace.collect.receiver import MALFORMED, RETRY, TOO_LARGE, UNSUPPORTED

STEP = 1 << 20
"""Most bytes one inflate step produces (and the unit the budget grows by)."""
MAX_GZIP_MEMBERS = 1024


class RequestRefused(Exception):
    """A request refused before it was parsed; ``kind`` is a :mod:`~kvtrace.collect.receiver`
    outcome kind (``too_large``, ``malformed``, ``unsupported``, ``retry``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ByteBudget:
    """Bytes that requests in flight may hold in total (thread-safe; both receivers share it)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the in-flight byte budget must be >= 1")
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.refusals = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit and self.used:  # one request alone may use it all
                self.refusals += 1
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


class Hold:
    """One request's share of a :class:`ByteBudget`; a context manager that gives it back."""

    def __init__(self, budget: ByteBudget) -> None:
        self.budget, self.held = budget, 0

    def grow(self, n: int) -> None:
        if not self.budget.take(n):
            raise RequestRefused(
                RETRY,
                f"collector busy: {self.budget.used} bytes of requests in flight "
                f"(limit {self.budget.limit}); retry later",
            )
        self.held += n

    def release(self) -> None:
        self.budget.give(self.held)
        self.held = 0

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _too_large(limit: int) -> RequestRefused:
    return RequestRefused(TOO_LARGE, f"request body larger than {limit} bytes (after decompression)")


class Body:
    """Accumulates one request body from raw chunks (:meth:`feed`), inflating it if encoded,
    within ``limit`` bytes and the request's :class:`Hold`; :meth:`finish` returns it."""

    def __init__(self, encoding: str, limit: int, hold: Hold) -> None:
        encoding = (encoding or "identity").strip().lower()
        if encoding not in ("identity", "gzip", "x-gzip", "deflate"):
            raise RequestRefused(UNSUPPORTED, f"Content-Encoding {encoding!r} not supported (use gzip or none)")
        self.encoding, self.limit, self.hold = encoding, limit, hold
        self.data = bytearray()
        self._raw = 0
        self._inflate = None if encoding == "identity" else self._new_inflater(None)
        self._members = 1

    def _new_inflater(self, first: bytes | None):
        if self.encoding == "deflate":  # RFC 1950 zlib; some senders use raw RFC 1951 deflate
            return zlib.decompressobj(15 if first and first[0] & 0x0F == 8 else -15)
        return zlib.decompressobj(31)

    def _append(self, piece: bytes) -> None:
        if len(self.data) + len(piece) > self.limit:
            raise _too_large(self.limit)
        self.hold.grow(len(piece))
        self.data += piece

    def feed(self, chunk: bytes) -> None:
        self._raw += len(chunk)
        if self._raw > self.limit:
            raise _too_large(self.limit)
        if self._inflate is None:
            self._append(chunk)
            return
        if self.encoding == "deflate" and self._raw == len(chunk) and chunk:
            self._inflate = self._new_inflater(chunk)
        try:
            self._inflate_chunk(chunk)
        except zlib.error as exc:
            raise RequestRefused(MALFORMED, f"body is not valid {self.encoding} data: {exc}") from None

    def _inflate_chunk(self, data: bytes) -> None:
        d = self._inflate
        while True:
            if d.eof:
                if not data:
                    return
                if self.encoding == "deflate":
                    raise RequestRefused(MALFORMED, "data after the end of the deflate stream")
                self._members += 1  # concatenated gzip members (RFC 1952 2.2)
                if self._members > MAX_GZIP_MEMBERS:
                    raise RequestRefused(MALFORMED, f"more than {MAX_GZIP_MEMBERS} gzip members")
                d = self._inflate = self._new_inflater(data)
            piece = d.decompress(data, STEP)
            self._append(piece)
            data = d.unconsumed_tail or (d.unused_data if d.eof else b"")
            if not data and not d.eof and len(piece) < STEP:
                return  # input used up, no output held back

    def finish(self) -> bytearray:
        if self._inflate is not None and not self._inflate.eof:
            raise RequestRefused(MALFORMED, f"{self.encoding} body ends before its end-of-stream marker")
        return self.data
