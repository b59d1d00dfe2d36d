"""kvtrace.vllm: code that runs inside vLLM's processes.

``KVTraceNixlConnector`` (:mod:`.connector`), loaded through ``kv_connector_module_path``,
forwards every hook to vLLM's NixlConnector and reports what it saw to the shared span emitter
(:mod:`kvtrace.emit`) through the scheduler-side probe (:mod:`.probe`); :mod:`.config` sets up
telemetry per engine; :mod:`.plugin` (a ``vllm.general_plugins`` entry point) adds the streaming
``kv_transfer_params`` patch (:mod:`.streampatch`) and CPU-rig NIXL settings.
"""
