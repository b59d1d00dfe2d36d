"""The demo's two run processes, and how a signal stops them.

Both runs execute at once, one spawned process each (own core, own event loop: the runs do not
slow each other down on a 2-core machine).  The parent owns the signals:

- the children start with SIGINT ignored (an ignored disposition survives ``exec``, and Python
  then installs no KeyboardInterrupt handler), so a terminal's Ctrl-C, which reaches the whole
  process group, interrupts only the parent;
- on SIGINT or SIGTERM the parent sends SIGTERM to each child still running, waits up to
  :data:`GRACE_S` for it (then kills it) and raises :class:`Stopped`;
- a child on SIGTERM cancels its run: the workload, the proxy and the simulated cluster close in
  their ``finally`` blocks, the tracer providers flush what was recorded, and it exits quietly
  (the connection resets that cancelling in-flight requests causes are not logged).

So no process of the demo outlives it, and an interrupted demo prints one line, not the
tracebacks of the connections it cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import signal
import time
from multiprocessing.connection import wait

GRACE_S = 15.0  # how long a child gets to flush its traces after SIGTERM before it is killed
EXIT_CANCELLED = 128 + signal.SIGTERM
_NOISY = ("aiohttp", "aiohttp.server", "aiohttp.access", "aiohttp.client", "asyncio", "openai", "httpx")


class Stopped(Exception):
    """The parent got ``signum`` (SIGINT or SIGTERM); the children have exited."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RunFailed(Exception):
    """A run's process failed (its traceback is on stderr above)."""


def run_all(target, jobs: dict[str, dict]) -> None:
    """The coroutine ``target(**kwargs)`` returns, for each ``name -> kwargs`` of ``jobs``, each in
    its own spawned process, all at once; returns when all succeeded.  Raises :class:`Stopped` on SIGINT/SIGTERM and
    :class:`RunFailed` when one fails (the others are stopped first)."""
    ctx = multiprocessing.get_context("spawn")
    procs = {
        name: ctx.Process(target=_child, args=(target, kwargs), name=f"kvtrace-demo-{name}", daemon=True)
        for name, kwargs in jobs.items()
    }
    with _signals_to(_raise_stopped):
        try:
            with _sigint_ignored():  # inherited by the children
                for proc in procs.values():
                    proc.start()
            failed = _wait_all(procs)
        except Stopped:
            stop(procs.values())
            raise
    if failed:
        stop(procs.values())
        raise RunFailed(f"the {failed} run failed (exit status {procs[failed].exitcode}; its error is above)")


def _wait_all(procs: dict) -> str | None:
    """Wait until every process has exited or one failed; the failed one's name, else None."""
    running = dict(procs)
    while running:
        for sentinel in wait([p.sentinel for p in running.values()]):
            name = next(n for n, p in running.items() if p.sentinel == sentinel)
            proc = running.pop(name)
            proc.join()
            if proc.exitcode != 0:
                return name
    return None


def stop(procs) -> None:
    """SIGTERM every process still alive, wait up to :data:`GRACE_S` in all, then SIGKILL."""
    alive = [p for p in procs if p.is_alive()]
    for proc in alive:
        with contextlib.suppress(OSError):
            proc.terminate()
    deadline = time.monotonic() + GRACE_S
    for proc in alive:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()


def _raise_stopped(signum, frame) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def _signals_to(handler):
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def _sigint_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _child(target, kwargs: dict) -> None:
    """A run process: the coroutine ``target(**kwargs)`` returns, on a fresh event loop; SIGTERM
    cancels it and the process exits with :data:`EXIT_CANCELLED`, after the run's cleanup."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C (already ignored since spawn)
    try:
        asyncio.run(_cancel_on_sigterm(target(**kwargs)))
    except asyncio.CancelledError:
        raise SystemExit(EXIT_CANCELLED) from None


async def _cancel_on_sigterm(coro) -> None:
    task = asyncio.current_task()

    def cancel() -> None:
        for name in _NOISY:  # the resets of the requests being cut are the point, not news
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)
        task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, cancel)
    await coro
