"""This engine's block-hash configuration, for digest v2 (:func:`kvtrace.kvdigest.make_blocks`).

The scheduler-side connector is built inside the Scheduler, before EngineCore calls
``init_none_hash``: the algorithm and ``hash_block_size`` are read at connector init, NONE_HASH at
the first request that needs it (then kept: vLLM sets it once per process).
"""

from __future__ import annotations

import logging

from kvtrace import kvdigest

log = logging.getLogger(__name__)


class BlockHashing:
    """Lazily resolved :class:`~kvtrace.kvdigest.BlockConfig`; None while it cannot be known."""

    __slots__ = ("algo", "hash_block_size", "_config")

    def __init__(self, algo: str | None, hash_block_size: int | None) -> None:
        self.algo = algo
        self.hash_block_size = hash_block_size
        self._config: kvdigest.BlockConfig | None = None

    @classmethod
    def from_vllm(cls, vllm_config, kv_cache_config) -> BlockHashing:
        """Read the algorithm and vLLM's own ``hash_block_size`` resolution (None: v1 only)."""
        algo = getattr(vllm_config.cache_config, "prefix_caching_hash_algo", None)
        try:
            from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

            hbs: int | None = int(resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)[1])
        except Exception as exc:  # another vLLM, or a config it rejects later anyway: v1 digests
            log.info("kvtrace: no hash_block_size (%s); D emits v1 digests", exc)
            hbs = None
        return cls(algo, hbs)

    def config(self) -> kvdigest.BlockConfig | None:
        if self._config is None and self.algo and self.hash_block_size:
            from vllm.v1.core import kv_cache_utils

            none_hash = getattr(kv_cache_utils, "NONE_HASH", None)  # unset before init_none_hash
            if none_hash:
                self._config = kvdigest.block_config(self.algo, none_hash, self.hash_block_size)
        return self._config
