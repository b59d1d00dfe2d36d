"""What tests, benchmarks and scripts that start servers share: a free loopback port, and a
deadline-bounded poll (a wait on a condition, never a sleep used as synchronisation)."""

from __future__ import annotations

import socket
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, deadline_s: float, what: str, interval: float = 0.2):
    """Call ``predicate`` every ``interval`` s until it returns something true and return that;
    TimeoutError (naming ``what`` and the last value) once ``deadline_s`` has passed."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {deadline_s:g}s waiting for {what} (last: {last!r})")
