"""kvtrace.testing: helpers for tests and benchmarks, never imported by the runtime.

:mod:`.synth` writes synthetic trace stores (exact, hand-built sessions and large random ones);
:mod:`.proxy` has a scriptable fake vLLM worker for proxy fault tests.
"""
