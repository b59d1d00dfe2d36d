"""``kvtrace`` as a user runs it: a fresh Python process on ``python -m kvtrace.cli``, its
Prometheus endpoint off (tests run side by side; a port per run would collide)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVTRACE_METRICS": "0"}
    return subprocess.run(
        [sys.executable, "-m", "kvtrace.cli", *argv], capture_output=True, text=True, timeout=timeout, env=env
    )
