"""``kvtrace proxy`` with an event-loop lag probe, for ``bench_proxy.py`` (benchmark only).

    python benchmarks/proxy/lagprobe.py proxy --port ... [kvtrace proxy arguments]

Adds two routes to the proxy app: ``GET /lagprobe/start`` starts a task that sleeps
:data:`TICK_S` in a loop and records how late each wake-up is (the lag: how long the loop was
kept from running ready callbacks: a GIL held by another thread, a long callback, the OS not
scheduling the process); ``GET /lagprobe/stop`` stops it and answers the samples' summary as
JSON; ``GET /lagprobe/flush`` exports the spans queued so far.
Each sample is marked as overlapping a span export when an ``export`` call of one of the
process's span exporters was running at its start or end, or started during it.  The probe runs
only between start and stop, so it costs nothing while the benchmark measures CPU per request.
"""

from __future__ import annotations

import asyncio
import sys
import time

from aiohttp import web

from kvtrace import telemetry
from kvtrace.proxy import server

TICK_S = 0.001


class ExportWatch:
    """Counts ``export`` calls of every exporter of the process's providers, and those running;
    keeps the most CPU time one call took in its thread (for the in-process exporter an upper
    bound on how long it held the GIL at a stretch: the machine's load does not inflate it)."""

    def __init__(self) -> None:
        self.started = 0
        self.running = 0
        self.max_export_cpu_s = 0.0
        self.exporters: list = []

    def install(self) -> None:
        for provider in list(telemetry._providers):
            for processor in provider._active_span_processor._span_processors:
                exporter = getattr(processor, "span_exporter", None)
                if exporter is not None and exporter not in self.exporters:
                    self.exporters.append(exporter)
                    exporter.export = self._wrap(exporter.export)

    def _wrap(self, export):
        def watched(spans):
            self.started += 1
            self.running += 1
            t0 = time.thread_time()
            try:
                return export(spans)
            finally:
                self.running -= 1
                self.max_export_cpu_s = max(self.max_export_cpu_s, time.thread_time() - t0)

        return watched


class Probe:
    def __init__(self) -> None:
        self.watch = ExportWatch()
        self.task: asyncio.Task | None = None
        self.samples: list[tuple[float, bool]] = []

    async def start(self, request: web.Request) -> web.Response:
        self.watch.install()
        self.watch.max_export_cpu_s = 0.0
        self.samples = []
        self.exports_at_start = self.watch.started
        self.task = asyncio.create_task(self._run())
        return web.json_response({"ok": True})

    async def _run(self) -> None:
        clock, watch = time.perf_counter, self.watch
        while True:
            before, busy = watch.started, watch.running > 0
            t0 = clock()
            await asyncio.sleep(TICK_S)
            lag = clock() - t0 - TICK_S
            self.samples.append((lag, busy or watch.running > 0 or watch.started != before))

    async def flush(self, request: web.Request) -> web.Response:
        """Export the spans queued so far (each tracer provider's ``force_flush``, off the loop):
        after the warm-up, so a writer process starts and writes its first batch (its imports)
        before any measured round."""
        providers = list(telemetry._providers)
        ok = [await asyncio.to_thread(p.force_flush) for p in providers]
        return web.json_response({"providers": len(providers), "flushed": all(ok)})

    async def stop(self, request: web.Request) -> web.Response:
        """The samples (lag ms, overlapped an export) since start, the exports started meanwhile,
        the most thread CPU one export call took meanwhile, and the longest GIL-holding slice a
        writer-process exporter measured so far."""
        self.task.cancel()
        slices = [getattr(e, "max_slice_cpu_s", None) for e in self.watch.exporters]
        return web.json_response(
            {
                "lags": [lag * 1e3 for lag, _ in self.samples],
                "flags": [flag for _, flag in self.samples],
                "exports": self.watch.started - self.exports_at_start,
                "max_slice_cpu_ms": max((s * 1e3 for s in slices if s is not None), default=None),
                "max_export_cpu_ms": self.watch.max_export_cpu_s * 1e3
                if self.watch.started > self.exports_at_start
                else None,
            }
        )


_create_app = server.create_app


def create_app(*args, **kwargs) -> web.Application:
    app = _create_app(*args, **kwargs)
    probe = Probe()
    app.router.add_get("/lagprobe/start", probe.start)
    app.router.add_get("/lagprobe/stop", probe.stop)
    app.router.add_get("/lagprobe/flush", probe.flush)
    return app


server.create_app = create_app

if __name__ == "__main__":
    from kvtrace.cli import main

    sys.exit(main(sys.argv[1:]))
