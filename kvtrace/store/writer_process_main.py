"""The writer process of :mod:`kvtrace.store.writer_process`:
``python -m kvtrace.store.writer_process_main DIR OPTIONS``.

Reads frames from stdin (``HEADER`` = tag, batch number, length; then the payload): ``S`` frames
carry a pickled :class:`~kvtrace.store.spancols.SpanColumns` slice, an ``E`` frame ends a batch,
which is then converted (:func:`kvtrace.store.exporter.columns_table`: a span that cannot be
converted is dropped alone) and written as one batch file by a
:class:`~kvtrace.store.exporter.ParquetSpanExporter` (``OPTIONS``: its keyword arguments, JSON).
Each batch is answered on stdout with one line, ``ok <batch> <spans>`` or ``fail <batch> 0
<reason>`` (a ``kvtrace.semconv.DROP_*`` value), once its file is complete (or the write failed).

At the end of stdin (the exporting process closed the pipe, or died) the complete slices of an
unfinished batch are written too, the exporter is shut down (pending batch files rolled into
segments) and the process exits 0.  It runs in its own session, so a Ctrl-C or a signal to the
exporting process's group does not reach it; SIGINT is ignored and SIGTERM only sets a limit of
:data:`TERM_GRACE_S` on the wait for the end of stdin (the exporting process is normally flushing
into it at that moment), after which it writes what it has and exits the same way.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys

from kvtrace import semconv as sc
from kvtrace.store import spancols
from kvtrace.store.exporter import ParquetSpanExporter, columns_table
from kvtrace.store.writer_process import HEADER, TAG_END, TAG_SPANS

TERM_GRACE_S = 10


class _Stop(Exception):
    """SIGTERM's grace ran out."""


def _read_exact(stream, n: int) -> bytes | None:
    """``n`` bytes, or None at the end of the stream (a partial frame counts as the end)."""
    data = stream.read(n)
    return data if len(data) == n else None


def _write(exporter: ParquetSpanExporter, parts: list) -> tuple[int | None, str]:
    """Write one batch (its slices joined): (spans written, "") or, on failure, (None, the
    ``DROP_*`` reason: ``write_failed`` when the directory refused the file)."""
    if not parts:
        return 0, ""
    try:
        table = columns_table(spancols.join(parts))
    except Exception as exc:  # not one span converts
        print(f"kvtrace writer: a batch of {sum(map(spancols.size, parts))} spans failed: {exc}", file=sys.stderr)
        return None, sc.DROP_EXPORT_FAILED
    if exporter.export_table(table).name == "SUCCESS":
        return table.num_rows, ""
    return None, exporter.failure_reason or sc.DROP_EXPORT_FAILED


def _on_term(signum, frame) -> None:
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(TERM_GRACE_S)


_writing = False  # a batch is being written: the grace's end waits for it (see _on_alarm)
_stop_due = False


def _on_alarm(signum, frame) -> None:
    """SIGTERM's grace is over: stop reading stdin, but never in the middle of writing a batch (its
    slices would be neither in the file nor left for the final write)."""
    global _stop_due
    if _writing:
        _stop_due = True
    else:
        raise _Stop


def serve(directory: str, options: dict, stdin, answers) -> int:
    """Serve frames from ``stdin`` until its end; answers go to ``answers`` (binary, unbuffered)."""
    global _writing
    exporter = ParquetSpanExporter(directory, **options)
    parts: list = []
    try:
        while True:
            head = _read_exact(stdin, HEADER.size)
            if head is None:
                break
            tag, seq, length = HEADER.unpack(head)
            payload = _read_exact(stdin, length) if length else b""
            if payload is None:
                break
            if tag == TAG_SPANS:
                parts.append(pickle.loads(payload))
            elif tag == TAG_END:
                _writing = True
                try:
                    written, reason = _write(exporter, parts)
                    parts = []
                finally:
                    _writing = False
                if written is not None:
                    answers.write(b"ok %d %d\n" % (seq, written))
                else:
                    answers.write(b"fail %d 0 %s\n" % (seq, reason.encode()))
                if _stop_due:
                    raise _Stop
    except _Stop:
        pass
    finally:
        signal.alarm(0)
        try:
            _write(exporter, parts)  # a batch whose end never came: its complete slices
        finally:
            exporter.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    directory, options = (argv or sys.argv[1:])[:2]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints of any library go to stderr, never into the answers
    return serve(directory, json.loads(options), sys.stdin.buffer, answers)


if __name__ == "__main__":
    sys.exit(main())
