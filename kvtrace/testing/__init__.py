"""kvtrace.testing: helpers for tests and benchmarks, never imported by the runtime.

:mod:`.synth` writes synthetic trace stores (exact, hand-built sessions and large random ones);
its engine-side span builders are in :mod:`.synth_engine` and whole stores in :mod:`.stores`;
:mod:`.proxy` has a scriptable fake vLLM worker for proxy fault tests.
"""
