"""kvtrace.proxy: ``kvtrace proxy``, the traced stateful P/D proxy.

A drop-in for vLLM's ``disagg_proxy_multiturn.py``: it sends each turn to a prefill worker (P)
with the location of the blocks the decode worker (D) kept from the last turn, then streams the
decode from D, remembers per conversation where the blocks live (:mod:`.table`), emits the
proxy's spans (:mod:`.spans`) and adds a ``kv_transfer`` object to every response
(:mod:`.metadata`, :mod:`.stream`).  Talks to vLLM (or :mod:`kvtrace.sim`) only over HTTP.
"""
