"""Which trace directory a command reads, and which runs a directory holds.

A **run** is what one set of writers recorded into one directory: the directory that holds the
``date=YYYY-MM-DD/hour=HH`` partitions (every kvtrace writer lays its files out that way under
the directory it is given).  A file's run is therefore the directory above its ``key=value``
partition directories, relative to the directory asked for.  ``kvtrace demo --traces DIR``
writes two runs, ``DIR/bidir`` and ``DIR/baseline``; several processes writing one ``--traces``
directory (sim, proxy, bench, collect) make one run.

kvtrace never merges runs: :mod:`kvtrace.store.reader` refuses a directory that holds more than
one, naming them (``kvtrace query``, ``report``, ``dashboard`` and ``kvtrace.store.connect`` all
go through it).  :func:`traces_dir` is the one default every command uses.
"""

from __future__ import annotations

import os

from kvtrace import settings

DEFAULT_TRACES_DIR = "kvtrace-traces"


def traces_dir(value: str | os.PathLike | None = None) -> str:
    """``value``, else ``KVTRACE_TRACES_DIR``, else ``./kvtrace-traces``."""
    return os.fspath(settings.TRACES_DIR.get(value) or DEFAULT_TRACES_DIR)


def run_of(path: str, root: str) -> str:
    """The run (directory relative to ``root``, ``.`` for ``root`` itself) holding file ``path``."""
    parts = os.path.relpath(os.path.dirname(path), root).split(os.sep)
    while parts and "=" in parts[-1]:
        parts.pop()
    parts = [p for p in parts if p != "."]
    return os.path.join(*parts) if parts else "."


def runs(files: list[str], root: str) -> dict[str, int]:
    """Run -> number of files, sorted by run."""
    out: dict[str, int] = {}
    for path in files:
        run = run_of(path, root)
        out[run] = out.get(run, 0) + 1
    return dict(sorted(out.items()))


def several_runs_message(root: str, found: dict[str, int]) -> str:
    """The one-line refusal for a directory holding several runs."""
    paths = [root if run == "." else os.path.join(root, run) for run in found]
    shown = [f"{p} (its own date=/hour= partitions)" if run == "." else p for p, run in zip(paths, found, strict=True)]
    first = next((p for p, run in zip(paths, found, strict=True) if run != "."), paths[0])
    return (
        f"{root} holds {len(found)} runs, which kvtrace does not merge: {', '.join(shown)}. "
        f"Pick one with --traces (e.g. --traces {first}); compare two with --traces A --compare B "
        "(kvtrace report, kvtrace dashboard)"
    )
