"""Simulated vLLM P/D cluster speaking vLLM 0.33's NixlConnector bidirectional KV protocol.

Entry point: :class:`kvtrace.sim.cluster.SimCluster` (API in that module's docstring) and the
``kvtrace sim`` command (:mod:`kvtrace.cli.sim`).  Modules: ``tokenizer`` (deterministic ids),
``kvcache`` (paged blocks, prefix cache, LRU), ``scheduler`` (vLLM's pull rules and config),
``costmodel`` (durations), ``holds`` (P lease / D retention timers), ``engine`` (one worker's
scheduler + connector, spans via KVRecorder), ``connector`` (the engine's NixlConnector half: KV
decision, pull, hold), ``wire`` (OpenAI JSON shapes), ``worker`` (aiohttp).
"""
