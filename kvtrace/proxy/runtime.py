"""How the ``kvtrace proxy`` process runs: its event loop (uvloop or asyncio), whether its Parquet
export runs in a writer process, the garbage collector's tuning, and serving until a signal.
Called by :mod:`kvtrace.cli.proxy` (and ``benchmarks/proxy``, which starts proxies the same way)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvtrace import settings
from kvtrace.errors import CLIError
from kvtrace.proxy.config import LOOPS, ProxyConfig

_GC_GEN0_THRESHOLD = 10_000  # see tune_gc


def serve_forever(
    config: ProxyConfig, provider, loop_factory=None, on_listening: Callable[[str], None] | None = None
) -> None:
    """Serve ``config`` on ``loop_factory``'s loop (None: asyncio's) until the process is stopped
    (SIGINT / SIGTERM end the loop); ``on_listening(url)`` once bound.  OSError when the port
    cannot be bound."""
    from kvtrace.proxy.server import start

    async def serve() -> None:
        running = await start(config, provider)
        tune_gc()
        if on_listening:
            on_listening(running.url)
        try:
            await asyncio.Event().wait()
        finally:
            await running.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve())


def writer_process() -> bool:
    """Whether the proxy's Parquet export runs in a writer process: KVTRACE_WRITER_PROCESS, else on
    (the proxy is where it is measured to help the tail: benchmarks/proxy/bench_proxy.py)."""
    chosen = settings.WRITER_PROCESS.get()
    return True if chosen is None else bool(chosen)


def loop_factory(choice: str | None):
    """The event loop factory for ``choice`` (else KVTRACE_PROXY_LOOP): uvloop's, or None (asyncio's).
    ``auto`` takes uvloop when it is installed; ``uvloop`` without it is a CLIError."""

    choice = settings.PROXY_LOOP.get(choice)
    if choice not in LOOPS:
        raise CLIError(f"{settings.PROXY_LOOP.env}={choice!r}: expected one of {', '.join(LOOPS)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise CLIError("--loop uvloop: uvloop is not installed (pip install 'kvtrace[proxy-fast]')") from None
        return None
    return uvloop.new_event_loop


def tune_gc() -> None:
    """The proxy process's garbage collector, once serving.

    Per request the proxy allocates a few hundred container objects that reference counting frees
    (no cycles), but with concurrent requests in flight the young generation keeps crossing the
    default threshold (700), so the collector runs every few requests and, every ~100 young
    collections, rescans the ~90k objects of the loaded modules: CPU every request pays for
    (docs/benchmarks.md, ``benchmarks/proxy``).
    ``gc.freeze()`` moves everything alive now (modules, app, pools) out of the collector's scans and
    a higher young threshold lets transient request objects die before a collection sees them.
    """
    import gc

    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, _GC_GEN0_THRESHOLD), gen1, gen2)
