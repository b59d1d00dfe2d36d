"""Values Arrow cannot store as text, made storable: one bad value never costs a batch.

:mod:`kvtrace.store.convert` builds every string column with :func:`strings`.  Its fast path is
one ``pa.array(values, pa.string())`` call; only when Arrow refuses the column (a ``str`` holding
an unpaired surrogate such as ``"\\ud800"``, which has no UTF-8 form; bytes that are not UTF-8;
an object that is not text at all) is the column converted value by value:

- a ``str`` with surrogates keeps its text, each unencodable code point written as a Python
  backslash escape (``"a\\ud800b"`` -> ``"a\\\\ud800b"``, i.e. the six characters ``\\ud800``);
- ``bytes`` that are not UTF-8 likewise (``b"\\xff"`` -> ``"\\\\xff"``);
- any other object becomes ``str(obj)`` (escaped the same way), or ``"<unconvertible TYPE>"``
  when even ``str`` fails.

Values are sanitised, never dropped: the span keeps the attribute, and the rest of the column
and of the batch is written unchanged.  Each sanitised column is reported to :data:`BAD_VALUES`,
which logs one warning line naming where the value was (column, attribute key; never the value:
it may be prompt text) and then at most one line per ``interval_s`` with the count since.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import pyarrow as pa

log = logging.getLogger("kvtrace.store")

LOG_INTERVAL_S = 60.0


class BadValueLog:
    """Rate-limited reporting of sanitised values: the first report is logged at once, later
    ones at most once per ``interval_s`` (their counts add up into the next line)."""

    def __init__(self, message: str, interval_s: float = LOG_INTERVAL_S) -> None:
        self.message, self.interval_s = message, interval_s
        self.total = 0
        self._pending = 0
        self._last: float | None = None
        self._lock = threading.Lock()

    def note(self, count: int, where: str) -> None:
        with self._lock:
            self.total += count
            self._pending += count
            now = time.monotonic()
            if self._last is not None and now - self._last < self.interval_s:
                return
            count, self._pending, self._last = self._pending, 0, now
        log.warning(self.message + " (at most one such line per %.0f s)", count, where, self.interval_s)

    def reset(self) -> None:
        with self._lock:
            self.total = self._pending = 0
            self._last = None


BAD_VALUES = BadValueLog(
    "kvtrace: %d value(s) could not be stored as UTF-8 text (latest in %s); "
    "written with backslash escapes, every span kept"
)
DROPPED_SPANS = BadValueLog(
    "kvtrace: %d span(s) could not be converted at all and were dropped (latest: %s); "
    "the rest of their batches was written"
)


def text(value) -> str:
    """``value`` as storable text (see module doc)."""
    if type(value) is str:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    try:
        return text(str(value))
    except Exception:
        return f"<unconvertible {type(value).__name__}>"


def _storable(value) -> bool:
    if value is None:
        return True
    if type(value) is str:
        try:
            value.encode("utf-8")
            return True
        except UnicodeEncodeError:
            return False
    if isinstance(value, bytes):
        try:
            value.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False
    return False


def strings(values: Sequence, where: str, label: Callable[[int], str] | None = None) -> pa.Array:
    """``pa.array(values, pa.string())``; when Arrow refuses it, the same column with each
    unstorable value replaced by :func:`text` of it, reported as being in ``where`` (or in
    ``label(i)`` of the first bad value's index ``i``)."""
    try:
        return pa.array(values, pa.string())
    except (ValueError, TypeError):  # UnicodeEncodeError, ArrowInvalid, ArrowTypeError
        pass
    out = list(values)
    bad = [i for i, v in enumerate(out) if not _storable(v)]
    for i in bad:
        out[i] = text(out[i])
    if bad:
        BAD_VALUES.note(len(bad), label(bad[0]) if label else where)
    return pa.array(out, pa.string())
