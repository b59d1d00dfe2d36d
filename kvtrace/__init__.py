"""kvtrace: does KV reuse happen on my agent traffic, what does it save, what does it hold,
and where does an agent's time go?  See README.md."""

from kvtrace.telemetry import configure, shutdown_all

__all__ = ["configure", "shutdown_all"]
__version__ = "0.1.0"
