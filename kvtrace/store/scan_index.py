"""Per-file indexes of the breakdown's scan: each immutable trace file classified once, not per query.

The breakdown and the agent joins read one scan of the store (``kvtrace_scan``:
:data:`~kvtrace.store.views.agents.SCAN_SQL`), which classifies every span by convention and reads
its names, attribute maps and ids on every query.  A published trace file never changes
(:mod:`kvtrace.store.writer`), so that scan's rows for one file can be written once beside it and
read instead: an *index*, a small Parquet file of the scan's 13 narrow columns for the spans that
have a role (the rest of a store's spans are not in it).

- **Where**: ``<file's directory>/.kvtrace-scan/<file name>.<key>.kvscan``: a dot-directory
  (:func:`kvtrace.store.files.list_files` and the sweeps skip it) and not ``*.parquet`` (a plain
  glob such as ``read_parquet('DIR/**/*.parquet')`` does not read it).
- **Key**: a hash of the file's size and mtime (ns) and of the scan's SQL, so a file replaced in
  place, or a kvtrace whose scan differs, finds no index and is read itself; such stale indexes,
  and those of files gone, are deleted by the next :func:`build` (:func:`sweep`).
- **Who builds**: :func:`build`, which :func:`kvtrace.store.connect` runs unless read-only,
  ``kvtrace compact`` and ``kvtrace dashboard`` run before serving (and, while it serves, a
  :class:`Keeper` every ``KVTRACE_SCAN_INDEX_SECONDS``, for files rolled since); files smaller than
  ``KVTRACE_SCAN_INDEX_MIN_BYTES`` are left out (their scan costs little).  Read-only connections
  (the dashboard's, ``kvtrace query --read-only``) read the indexes they find and write none.
- **Failures** (a full disk, a directory without write permission) are logged, one line per
  :func:`build` and each file once per process, and change no result: that file is scanned as
  before.  An index is written under a unique dot-name and renamed into place, and only if the
  file still has the size and mtime it was read with.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import duckdb

from kvtrace import settings
from kvtrace.store import lookup, partials
from kvtrace.store.schema import SCHEMA
from kvtrace.store.sql import glob_escape, literal
from kvtrace.store.views.agents import SCAN_SQL
from kvtrace.store.views.raw import RAW, READ_FILES
from kvtrace.store.views.spans import SPANS

log = logging.getLogger(__name__)

INDEX_DIR = ".kvtrace-scan"
SUFFIX = ".kvscan"
TMP_MAX_AGE_S = 3600.0  # an unfinished index older than this was abandoned by a killed builder
VERSION = hashlib.sha256(
    (SCAN_SQL + SPANS.select + str(SCHEMA) + lookup.VERSION_TEXT + partials.VERSION_TEXT).encode()
).hexdigest()[:16]
"""What an index's rows depend on besides the file: the scan, the ``spans`` view it reads, the
schema, and the lookups and partials written with it (:mod:`kvtrace.store.lookup`,
:mod:`kvtrace.store.partials`)."""
SIDECARS = (SUFFIX, *lookup.SUFFIXES, *partials.SUFFIXES)
"""The files kept per trace file: the scan index, its lookups and its partials."""
_failed: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) whose build failed: logged once


def index_path(path: str, st: os.stat_result | None = None) -> str:
    """Where the current index of trace file ``path`` is (whether it exists or not)."""
    st = st or os.stat(path)
    key = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:{VERSION}".encode()).hexdigest()[:16]
    directory, name = os.path.split(path)
    return os.path.join(directory, INDEX_DIR, f"{name}.{key}{SUFFIX}")


def current(path: str) -> str | None:
    """The current index of ``path``, or None (none built, or only a stale one)."""
    return sidecars(path).get(SUFFIX)


def sidecars(path: str) -> dict[str, str]:
    """The current index of ``path`` and its lookups that exist, by suffix (:data:`SIDECARS`; empty:
    none built, or only stale ones)."""
    try:
        stem = index_path(path)[: -len(SUFFIX)]
    except FileNotFoundError:
        return {}
    return {suffix: stem + suffix for suffix in SIDECARS if os.path.isfile(stem + suffix)}


def build_one(path: str, *, threads: int | None = None) -> str | None:
    """Write the index of trace file ``path`` and its lookups; the index's path, or None when the
    file changed meanwhile.  Raises what writing raises (the caller decides whether that matters:
    :func:`build` logs it)."""
    st = os.stat(path)
    target = index_path(path, st)
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    stem = os.path.join(directory, f".{os.path.basename(target)[: -len(SUFFIX)]}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    tmps = {suffix: f"{stem}{suffix}.tmp" for suffix in SIDECARS}
    con = duckdb.connect(config={"threads": threads} if threads else {})
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.sql(READ_FILES, params={"files": [glob_escape(path)]}).create_view(RAW)
        con.execute(SPANS.create())
        con.execute(f"COPY ({SCAN_SQL}) TO {literal(tmps[SUFFIX])} {lookup.COPY_OPTIONS}")
        for view, suffix, _ in lookup.KINDS:
            con.execute(lookup.copy_sql(view, RAW, literal(tmps[suffix])))
        for partial in partials.PARTIALS:
            con.execute(partials.copy_sql(partial, literal(tmps[partial.suffix])))
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            _unlink(tmps.values())
            return None
        # the index last: a reader that finds it finds the others
        for suffix in (*lookup.SUFFIXES, *partials.SUFFIXES, SUFFIX):
            os.replace(tmps[suffix], target[: -len(SUFFIX)] + suffix)
    except BaseException:
        _unlink(tmps.values())
        raise
    finally:
        con.close()
    return target


def _unlink(paths: Iterable[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except OSError:
            pass


def build(paths: Iterable[str], *, min_bytes: int | None = None, threads: int | None = None) -> list[str]:
    """Build the missing indexes of trace files ``paths`` (complete kvtrace Parquet files, as
    :func:`kvtrace.store.reader.trace_files` lists them) of at least ``min_bytes``
    (``KVTRACE_SCAN_INDEX_MIN_BYTES``; negative: none), then :func:`sweep` their directories.
    Returns the indexes built; files whose index cannot be written are skipped, and logged in one
    line (each file version once per process).  ``threads`` files are indexed at once (default: one
    per core), each on one DuckDB thread (a file of one row group is read on one thread anyway); a
    single file gets them all."""
    limit = settings.SCAN_INDEX_MIN_BYTES.get(min_bytes)
    todo: list[tuple[str, os.stat_result]] = []
    directories = set()
    for path in paths:
        directories.add(os.path.dirname(path))
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if limit < 0 or st.st_size < limit or os.path.isfile(index_path(path, st)):
            continue
        todo.append((path, st))
    workers = max(1, min(len(todo), threads or os.cpu_count() or 1))
    each = 1 if workers > 1 else threads

    def attempt(item: tuple[str, os.stat_result]) -> str | BaseException | None:
        try:
            return build_one(item[0], threads=each)
        except (OSError, duckdb.Error) as exc:
            return exc

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvtrace-index") as pool:
        outcomes = list(pool.map(attempt, todo))
    built = [out for out in outcomes if isinstance(out, str)]
    failed: list[tuple[str, BaseException]] = []
    for (path, st), out in zip(todo, outcomes, strict=True):
        if isinstance(out, BaseException) and (path, st.st_size, st.st_mtime_ns) not in _failed:
            _failed.add((path, st.st_size, st.st_mtime_ns))
            failed.append((path, out))
    if failed:  # one line per call, not per file: a read-only mount fails them all
        n = len(failed)
        what = f"{n} trace file{'s' if n > 1 else ''}"
        log.warning("kvtrace: no scan index for %s (read whole instead): %s: %s", what, *failed[0])
    for directory in sorted(directories):
        sweep(directory)
    return built


def sweep(directory: str, *, now: float | None = None) -> int:
    """Delete the indexes in ``directory``'s index directory that are not current (their file gone
    or changed, or written by another version of the scan) and abandoned unfinished ones; returns
    how many.  Never raises: a sweep that cannot delete leaves the files for the next one."""
    index_dir = os.path.join(directory, INDEX_DIR)
    try:
        names = os.listdir(index_dir)
    except OSError:
        return 0
    now = time.time() if now is None else now
    deleted = 0
    for name in names:
        full = os.path.join(index_dir, name)
        try:
            if name.startswith("."):
                doomed = name.endswith(".tmp") and now - os.stat(full).st_mtime > TMP_MAX_AGE_S
            elif name.endswith(SIDECARS):
                suffix = next(x for x in SIDECARS if name.endswith(x))
                source = os.path.join(directory, name[: -len(suffix)].rsplit(".", 1)[0])
                doomed = not os.path.isfile(source) or index_path(source)[: -len(SUFFIX)] + suffix != full
            else:
                doomed = False
            if doomed:
                os.unlink(full)
                deleted += 1
        except OSError:
            continue
    try:
        os.rmdir(index_dir)  # only when empty
    except OSError:
        pass
    return deleted


class Keeper(threading.Thread):
    """A daemon thread that builds the missing indexes of ``directories`` every ``interval`` s
    (``KVTRACE_SCAN_INDEX_SECONDS``; 0: it does nothing), listing each with ``list_files`` (a
    directory's complete trace files): ``kvtrace dashboard`` runs one while it serves, so files
    rolled by a live writer get an index without the pages' read-only connections writing one.
    Never raises: a pass that fails is logged once per episode and tried again next time."""

    def __init__(
        self, directories: Iterable[str], list_files: Callable[[str], list[str]], interval: float | None = None
    ) -> None:
        super().__init__(name="kvtrace-scan-index", daemon=True)
        self.directories = list(directories)
        self.list_files = list_files
        self.interval = float(settings.SCAN_INDEX_SECONDS.get(interval))
        self.passes = 0
        self._stop_event = threading.Event()
        self._passed = threading.Condition()
        self._failing = False

    def run(self) -> None:
        if self.interval <= 0:
            return
        while not self._stop_event.wait(self.interval):
            self.run_once()

    def run_once(self) -> None:
        """One pass over every directory."""
        try:
            for directory in self.directories:
                build(self.list_files(directory))
            self._failing = False
        except Exception as exc:  # a store mid-rewrite, a directory gone: the next pass tries again
            if not self._failing:
                log.warning("kvtrace: building scan indexes failed (retried every %s s): %s", self.interval, exc)
            self._failing = True
        with self._passed:
            self.passes += 1
            self._passed.notify_all()

    def wait_passes(self, n: int, timeout: float) -> bool:
        """Block until at least ``n`` passes have run (or ``timeout`` s); whether they have."""
        with self._passed:
            return self._passed.wait_for(lambda: self.passes >= n, timeout)

    def stop(self) -> None:
        """End the thread after the pass it is in, if any."""
        self._stop_event.set()
