"""Telemetry set-up for the connector inside a vLLM process.

The scheduler-side :class:`~kvtrace.vllm.connector.KVTraceNixlConnector` (EngineCore process)
calls :func:`recorder_for` once, at construction.  Settings come from the ``kvtrace`` object in
``kv_connector_extra_config`` (``traces_dir``, ``service_name``, ``otlp``, ``role``, ``metrics``,
``verify``), else the ``KVTRACE_*`` / ``OTEL_*`` environment (read by :func:`kvtrace.configure`).

``verify`` (P, d2p pulls; :mod:`kvtrace.kvdigest`): ``record`` (the default) checks D's digest
against the prompt and records ``kvtrace.kv.verified`` but lets vLLM's rule decide; ``enforce``
loads only the verified prefix when it still clears ``kv_recompute_threshold``, else recomputes
(outcome ``unverified``), and refuses offers without a digest (an uninstrumented D) the same way.
``record`` is the default because a tracing connector must not change what vLLM does until the
operator asks: ``enforce`` with a D that does not run this connector, or with P and D on different
``KVTRACE_KV_DIGEST_KEY`` values, recomputes every turn; turn it on once the spans show
``match`` for the healthy turns.  The digest key is read from the environment only
(``KVTRACE_KV_DIGEST_KEY``): vLLM logs its kv_transfer_config, so a secret must not live there.  One TracerProvider
per process and engine id; resource attributes ``kvtrace.substrate=vllm``, engine id, role and the
KV cache pool's size in bytes.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass

from kvtrace import semconv as sc
from kvtrace import settings as kvsettings
from kvtrace.emit.metrics import KVMetrics
from kvtrace.emit.recorder import KVRecorder
from kvtrace.telemetry import configure

log = logging.getLogger(__name__)

_ROLE_BY_KV_ROLE = {"kv_producer": sc.ROLE_PREFILL, "kv_consumer": sc.ROLE_DECODE, "kv_both": sc.ROLE_BOTH}
_lock = threading.Lock()
_providers: dict[tuple, object] = {}

# vLLM's internal request id: "<prefix>-<X-Request-Id>[-<prompt index>]-<8 random chars>"
_INTERNAL_ID = re.compile(r"^(?P<prefix>chatcmpl|cmpl|resp)-(?P<base>.+?)(?P<index>-\d+)?-[0-9a-zA-Z]{8}$")


def public_request_id(internal_id: str) -> str:
    """The X-Request-Id base of vLLM's internal request id (the join key across proxy, P and D).

    ``chatcmpl-<X>-<rand8>`` and ``cmpl-<X>-<i>-<rand8>`` give ``<X>``; anything else is
    returned unchanged."""
    m = _INTERNAL_ID.match(internal_id)
    if m is None:
        return internal_id
    if m.group("prefix") == "chatcmpl" and m.group("index"):
        return m.group("base") + m.group("index")
    return m.group("base")


@dataclass(frozen=True)
class ConnectorSettings:
    """What the connector reads from vLLM's KVTransferConfig."""

    engine_id: str
    role: str
    service_name: str
    traces_dir: str | None
    otlp: object
    threshold: int
    ttl_s: float
    bidirectional: bool
    load_failure_policy: str
    metrics: bool = True
    verify: str = sc.VERIFY_RECORD

    @classmethod
    def from_kv_transfer_config(cls, ktc) -> ConnectorSettings:
        extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
        entry = extra.get(sc.KV_PARAMS_KEY) or {}
        if not isinstance(entry, dict):
            raise ValueError(f"kv_connector_extra_config[{sc.KV_PARAMS_KEY!r}] must be an object, got {entry!r}")
        role = entry.get("role") or _ROLE_BY_KV_ROLE.get(getattr(ktc, "kv_role", None) or "", sc.ROLE_BOTH)
        if role not in sc.ROLES:
            raise ValueError(f"kvtrace role must be one of {sc.ROLES}, got {role!r}")
        verify = entry.get("verify") or sc.VERIFY_RECORD
        if verify not in sc.VERIFY_MODES:
            raise ValueError(f"kvtrace verify must be one of {sc.VERIFY_MODES}, got {verify!r}")
        return cls(
            verify=verify,
            engine_id=str(ktc.engine_id),
            role=role,
            service_name=entry.get("service_name") or f"vllm-{role}",
            traces_dir=entry.get("traces_dir"),
            otlp=entry.get("otlp"),
            threshold=int(extra.get("kv_recompute_threshold", 64)),
            ttl_s=float(extra.get("decoder_kv_blocks_ttl", 480)),
            bidirectional=bool(extra.get("bidirectional_kv_xfer", False)),
            load_failure_policy=str(getattr(ktc, "kv_load_failure_policy", None) or "fail"),
            metrics=bool(kvsettings.METRICS.get(entry.get("metrics"))) and not kvsettings.DISABLE.get(),
        )


def block_bytes_by_group(kv_cache_config) -> list[int]:
    """Bytes one block costs in each KV-cache group: page size x layers in the group."""
    out = []
    for group in kv_cache_config.kv_cache_groups:
        out.append(int(group.kv_cache_spec.page_size_bytes) * len(group.layer_names))
    return out


def kv_pool_bytes(kv_cache_config) -> int:
    """Size of the engine's KV cache pool: blocks x bytes one block costs over every group."""
    return int(kv_cache_config.num_blocks) * sum(block_bytes_by_group(kv_cache_config))


def tracer_provider_for(settings: ConnectorSettings, pool_bytes: int | None = None):
    """One provider per process and (service, traces_dir, otlp, engine id); ``pool_bytes`` (the
    KV cache pool's size) becomes a resource attribute."""
    key = (settings.service_name, settings.traces_dir, settings.otlp, settings.engine_id, settings.role, pool_bytes)
    with _lock:
        provider = _providers.get(key)
        if provider is None:
            resource = {
                sc.SUBSTRATE: sc.SUBSTRATE_VLLM,
                sc.ENGINE_ID: settings.engine_id,
                sc.ENGINE_ROLE: settings.role,
            }
            if pool_bytes is not None:
                resource[sc.ENGINE_KV_POOL_BYTES] = int(pool_bytes)
            provider = configure(
                settings.service_name,
                traces_dir=settings.traces_dir,
                otlp=settings.otlp,
                resource_attributes=resource,
            )
            _providers[key] = provider
        return provider


def recorder_for(
    settings: ConnectorSettings, kv_cache_config, block_size: int, tracer_provider=None, *, deferred: bool = False
) -> KVRecorder:
    """The KVRecorder of one scheduler-side connector (``deferred``: spans are built off the
    scheduler's thread, see :mod:`kvtrace.emit.deferred`)."""
    provider = tracer_provider
    if provider is None:
        provider = tracer_provider_for(settings, kv_pool_bytes(kv_cache_config))
    return KVRecorder(
        provider,
        engine_id=settings.engine_id,
        role=settings.role,
        block_size=block_size,
        bytes_per_block=sum(block_bytes_by_group(kv_cache_config)),
        threshold=settings.threshold,
        ttl_s=settings.ttl_s,
        load_failure_policy=settings.load_failure_policy,
        deferred=deferred,
        metrics=KVMetrics() if settings.metrics else None,
    )
