"""Admission of bytes against the free space of a trace directory's disk.

A full disk is known before a write: :class:`DiskSpace` admits a write (or a request that will be
written later, ``kvtrace collect``'s queue) only while its estimated bytes fit in the disk's free
space less a reserve (``KVTRACE_MIN_FREE_MIB``, ``kvtrace collect --min-free-mib``).

The bookkeeping, under one lock: ``free`` is the last ``os.statvfs`` reading (blocks available to
unprivileged users), ``since`` the bytes written since that reading (files complete, rounded up to
whole blocks), ``reserved`` the bytes admitted and not written yet.  :meth:`reserve` admits ``n``
only while ``free - since - reserved - min_free >= n``: two admissions never share the same free
bytes, and a reading is never trusted beyond what was taken from it since.  The reading is renewed
every ``refresh_s`` (``KVTRACE_DISK_REFRESH_MS``; ``statvfs`` per request would cost a syscall, a
network round trip on NFS) and whenever an admission would fail (space freed by someone else is
seen at once: the collector resumes by itself).  Only other processes writing the same disk within
one refresh can take more than the reserve; their writes then fail as before (the collector keeps
what it acknowledged and retries, the exporters count the batch as dropped).

Estimates: a batch file costs :data:`FILE_OVERHEAD` bytes (twice the Parquet footer of the span
schema) plus ``ratio`` x its Arrow bytes.  ``ratio`` is the largest seen over the last
:data:`RATIO_WINDOW` batch files, plus :data:`RATIO_MARGIN`; before the first write it is
:data:`DEFAULT_RATIO` (Arrow bytes as they are: kvtrace's Parquet files are always smaller).
A too-low estimate is caught by the next reading; a too-high one only refuses a little early.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable

FOOTER_BYTES = 8 << 10
"""About what a batch file of the span schema costs besides its rows (footer, page headers)."""
FILE_OVERHEAD = 2 * FOOTER_BYTES
"""Bytes added per file to an estimate: the footer, with as much again to spare (and a block)."""
DEFAULT_RATIO = 1.0
RATIO_MARGIN = 0.05
RATIO_WINDOW = 32


class NoSpace(OSError):
    """A write refused before it started: it would not fit in the free space less the reserve."""


class DiskSpace:
    """Free bytes of ``directory``'s disk that writes may still take (see module doc); thread-safe."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        min_free_bytes: int,
        refresh_s: float,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    ) -> None:
        if min_free_bytes < 0:
            raise ValueError("min_free_bytes must be >= 0")
        self.directory = os.fspath(directory)
        self.min_free_bytes = min_free_bytes
        self.refresh_s = refresh_s
        self._statvfs = statvfs
        self._lock = threading.Lock()
        self._free = 0
        self._block = 4096
        self._read_at = -math.inf
        self._since = 0
        self._reserved = 0
        self._ratios: deque[float] = deque(maxlen=RATIO_WINDOW)
        self.readings = 0
        self.refusals = 0
        with self._lock:
            self._read(time.monotonic())

    # -- estimates -------------------------------------------------------------------------
    @property
    def ratio(self) -> float:
        """Bytes on disk per Arrow byte used by :meth:`estimate`."""
        return (max(self._ratios) + RATIO_MARGIN) if self._ratios else DEFAULT_RATIO

    def estimate(self, arrow_bytes: int, files: int = 1) -> int:
        """Bytes a table of ``arrow_bytes`` will take once written as ``files`` batch files."""
        return math.ceil(arrow_bytes * self.ratio) + files * FILE_OVERHEAD

    # -- admission -------------------------------------------------------------------------
    def reserve(self, n: int) -> bool:
        """Admit ``n`` bytes (held until :meth:`release`) if they fit; else False."""
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= self.refresh_s:
                self._read(now)
            if not self._fits(n):
                self._read(now)  # freed meanwhile? (a stale reading must not refuse for long)
                if not self._fits(n):
                    self.refusals += 1
                    return False
            self._reserved += n
            return True

    def release(self, n: int) -> None:
        """Give back a reservation (its bytes were written, and :meth:`wrote` said so, or dropped)."""
        with self._lock:
            self._reserved = max(0, self._reserved - n)

    def wrote(self, file_bytes: int, files: int = 1, arrow_bytes: int = 0) -> None:
        """``files`` complete files of ``file_bytes`` in all were written since the last reading;
        ``arrow_bytes``: the Arrow bytes they hold (a batch: learns the ratio; 0 for a merge)."""
        with self._lock:
            self._since += file_bytes + files * self._block  # each file's last block, rounded up
            if arrow_bytes:
                self._ratios.append(max(0.0, file_bytes - files * FOOTER_BYTES) / arrow_bytes)

    def available(self) -> int:
        """Bytes a reservation could take now, by the last reading (negative: below the reserve)."""
        with self._lock:
            return self._free - self._since - self._reserved - self.min_free_bytes

    def health(self) -> dict:
        with self._lock:
            return {
                "free_bytes": self._free - self._since,
                "reserved_bytes": self._reserved,
                "min_free_bytes": self.min_free_bytes,
                "refusals": self.refusals,
            }

    def describe(self) -> str:
        """One line: why a reservation was refused."""
        h = self.health()
        return (
            f"not enough free disk space in {self.directory}: {h['free_bytes']} bytes free, "
            f"{h['reserved_bytes']} reserved for spans not written yet, {h['min_free_bytes']} kept free"
        )

    # -- internals (caller holds the lock) -------------------------------------------------------
    def _fits(self, n: int) -> bool:
        return self._free - self._since - self._reserved - self.min_free_bytes >= n

    def _read(self, now: float) -> None:
        try:
            st = self._statvfs(_existing(self.directory))
        except OSError:
            return  # the write itself will say what is wrong; keep the last reading
        self._free = st.f_bavail * st.f_frsize
        self._block = st.f_frsize or 4096
        self._since = 0
        self._read_at = now
        self.readings += 1


def _existing(path: str) -> str:
    """``path`` or its nearest existing parent (a trace directory is created on the first write)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path
