"""Proxy configuration: workers, conversation-table limits, fault policy, timeouts and sizes.

Built by :mod:`kvtrace.cli.proxy` from flags (or by tests directly) and read by
:mod:`kvtrace.proxy.app`.  Defaults follow vLLM's upstream ``disagg_proxy_multiturn.py``
(conversation TTL 450 s = ``decoder_kv_blocks_ttl`` 480 s minus a 30 s margin), except that the
proxy binds 127.0.0.1 unless told otherwise.  The hardening limits (request deadline, upstream
size cap, client read timeouts, table bytes, id length, D's TTL, connections and queue per worker,
the cooldown of a worker that could not be reached)
and prefix matching (on, and the prefix table's bytes) default to their ``KVTRACE_PROXY_*`` settings
(:mod:`kvtrace.settings`); explicit values beat them.  ``connect_timeout_s`` bounds each connection
attempt to a worker, from the attempt: a request's wait for a free connection (:class:`~kvtrace.proxy.
upstream.Gate`) does not count (bounded by ``max_worker_queue`` and ``request_timeout_s`` instead).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kvtrace import settings
from kvtrace.routing import check_policy

DECODER_KV_BLOCKS_TTL_S = 480.0  # vLLM default decoder_kv_blocks_ttl
TTL_MARGIN_S = 30.0
EXPIRY_SAFETY_MARGIN_S = 5.0  # vLLM's P declines a read this long before D's deadline (_is_turn2_read_expired)
PREFILL_FAILURE_ERROR = "error"
PREFILL_FAILURE_DECODE_ONLY = "decode_only"
PREFILL_FAILURE_MODES = (PREFILL_FAILURE_ERROR, PREFILL_FAILURE_DECODE_ONLY)
LOOPS = ("auto", "uvloop", "asyncio")  # --loop: the event loop (kvtrace.proxy.runtime)


@dataclass(frozen=True)
class Worker:
    """One P or D worker: ``base`` is ``http://host:port`` (routes are appended as-is)."""

    host: str
    port: int

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class ProxyConfig:
    prefill: list[Worker]
    decode: list[Worker]
    host: str = "127.0.0.1"
    port: int = 8000
    conversation_ttl_s: float = DECODER_KV_BLOCKS_TTL_S - TTL_MARGIN_S
    max_conversations: int = 100_000
    prefill_failure: str = PREFILL_FAILURE_ERROR
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0
    max_body_bytes: int = 32 * 1024 * 1024
    request_timeout_s: float = field(default_factory=lambda: float(settings.PROXY_REQUEST_TIMEOUT.get()))
    max_upstream_bytes: int = field(default_factory=lambda: int(settings.PROXY_MAX_UPSTREAM_BYTES.get()))
    client_header_timeout_s: float = field(default_factory=lambda: float(settings.PROXY_CLIENT_HEADER_TIMEOUT.get()))
    client_body_timeout_s: float = field(default_factory=lambda: float(settings.PROXY_CLIENT_BODY_TIMEOUT.get()))
    max_table_bytes: int = field(default_factory=lambda: int(settings.PROXY_MAX_TABLE_BYTES.get()))
    max_id_bytes: int = field(default_factory=lambda: int(settings.PROXY_MAX_ID_BYTES.get()))
    decoder_kv_ttl_s: float | None = field(default_factory=lambda: settings.PROXY_DECODER_KV_TTL.get())
    prefix_match: bool = field(default_factory=lambda: bool(settings.PROXY_PREFIX_MATCH.get()))
    max_chain_bytes: int = field(default_factory=lambda: int(settings.PROXY_MAX_CHAIN_BYTES.get()))
    max_worker_connections: int = field(default_factory=lambda: int(settings.PROXY_MAX_WORKER_CONNECTIONS.get()))
    max_worker_queue: int = field(default_factory=lambda: int(settings.PROXY_MAX_WORKER_QUEUE.get()))
    patch_responses: bool = field(default_factory=lambda: bool(settings.PATCH_RESPONSES.get()))
    routing: str = field(default_factory=lambda: str(settings.PROXY_ROUTING.get()))
    worker_cooldown_s: float = field(default_factory=lambda: float(settings.PROXY_WORKER_COOLDOWN.get()))
    api_key: str | None = field(default_factory=lambda: os.environ.get("OPENAI_API_KEY") or None)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError (one line) on an unusable configuration."""
        if not self.prefill or not self.decode:
            raise ValueError("need at least one prefill and one decode worker")
        check_policy(self.routing)  # RoutingError is a ValueError: one line
        if self.prefill_failure not in PREFILL_FAILURE_MODES:
            raise ValueError(f"prefill_failure must be one of {PREFILL_FAILURE_MODES}, not {self.prefill_failure!r}")
        for name in (
            "conversation_ttl_s",
            "connect_timeout_s",
            "read_timeout_s",
            "request_timeout_s",
            "client_header_timeout_s",
            "client_body_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.decoder_kv_ttl_s is not None and not self.decoder_kv_ttl_s > 0:
            raise ValueError("decoder_kv_ttl_s must be > 0")
        for name in (
            "max_conversations",
            "max_body_bytes",
            "max_upstream_bytes",
            "max_table_bytes",
            "max_id_bytes",
            "max_chain_bytes",
            "max_worker_connections",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_worker_queue < 0:
            raise ValueError("max_worker_queue must be >= 0")
        if not self.worker_cooldown_s >= 0:
            raise ValueError("worker_cooldown_s must be >= 0")

    def offer_outlives(self, decoder_ttl_s: float | None) -> bool:
        """An entry may still be offered when D has dropped (or P declines to read) its blocks."""
        return decoder_ttl_s is not None and self.conversation_ttl_s + EXPIRY_SAFETY_MARGIN_S >= decoder_ttl_s

    @staticmethod
    def workers(hosts: list[str], ports: list[int], role: str) -> list[Worker]:
        """Pair ``--<role>-hosts`` with ``--<role>-ports`` like upstream (one host may serve many ports)."""
        if len(hosts) == 1 and len(ports) > 1:
            hosts = hosts * len(ports)
        if len(hosts) != len(ports):
            raise ValueError(f"number of {role} hosts ({len(hosts)}) must match ports ({len(ports)})")
        return [Worker(h, int(p)) for h, p in zip(hosts, ports, strict=True)]
