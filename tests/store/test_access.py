"""kvtrace.store.access.ensure_writable: the check commands run before writing traces."""

from __future__ import annotations

import os

import pytest

from kvtrace.store.access import NotWritable, ensure_writable


def test_creates_missing_directories_and_leaves_nothing_behind(tmp_path):
    target = tmp_path / "a" / "b" / "traces"
    assert ensure_writable(target) == str(target)
    assert target.is_dir() and list(target.iterdir()) == []
    assert ensure_writable(os.path.relpath(target)) == str(target)  # relative paths come back absolute


@pytest.mark.parametrize(
    "kind, reason", [("file", "it exists and is not a directory"), ("under-file", "Not a directory")]
)
def test_paths_through_a_file_are_refused_in_one_line(tmp_path, kind, reason):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    target = blocker if kind == "file" else blocker / "t"
    with pytest.raises(NotWritable) as err:
        ensure_writable(target)
    assert str(err.value) == f"cannot write traces to {target}: {reason}"
    assert isinstance(err.value, OSError)


def test_a_directory_that_refuses_files_is_refused(tmp_path):
    """sysfs refuses new files even to root (permission bits would not: root ignores them)."""
    if not os.path.isdir("/sys/kernel") or (os.geteuid() != 0 and os.access("/sys/kernel", os.W_OK)):
        pytest.skip("no read-only sysfs")
    with pytest.raises(NotWritable, match=r"^cannot write traces to /sys/kernel: Permission denied$"):
        ensure_writable("/sys/kernel")
