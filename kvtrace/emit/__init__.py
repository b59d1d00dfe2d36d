"""kvtrace.emit: the span emitter shared by everything that plays a vLLM engine.

:class:`~kvtrace.emit.recorder.KVRecorder` turns engine events (request start, pull-vs-recompute
decision, transfer, retention on D: :mod:`~kvtrace.emit.retention`) into the spans of the span
contract (:mod:`kvtrace.semconv`); :mod:`~kvtrace.emit.deferred` records them off the caller's
thread.  Both the simulator (:mod:`kvtrace.sim`) and the instrumented connector inside real vLLM
(:mod:`kvtrace.vllm`) emit through it, so a simulated cluster and a real one produce the same
spans.  Imports neither vLLM nor the simulator.
"""
