"""A real full disk for the writers' tests: a small tmpfs (``small_disk``, the root conftest's
fixture) and a ballast file that fills it."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def tmpfs(path: Path, size: str = "3m") -> Iterator[Path | str]:
    """A tmpfs of ``size`` mounted at ``path`` (created), unmounted after; yields the path, or the
    reason it could not be mounted (a str) where mounting is refused."""
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        yield done.stderr.strip() or f"mount exited {done.returncode}"
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk) -> str:
    """Fill ``disk`` with a ballast file until ENOSPC; its path (delete it and space returns)."""
    ballast = os.path.join(disk, "ballast")
    with open(ballast, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return ballast
