"""Can this process write a trace directory?  Checked before a command starts work.

Commands that write traces (``kvtrace collect``, and the proxy, simulator and demo through
:func:`ensure_writable`) check the directory first, so an unwritable ``--traces`` ends the command
at once with one line naming the directory and the reason, instead of failing every export
later.  The check does what writing does: it creates the directory (and its parents) if missing,
then creates and removes a dot-file in it (readers ignore dot-files), so it also catches what
permission bits cannot show: read-only mounts, full quotas, and paths through a regular file.
"""

from __future__ import annotations

import os
import tempfile


class NotWritable(OSError):
    """The trace directory cannot be written; ``str()`` is one line naming it and why."""


def ensure_writable(directory: str | os.PathLike) -> str:
    """Create ``directory`` if needed and prove a file can be written in it; returns its
    absolute path.  Raises :class:`NotWritable` (one line) otherwise."""
    path = os.path.abspath(os.fspath(directory))
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotWritable(f"cannot write traces to {path}: it exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".kvtrace-write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise NotWritable(f"cannot write traces to {path}: {exc.strerror or exc}") from None
    return path
