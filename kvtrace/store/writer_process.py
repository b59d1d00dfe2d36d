"""``WriterProcessExporter``: Parquet export whose costly part runs in a writer process.

Why: converting a batch to Arrow and writing Parquet holds the GIL for milliseconds, and in the
proxy (an asyncio event loop) or inside vLLM's scheduler that is milliseconds of stall for every
request in flight.  Here the exporting process only does stage one of the export
(:func:`kvtrace.store.spancols.span_columns`: read the SDK's spans into lists of builtins) and
pickles the result, :data:`SLICE_SPANS` spans at a time, sleeping :data:`YIELD_S` between slices so
a thread waiting for the GIL gets it at once (a thread that just computes would keep it for the
interpreter's whole switch interval, 5 ms by default).  The frames go through a pipe to
``python -m kvtrace.store.writer_process_main``, which converts them (stage two) and writes them with a
:class:`~kvtrace.store.exporter.ParquetSpanExporter`, one batch file per ``export`` call, exactly as
the in-process exporter would.

Durability is the store's (:mod:`kvtrace.store.exporter`): ``export`` returns SUCCESS once the
writer reports the batch's file complete; ``shutdown`` (SIGTERM, via :func:`kvtrace.configure`)
closes the pipe and waits for the writer to write what it got, roll and exit, so nothing exported
is lost.  Should the exporting process be SIGKILLed, the writer reads the end of the pipe, writes
the complete slices it received and exits: only the spans not handed over yet (the batch in
flight) are lost.  A batch the writer could not write (full disk) is answered as failed with its
reason (:attr:`WriterProcessExporter.failure_reason`, ``write_failed``); the writer keeps running
and logs such failures once per episode.  Failures never hang or raise into the host: a writer that dies, or takes more
than ``timeout_s`` (``KVTRACE_WRITER_TIMEOUT_S``; plus :data:`STARTUP_S` for a new writer's first
batch: its imports) to take or write a batch, is killed; that batch
fails (the SDK processor's caller counts it as dropped) and the next export starts a new writer,
at once after the first failure, then after a back-off that doubles per further failure in a
row (up to :data:`MAX_BACKOFF_S`).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Literal

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.store import spancols

log = logging.getLogger(__name__)

SLICE_SPANS = 64  # spans converted and pickled per GIL-holding slice (its cost: docs/benchmarks.md)
YIELD_S = 0.0002  # pause between slices: a thread waiting for the GIL takes it meanwhile
MAX_BACKOFF_S = 60.0
STARTUP_S = 60.0  # added to the timeout until a new writer answered its first batch (imports)
HEADER = struct.Struct("!cQI")  # tag, batch sequence number, payload length
TAG_SPANS, TAG_END = b"S", b"E"
_live: weakref.WeakSet[WriterProcessExporter] = weakref.WeakSet()


class WriterFailed(Exception):
    """The writer process died, hung past the timeout, or could not be started."""


class WriterProcessExporter(SpanExporter):
    """Hand spans to a writer process that writes them into ``directory`` (see module doc).

    The keyword arguments are :class:`~kvtrace.store.exporter.ParquetSpanExporter`'s, used by the
    writer; ``timeout_s`` bounds every wait for the writer."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        roll_bytes: int | None = None,
        roll_seconds: float | None = None,
        grace_seconds: float | None = None,
        fsync: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        self.directory = os.fspath(directory)
        self.options = {
            k: v
            for k, v in dict(
                roll_bytes=roll_bytes, roll_seconds=roll_seconds, grace_seconds=grace_seconds, fsync=fsync
            ).items()
            if v is not None
        }
        self.timeout_s = float(settings.WRITER_TIMEOUT_S.get(timeout_s))
        self._lock = threading.Lock()
        self._writer: _Writer | None = None
        self._closed = False
        self._seq = 0
        self._backoff = 0.0
        self._not_before = 0.0
        self.restarts = 0  # writers started after the first
        self.failure_reason: str | None = None  # a DROP_* reason of the last failed export
        self.max_slice_cpu_s = 0.0  # longest GIL-holding slice so far (thread CPU time)
        _live.add(self)

    @property
    def writer_pid(self) -> int | None:
        """The current writer process's pid (None before the first export or after a failure)."""
        writer = self._writer
        return writer.proc.pid if writer is not None else None

    # -- SpanExporter interface ------------------------------------------------------------
    def export(self, spans: Sequence) -> SpanExportResult:
        if self._closed:
            log.warning("kvtrace: Parquet exporter already shut down; dropping %d spans", len(spans))
            self.failure_reason = sc.DROP_EXPORT_FAILED
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        with self._lock:
            self.failure_reason = sc.DROP_EXPORT_FAILED
            writer = self._running()
            if writer is None:
                return SpanExportResult.FAILURE
            self._seq += 1
            try:
                for lo in range(0, len(spans), SLICE_SPANS):
                    if lo:
                        time.sleep(YIELD_S)
                    payload = self._encode(spans[lo : lo + SLICE_SPANS])
                    if payload:
                        writer.send(TAG_SPANS, self._seq, payload)
                writer.send(TAG_END, self._seq, b"")
                ok = writer.reply(self._seq)
            except Exception as exc:  # WriterFailed, or a slice that cannot be encoded: never into the host
                # the writer is replaced, so the slices of this batch already sent never join the next one
                self._failed(writer, f"{exc}; {len(spans)} spans lost")
                return SpanExportResult.FAILURE
            self._backoff = 0.0
            if ok is True:
                return SpanExportResult.SUCCESS
            self.failure_reason = ok  # the writer kept running: it logs its own failures, once per episode
            return SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here: a successful export is already in a complete file."""
        return True

    def shutdown(self) -> None:
        """Close the pipe and wait (at most ``timeout_s``) for the writer to write what it got,
        roll its batch files into segments and exit; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            writer, self._writer = self._writer, None
        if writer is not None and not writer.finish(self.timeout_s):
            log.error(
                "kvtrace: Parquet writer process for %s did not finish within %.0f s; killed",
                self.directory,
                self.timeout_s,
            )

    # -- internals -------------------------------------------------------------------------
    def _encode(self, spans: Sequence) -> bytes:
        """Stage one + pickle of one slice; the slice's spans that cannot be read are dropped
        (logged, like a span the writer cannot convert)."""
        t0 = time.thread_time()
        try:
            cols = _columns(spans)
            if cols is None:
                return b""
            try:
                payload = pickle.dumps(cols, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # a value that is not a builtin (spans from outside the SDK)
                payload = pickle.dumps(_plain(cols), protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            self.max_slice_cpu_s = max(self.max_slice_cpu_s, time.thread_time() - t0)
        return payload

    def _running(self) -> _Writer | None:
        """The live writer, started if needed (None while backing off after a failure)."""
        writer = self._writer
        if writer is not None and writer.pid == os.getpid() and writer.alive():
            return writer
        if writer is not None and writer.pid == os.getpid():
            self._failed(writer, f"writer process exited ({writer.proc.poll()})")
        if time.monotonic() < self._not_before:
            return None
        try:
            self._writer = _Writer.start(self.directory, self.options, self.timeout_s)
        except OSError as exc:
            self._failed(None, f"cannot start the writer process: {exc}")
            return None
        if self._seq:
            self.restarts += 1
        return self._writer

    def _failed(self, writer: _Writer | None, why: str) -> None:
        log.error("kvtrace: Parquet writer process for %s: %s", self.directory, why)
        if writer is not None:
            writer.kill()
        self._writer = None
        # the first failure after a success restarts at once; each further one waits longer
        self._not_before = time.monotonic() + self._backoff
        self._backoff = min(max(self._backoff * 2, 1.0), MAX_BACKOFF_S)


def _columns(spans: Sequence) -> spancols.SpanColumns | None:
    """:func:`spancols.span_columns`; spans it cannot read on their own are left out."""
    try:
        return spancols.span_columns(spans)
    except Exception:
        if len(spans) == 1:
            from kvtrace.store.sanitise import DROPPED_SPANS

            DROPPED_SPANS.note(1, f"span {getattr(spans[0], 'name', '?')!r}: unreadable")
            return None
    mid = len(spans) // 2
    parts = [c for c in (_columns(spans[:mid]), _columns(spans[mid:])) if c is not None]
    return spancols.join(parts) if parts else None


def _plain(cols: spancols.SpanColumns) -> spancols.SpanColumns:
    """``cols`` with every attribute value pickle refuses stringified as the writer would."""
    from kvtrace.store.convert import _tuple_to_str

    def fix(d: dict) -> dict:
        out = {}
        for k, v in d.items():
            try:
                pickle.dumps(v)
            except Exception:
                v = _tuple_to_str(v)
            out[k] = v
        return out

    return cols._replace(
        **{
            f: [fix(d) for d in getattr(cols, f)]
            for f in ("attributes", "event_attributes", "link_attributes", "resources")
        }
    )


class _Writer:
    """One writer process and the two pipe ends this process holds."""

    def __init__(self, proc: subprocess.Popen, to_fd: int, from_fd: int, timeout_s: float) -> None:
        self.proc, self.to_fd, self.from_fd = proc, to_fd, from_fd
        self.pid = os.getpid()
        self.buffer = b""
        self.timeout_s = timeout_s
        self.answered = False

    @classmethod
    def start(cls, directory: str, options: dict, timeout_s: float) -> _Writer:
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvtrace.store.writer_process_main", directory, json.dumps(options)],
                stdin=to_r,
                stdout=from_w,
                start_new_session=True,
            )
        except BaseException:
            for fd in (to_r, to_w, from_r, from_w):
                os.close(fd)
            raise
        os.close(to_r)
        os.close(from_w)
        os.set_blocking(to_w, False)
        return cls(proc, to_w, from_r, timeout_s)

    @staticmethod
    def _wait(fd: int, event: int, left_s: float) -> bool:
        """Whether ``fd`` is ready for ``event`` within ``left_s`` (poll: select() refuses
        descriptors >= 1024, which a proxy with many sockets open hands out)."""
        poller = select.poll()
        poller.register(fd, event)
        return bool(poller.poll(left_s * 1000))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _limit(self) -> float:
        return self.timeout_s if self.answered else self.timeout_s + STARTUP_S

    def send(self, tag: bytes, seq: int, payload: bytes) -> None:
        data = memoryview(HEADER.pack(tag, seq, len(payload)) + payload)
        deadline = time.monotonic() + self._limit()
        while data:
            try:
                n = os.write(self.to_fd, data)
            except BlockingIOError:
                n = 0
            except OSError as exc:  # EPIPE: the writer is gone
                raise WriterFailed(f"writer process gone ({exc.strerror})") from None
            data = data[n:]
            if data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WriterFailed(f"writer process took no data for {self._limit():.0f} s")
                self._wait(self.to_fd, select.POLLOUT, left)

    def reply(self, seq: int) -> Literal[True] | str:
        """Wait for the writer's answer to batch ``seq``: True when written, else the reason why not."""
        deadline = time.monotonic() + self._limit()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WriterFailed(f"writer process did not answer within {self._limit():.0f} s")
            if self._wait(self.from_fd, select.POLLIN, left):
                chunk = os.read(self.from_fd, 4096)
                if not chunk:
                    raise WriterFailed(f"writer process exited ({self.proc.wait()})")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        self.answered = True
        status, got, *rest = line.split()
        if int(got) != seq:
            raise WriterFailed(f"writer process answered batch {int(got)}, not {seq}")
        if status == b"ok":
            return True
        return rest[1].decode() if len(rest) > 1 else sc.DROP_EXPORT_FAILED

    def finish(self, timeout_s: float) -> bool:
        """Close the pipe; wait for the writer to exit (kill it after ``timeout_s``)."""
        self._close()
        try:
            self.proc.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def kill(self) -> None:
        self._close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _close(self) -> None:
        for fd in (self.to_fd, self.from_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.to_fd = self.from_fd = -1


def _after_fork_in_child() -> None:
    """A forked child must not write into its parent's pipes (frames would interleave) nor keep
    them open (the writer would never see their end): close them; the child starts its own writer."""
    for exporter in list(_live):
        writer, exporter._writer = exporter._writer, None
        if writer is not None:
            writer._close()
        exporter._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
