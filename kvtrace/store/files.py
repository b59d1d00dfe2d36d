"""File naming of a trace directory, and the reader's view of which files hold the data.

Writers (:mod:`kvtrace.store.exporter`) name files ``<writer>-b<seq>.parquet`` (one exported
batch) and ``<writer>-s<first>-<last>.parquet`` (a rolled segment: that writer's batch files of
the same partition directory with ``first <= seq <= last``, merged).  Superseded batch files stay
on disk for a short grace period so a reader holding an older listing can finish, then
:func:`sweep` deletes them (:func:`sweep_tree`: a whole trace directory, for leftovers of a killed
writer).  :func:`list_files` (used by :mod:`kvtrace.store.reader`) returns every complete file
exactly once: dot-files (``.tmp`` files being written) are ignored and covered batch files are
dropped, so no span is ever counted twice.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

SUFFIX = ".parquet"
_BATCH = re.compile(r"^(?P<writer>.+)-b(?P<seq>\d+)\.parquet$")
_SEGMENT = re.compile(r"^(?P<writer>.+)-s(?P<first>\d+)-(?P<last>\d+)\.parquet$")
_SEQ_DIGITS = 8


@dataclass(frozen=True)
class FileName:
    writer: str
    first: int
    last: int
    segment: bool


def batch_name(writer: str, seq: int) -> str:
    return f"{writer}-b{seq:0{_SEQ_DIGITS}d}{SUFFIX}"


def segment_name(writer: str, first: int, last: int) -> str:
    return f"{writer}-s{first:0{_SEQ_DIGITS}d}-{last:0{_SEQ_DIGITS}d}{SUFFIX}"


def tmp_name(final_name: str) -> str:
    """Dot-name a file is written under before the atomic rename to ``final_name``."""
    return f".{final_name}.tmp"


def parse_name(name: str) -> FileName | None:
    m = _SEGMENT.match(name)
    if m:
        return FileName(m["writer"], int(m["first"]), int(m["last"]), True)
    m = _BATCH.match(name)
    if m:
        seq = int(m["seq"])
        return FileName(m["writer"], seq, seq, False)
    return None


def _parse_dir(names: list[str]) -> tuple[dict[str, FileName | None], dict[str, list[tuple[int, int, str]]]]:
    parsed = {n: parse_name(n) for n in names if n.endswith(SUFFIX) and not n.startswith(".")}
    segments: dict[str, list[tuple[int, int, str]]] = {}
    for name, p in parsed.items():
        if p is not None and p.segment:
            segments.setdefault(p.writer, []).append((p.first, p.last, name))
    return parsed, segments


def _covering(p: FileName | None, segments: dict[str, list[tuple[int, int, str]]]) -> str | None:
    """Name of the segment that supersedes batch file ``p``, if any."""
    if p is None or p.segment:
        return None
    for lo, hi, name in segments.get(p.writer, ()):
        if lo <= p.first <= hi:
            return name
    return None


def _visible(names: list[str]) -> list[str]:
    """Of one directory's file names, those a reader should read (covered batches dropped)."""
    parsed, segments = _parse_dir(names)
    return [n for n, p in parsed.items() if _covering(p, segments) is None]


def superseded(names: list[str]) -> dict[str, str]:
    """Covered batch-file name -> name of the segment (same writer, same directory) covering it."""
    parsed, segments = _parse_dir(names)
    out = {}
    for name, p in parsed.items():
        seg = _covering(p, segments)
        if seg is not None:
            out[name] = seg
    return out


def list_files(directory: str | os.PathLike) -> list[str]:
    """Every complete Parquet file under ``directory`` that holds live data, sorted.

    Raises ``FileNotFoundError`` when ``directory`` does not exist.
    """
    root = os.fspath(directory)
    if not os.path.isdir(root):
        raise FileNotFoundError(root)
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        out.extend(os.path.join(dirpath, n) for n in _visible(filenames))
    out.sort()
    return out


def sweep(directory: str, *, superseded_age_s: float, tmp_age_s: float, now: float | None = None) -> int:
    """Delete, in one partition directory, batch files whose covering segment was written more
    than ``superseded_age_s`` ago, and abandoned ``.tmp`` files (a crashed writer's) older than
    ``tmp_age_s``.  Any writer may sweep any directory; races with another sweeper are
    harmless.  Returns the number of files deleted."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    doomed = [(n, seg, superseded_age_s) for n, seg in superseded(names).items()]
    doomed += [(n, n, tmp_age_s) for n in names if n.startswith(".") and n.endswith(".tmp")]
    deleted = 0
    for name, clock, min_age in doomed:
        try:
            if min_age <= 0 or now - os.stat(os.path.join(directory, clock)).st_mtime >= min_age:
                os.unlink(os.path.join(directory, name))
                deleted += 1
        except FileNotFoundError:
            pass
    return deleted


def sweep_tree(directory: str | os.PathLike, *, superseded_age_s: float, tmp_age_s: float) -> int:
    """:func:`sweep` every directory under ``directory`` (dot-directories skipped); returns the
    number of files deleted (0 when ``directory`` does not exist)."""
    deleted = 0
    for dirpath, dirnames, _ in os.walk(os.fspath(directory)):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        deleted += sweep(dirpath, superseded_age_s=superseded_age_s, tmp_age_s=tmp_age_s)
    return deleted
