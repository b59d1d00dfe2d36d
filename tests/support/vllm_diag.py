"""What the real-vLLM rig reports when it stops: every vLLM process's stacks and the log tails.

``py-spy dump --native`` of each process in a server's process tree (API server, EngineCore,
workers) shows where each thread waits -- the only way to tell a stalled engine (EngineCore in
``collective_rpc`` waiting for its worker) from a slow one.  Used by the e2e rig's bounded waits
(tests/support/vllm_pd.py) and by scripts/e2e_stall.py.  py-spy comes with the ``dev`` extra; without it
the report says so and carries the log tails only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: what vLLM's shared-memory RPC queue logs once a reader waited VLLM_RINGBUFFER_WARNING_INTERVAL
SHM_STALL = "No available shared memory broadcast block found"


def py_spy() -> str | None:
    """The py-spy executable (PATH, else beside this interpreter), or None."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (pids that still exist)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root.pid] + [p.pid for p in root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def title(pid: int) -> str:
    """A process's title as ``ps`` shows it (vLLM retitles EngineCore and workers)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:160]


def kernel_view(pid: int, *, stacks: bool = True) -> str:
    """Each thread's scheduler state (R running, S sleeping, D uninterruptible ...), CPU ticks and
    kernel wait channel, with the kernel stack of threads not sleeping: what py-spy cannot show when
    a thread is stuck in the kernel (py-spy then cannot stop the process either)."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda t: int(t.name)):
        try:
            stat = (task / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            wchan = (task / "wchan").read_text().strip() or "-"
        except (OSError, ValueError):
            continue
        state, ticks = fields[0], int(fields[11]) + int(fields[12])
        lines.append(f"  tid {task.name} {comm!r} state {state} cpu_ticks {ticks} wchan {wchan}")
        if stacks and state not in ("S", "I"):
            try:
                lines += ["      " + line for line in (task / "stack").read_text().splitlines()[:12]]
            except OSError:
                pass
    return "\n".join(lines)


def _dump_one(exe: str, pid: int, native: bool, timeout_s: float) -> str:
    cmd = [exe, "dump", "--pid", str(pid)] + (["--native"] if native else [])
    before = kernel_view(pid)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        out = done.stdout + (f"\n[py-spy exit {done.returncode}] {done.stderr.strip()}" if done.returncode else "")
    except subprocess.TimeoutExpired:
        out = f"[py-spy dump timed out after {timeout_s}s]\n--- threads after the timeout:\n{kernel_view(pid)}"
    return f"=== pid {pid} {title(pid)}\n{out.rstrip()}\n--- threads (/proc):\n{before}\n"


def dump_stacks(pids: list[int], *, native: bool = True, timeout_s: float = 30) -> str:
    """``py-spy dump`` of every pid, taken concurrently (one snapshot of all processes)."""
    exe = py_spy()
    if exe is None:
        return "[no stacks: py-spy is not installed (pip install py-spy; it is in the dev extra)]\n"
    if not pids:
        return "[no stacks: no process left]\n"
    with ThreadPoolExecutor(max_workers=min(8, len(pids))) as pool:
        return "".join(pool.map(lambda pid: _dump_one(exe, pid, native, timeout_s), pids))


def tail(path: Path, n: int = 40) -> str:
    """The last ``n`` lines of a log file ('' when absent)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def shm_warnings(paths: list[Path]) -> int:
    """How many shared-memory stall warnings the logs hold."""
    count = 0
    for path in paths:
        try:
            count += path.read_text(errors="replace").count(SHM_STALL)
        except OSError:
            pass
    return count


def report(reason: str, servers: list, *, stacks: bool = True, lines: int = 40) -> str:
    """A failure report: ``reason``, then per running server its process tree's stacks and its
    log tail.  ``servers``: objects with ``name``, ``proc`` (Popen or None) and ``log_path``."""
    parts = [reason, f"(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})"]
    for s in servers:
        alive = s.proc is not None and s.proc.poll() is None
        parts.append(f"\n----- {s.name}: {'running' if alive else 'not running'}; log tail ({s.log_path}):")
        parts.append(tail(s.log_path, lines))
        if alive and stacks:
            parts.append(f"----- {s.name}: stacks")
            parts.append(dump_stacks(process_tree(s.proc.pid)))
    return "\n".join(parts)
