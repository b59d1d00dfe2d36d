"""``KVTraceNixlConnector``: vLLM's NixlConnector with kvtrace spans.

Load it with::

    --kv-transfer-config '{"kv_connector": "KVTraceNixlConnector",
                           "kv_connector_module_path": "kvtrace.vllm.connector",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"bidirectional_kv_xfer": true,
                               "kvtrace": {"traces_dir": "...", "service_name": "...",
                                           "otlp": "auto", "role": "prefill",
                                           "verify": "record"}}}'

**Subclass, not composition.**  vLLM treats the connector *class* as part of the contract:
the factory checks ``SupportsHMA`` with ``issubclass`` and calls classmethods on it
(``get_required_kvcache_layout`` picks the KV layout NIXL needs, ``build_kv_connector_stats``
rebuilds the connector's stats in the scheduler, ``build_prom_metrics`` registers the
``vllm:nixl_*`` metrics, ``requires_piecewise_for_cudagraph``, ``supports_sleep_mode``), the
scheduler reads ``_cache_hit_source`` (P2P, which labels
``vllm:prompt_tokens_by_source{source="external_kv_transfer"}``) and workers reach into the
bound ``_connector_metadata``.  MultiConnector composes because it fans out to several
children and re-implements all of that; wrapping one NixlConnector by composition would have
to copy the same class-level behaviour and keep it in sync by hand.  Subclassing inherits it,
and NixlConnector's own state stays where its code expects it.

**Every hook is still forwarded explicitly** (``super()`` call, unchanged arguments and
result), so each is documented here and a test fails when the installed vLLM's
``KVConnectorBase_V1`` / ``SupportsHMA`` grows a public method this class does not define.
Instrumentation runs after the forward, in :class:`~kvtrace.vllm.probe.SchedulerProbe`,
which never raises; vLLM's own exceptions propagate untouched.  Worker-side hooks only
forward: NIXL telemetry the worker collects reaches the scheduler in
``KVConnectorOutput.kv_connector_stats`` and is attributed there, where the request spans are.

**Metrics** (:mod:`kvtrace.vllm.metrics`): the same stats channel carries kvtrace's counters to
vLLM's own ``/metrics``.  The three stats hooks are the only ones that change vLLM-visible
data: ``get_kv_connector_stats`` returns NIXL's stats as :class:`KVTraceConnectorStats` (plus,
on the scheduler side, the recorder's counters since the last step), ``build_kv_connector_stats``
rebuilds that class, and ``build_prom_metrics`` registers ``vllm:kvtrace_*`` beside
``vllm:nixl_*`` (NIXL's families unchanged).

Processes: SCHEDULER role = EngineCore process (one connector); WORKER role = each worker
(same process as EngineCore with the uni-process executor, one per GPU otherwise).
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector

from kvtrace.emit.recorder import KVRecorder
from kvtrace.vllm.blockhash import BlockHashing
from kvtrace.vllm.config import ConnectorSettings, block_bytes_by_group, recorder_for
from kvtrace.vllm.metrics import KVTraceConnectorStats, KVTracePromMetrics, adopt_worker_stats
from kvtrace.vllm.probe import SchedulerProbe


class KVTraceNixlConnector(NixlConnector):
    """NixlConnector (pull mode) that records kvtrace decision/transfer/retention spans."""

    #: tests set this to route spans to an in-memory exporter; None = kvtrace.configure
    tracer_provider = None
    #: apply spans on a background thread (``KVRecorder(deferred=True)``), keeping the SDK's span
    #: start/end cost out of the scheduler hooks.  None = deferred with kvtrace.configure's
    #: provider, synchronous with an injected ``tracer_provider`` (tests that read spans right
    #: after a scheduler step)
    deferred_spans: bool | None = None

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config):
        super().__init__(vllm_config, role, kv_cache_config)
        self._probe: SchedulerProbe | None = None
        if role == KVConnectorRole.SCHEDULER:
            settings = ConnectorSettings.from_kv_transfer_config(vllm_config.kv_transfer_config)
            recorder = self._recorder(settings, kv_cache_config, vllm_config.cache_config.block_size)
            self._probe = SchedulerProbe(
                recorder,
                block_bytes=block_bytes_by_group(kv_cache_config),
                bidirectional=settings.bidirectional,
                verify=settings.verify,
                hashing=BlockHashing.from_vllm(vllm_config, kv_cache_config),
            )

    @classmethod
    def _recorder(cls, settings: ConnectorSettings, kv_cache_config, block_size: int) -> KVRecorder:
        """The scheduler-side KVRecorder (see ``deferred_spans``)."""
        deferred = cls.tracer_provider is None if cls.deferred_spans is None else cls.deferred_spans
        return recorder_for(settings, kv_cache_config, block_size, cls.tracer_provider, deferred=deferred)

    # ================================================================ class-level contract
    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """Engine set-up (both processes), once: the KV layout NIXL wants."""
        return super().get_required_kvcache_layout(vllm_config)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        """Scheduler / stat loggers, per stats interval: rebuild the stats (NIXL's + kvtrace's)."""
        return KVTraceConnectorStats(data=data) if data is not None else KVTraceConnectorStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        """API-server stat logger, once: the vllm:nixl_* and (unless metrics are off) vllm:kvtrace_*
        Prometheus metrics."""
        if not ConnectorSettings.from_kv_transfer_config(vllm_config.kv_transfer_config).metrics:
            return super().build_prom_metrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        return KVTracePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Config validation, once."""
        return super().requires_piecewise_for_cudagraph(extra_config)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config) -> bool:
        """Config validation, once (vLLM >= 0.33)."""
        return super().supports_sleep_mode(kv_transfer_config)

    @property
    def role(self) -> KVConnectorRole:
        """Which side this instance serves (any caller)."""
        return super().role

    @property
    def requires_kv_delivery(self) -> bool:
        """Scheduler, once at construction: producers must deliver KV."""
        return super().requires_kv_delivery

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        """Scheduler, per prefix-cache lookup on hybrid models."""
        return super().supports_divergent_local_hybrid_hits

    # ================================================================ scheduler side (EngineCore)
    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        """Scheduler construction, once."""
        return super().bind_kv_cache_manager(kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        """Scheduler construction, once (via bind_kv_cache_manager)."""
        return super().bind_gpu_block_pool(gpu_block_pool)

    def on_new_request(self, request) -> None:
        """Scheduler.add_request, once per request: starts the engine span."""
        super().on_new_request(request)
        if self._probe is not None:
            self._probe.on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        """Scheduler.schedule, per attempt to admit a waiting request (repeats while blocks
        cannot be allocated): records the decision's inputs.  Before the forward, P checks D's
        digest once (:meth:`SchedulerProbe.verify`); under ``verify: enforce`` that trims the
        offer in ``request.kv_transfer_params`` to the verified prefix, so NixlConnector's own rule
        (threshold, block tail) decides on tokens D's blocks are proven to hold."""
        if self._probe is not None:
            self._probe.verify(request)
        result = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if self._probe is not None:
            self._probe.matched(request, num_computed_tokens)
        return result

    def get_loaded_kv_cache_group_ids(self, request) -> tuple[int, ...]:
        """Scheduler.schedule, after a positive match: groups restored by the load."""
        return super().get_loaded_kv_cache_group_ids(request)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        """Scheduler.schedule, after blocks were allocated (once, plus once more after an
        async load): the decision and, when tokens are loaded, the transfer span start."""
        result = super().update_state_after_alloc(request, blocks, num_external_tokens)
        if self._probe is not None:
            self._probe.allocated(request, blocks, num_external_tokens)
        return result

    def get_external_cache_hit_sources(self, request, num_external_tokens: int):
        """Scheduler.schedule, after update_state_after_alloc with external hits: P2P."""
        return super().get_external_cache_hit_sources(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        """Scheduler.schedule, every step: the metadata workers act on."""
        return super().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output) -> None:
        """Scheduler.update_from_output, every step with connector output: ends transfers,
        attributes NIXL stats, ends retention."""
        super().update_connector_output(connector_output)
        if self._probe is not None:
            self._probe.connector_output(connector_output)
            adopt_worker_stats(connector_output)

    def request_finished(self, request, block_ids: list[int]):
        """Scheduler, once per finished request (non-HMA path): see request_finished_all_groups."""
        delay_free, params = super().request_finished(request, block_ids)
        if self._probe is not None:
            self._probe.finished(request, delay_free, params)
        return delay_free, params

    def request_finished_all_groups(self, request, block_ids: tuple[list[int], ...]):
        """Scheduler._free_request, once per finished request (the path vLLM takes for
        NixlConnector): starts retention on D, returns params carrying the kvtrace summary."""
        delay_free, params = super().request_finished_all_groups(request, block_ids)
        if self._probe is not None:
            self._probe.finished(request, delay_free, params)
        return delay_free, params

    def register_finished_partial_tail(self, request, block_ids, partial_tail_offloads) -> bool:
        """Scheduler._free_request, with partial-tail offloads (offloading connectors)."""
        return super().register_finished_partial_tail(request, block_ids, partial_tail_offloads)

    def take_events(self):
        """Scheduler, every step: KV cache events."""
        return super().take_events()

    def has_pending_block_frees(self) -> bool:
        """Scheduler, when it would preempt: can pending transfers free blocks instead."""
        return super().has_pending_block_frees()

    def has_pending_push_work(self) -> bool:
        """Engine loop, every idle check: push-mode work keeps stepping."""
        return super().has_pending_push_work()

    def get_finished_count(self) -> int | None:
        """Executor construction, once: expected completions per request."""
        return super().get_finished_count()

    def set_xfer_handshake_metadata(self, metadata) -> None:
        """EngineCore start-up, once: serve the workers' NIXL handshake metadata."""
        return super().set_xfer_handshake_metadata(metadata)

    def set_xfer_handshake_metadata_pp_aware(self, metadata) -> None:
        """EngineCore start-up, once (PP-aware form; the one vLLM calls)."""
        return super().set_xfer_handshake_metadata_pp_aware(metadata)

    def reset_cache(self) -> bool | None:
        """/reset_prefix_cache, on demand."""
        return super().reset_cache()

    def get_kv_connector_stats(self):
        """Worker every step: NIXL's stats since the last call, as KVTraceConnectorStats (the class
        every aggregate() meets).  Scheduler every step, after update_connector_output: the
        kvtrace counters since the last step (None when nothing happened)."""
        stats = super().get_kv_connector_stats()
        payload = self._probe.metrics_payload() if self._probe is not None else None
        return KVTraceConnectorStats.wrap(stats, payload)

    def shutdown(self):
        """Engine shutdown, once per process: ends open spans (retention ends released) and
        waits for the deferred spans to reach the exporters' processors."""
        try:
            return super().shutdown()
        finally:
            if self._probe is not None:
                self._probe.shutdown()

    # ================================================================ worker side (workers)
    def register_kv_caches(self, kv_caches) -> None:
        """Model runner start-up, once: registers the KV cache with NIXL."""
        return super().register_kv_caches(kv_caches)

    def unregister_kv_caches(self) -> None:
        """Before sleep (vLLM >= 0.33)."""
        return super().unregister_kv_caches()

    def restore_kv_caches(self) -> None:
        """After wake-up (vLLM >= 0.33)."""
        return super().restore_kv_caches()

    def set_host_xfer_buffer_ops(self, copy_operation) -> None:
        """Model runner start-up, once: host-buffer copy ops."""
        return super().set_host_xfer_buffer_ops(copy_operation)

    def get_mem_pool_context(self):
        """Model runner, at KV cache allocation."""
        return super().get_mem_pool_context()

    def get_handshake_metadata(self):
        """Worker start-up, once: this worker's NIXL agent metadata."""
        return super().get_handshake_metadata()

    def bind_connector_metadata(self, connector_metadata) -> None:
        """Model runner, every step before the forward."""
        return super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        """Model runner, every step after the forward."""
        return super().clear_connector_metadata()

    def has_connector_metadata(self) -> bool:
        """Worker code, any time."""
        return super().has_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata) -> None:
        """Model runner, every step before the forward."""
        return super().handle_preemptions(kv_connector_metadata)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        """Model runner, every step: posts NIXL reads, handshakes, expiry checks."""
        return super().start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Attention layers, per layer per step (no-op for NIXL)."""
        return super().wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        """Attention layers, per layer per step (no-op for NIXL)."""
        return super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)

    def wait_for_save(self):
        """Model runner, every step after the forward."""
        return super().wait_for_save()

    def finish_forward(self) -> None:
        """Model runner, every step once the KV is no longer read."""
        return super().finish_forward()

    def reset_capture_state(self) -> None:
        """Model runner, after CUDA graph capture."""
        return super().reset_capture_state()

    def get_finished(self, finished_req_ids: set[str]):
        """Model runner (via get_transfer_results), every step."""
        return super().get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids: set[str]):
        """Model runner, every step: finished sending / receiving and receive failures."""
        return super().get_transfer_results(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Model runner, every step."""
        return super().get_block_ids_with_load_errors()

    def get_kv_connector_kv_cache_events(self):
        """Model runner, every step."""
        return super().get_kv_connector_kv_cache_events()

    def build_connector_worker_meta(self):
        """Model runner, every step."""
        return super().build_connector_worker_meta()
