"""vLLM 0.33 NixlConnector pull rules for one request, plus the ``--kv-transfer-config`` shape.

The rules themselves live in :mod:`kvtrace.kvrules` (shared with the what-if replay, which
applies them to arrays of recorded decisions); this module wraps them for one request's
``kv_transfer_params``.

Source (vLLM 0.33.0 wheel): ``distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py``
(``get_num_new_matched_tokens``, ``request_finished``), ``base_scheduler.py`` (settings and
defaults) and ``pull_worker.py`` (``_is_turn2_read_expired``, 5 s safety margin).  The engine
(:mod:`kvtrace.sim.engine`) calls :func:`matched_tokens` exactly where vLLM's scheduler calls the
connector, then :func:`read_expired` where vLLM's worker starts the load.

``matched_tokens(params, prompt_tokens, local_hit, threshold) -> (count, load_async)``:

- ``do_remote_prefill`` (D receiving from P): ``count = prompt_tokens - local_hit``;
  ``(count, True)`` when positive (no threshold on this direction);
- ``do_remote_decode`` with truthy ``remote_block_ids`` and all of ``remote_engine_id``,
  ``remote_request_id``, ``remote_host``, ``remote_port`` (P, turn 2+):
  ``count = min(remote_num_tokens or 0, prompt_tokens) - local_hit``;
  ``count <= 0`` -> ``(0, False)``; ``0 < count < threshold`` (threshold > 0) -> ``(0, False)``;
  else ``(count, True)``;
- anything else -> ``(0, False)``.

:func:`outcome` maps that to kvtrace's decision outcome: no usable D params -> ``no_remote``;
``count <= 0`` -> ``local_hit`` (``no_remote`` when the local hit is 0 too: nothing reusable
anywhere); below threshold -> ``below_threshold``; else ``pulled``, provisional until the load
finishes (``expired`` / ``failed`` replace it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtrace import kvdigest, kvrules
from kvtrace import semconv as sc

EXPIRY_SAFETY_MARGIN_S = kvrules.EXPIRY_SAFETY_MARGIN_S
REMOTE_FIELDS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
LOAD_FAILURE_POLICIES = ("fail", "recompute")
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


class ConfigError(ValueError):
    """Invalid --kv-transfer-config."""


@dataclass(frozen=True)
class KVConfig:
    """The parts of vLLM's ``KVTransferConfig`` the simulator honours (defaults as vLLM's,
    except that :meth:`from_dict` turns ``bidirectional_kv_xfer`` on unless told otherwise)."""

    kv_connector: str = "NixlConnector"
    kv_role: str = "kv_both"
    engine_id: str | None = None
    kv_load_failure_policy: str = "fail"
    bidirectional: bool = True
    threshold: int = 64  # kv_recompute_threshold
    ttl_s: float = 480.0  # decoder_kv_blocks_ttl
    lease_s: float = 30.0  # kv_lease_duration
    extra: dict = field(default_factory=dict)
    verify: str = sc.VERIFY_RECORD  # kv_connector_extra_config.kvtrace.verify, as the connector's

    @classmethod
    def from_dict(cls, cfg: dict | None) -> KVConfig:
        """Parse the JSON object vLLM takes as ``--kv-transfer-config``."""
        cfg = dict(cfg or {})
        if not isinstance(cfg, dict):
            raise ConfigError("kv transfer config must be a JSON object")
        extra = cfg.get("kv_connector_extra_config") or {}
        if not isinstance(extra, dict):
            raise ConfigError("kv_connector_extra_config must be an object")
        policy = cfg.get("kv_load_failure_policy", "fail")
        if policy not in LOAD_FAILURE_POLICIES:
            raise ConfigError(f"kv_load_failure_policy must be one of {LOAD_FAILURE_POLICIES}, not {policy!r}")
        role = cfg.get("kv_role", "kv_both")
        if role not in KV_ROLES:
            raise ConfigError(f"kv_role must be one of {KV_ROLES}, not {role!r}")
        entry = extra.get(sc.KV_PARAMS_KEY) or {}
        verify = entry.get("verify", sc.VERIFY_RECORD) if isinstance(entry, dict) else None
        if verify not in sc.VERIFY_MODES:
            raise ConfigError(
                f"kv_connector_extra_config.kvtrace.verify must be one of {sc.VERIFY_MODES}, not {verify!r}"
            )
        return cls(
            kv_connector=str(cfg.get("kv_connector", "NixlConnector")),
            kv_role=role,
            engine_id=cfg.get("engine_id"),
            kv_load_failure_policy=policy,
            bidirectional=bool(extra.get("bidirectional_kv_xfer", True)),
            threshold=int(_number(extra, "kv_recompute_threshold", 64)),
            ttl_s=_number(extra, "decoder_kv_blocks_ttl", 480),
            lease_s=_number(extra, "kv_lease_duration", 30),
            extra=extra,
            verify=verify,
        )

    def to_dict(self) -> dict:
        """Back to vLLM's JSON shape (what a real deployment would pass)."""
        return {
            "kv_connector": self.kv_connector,
            "kv_role": self.kv_role,
            "kv_load_failure_policy": self.kv_load_failure_policy,
            "kv_connector_extra_config": {
                **self.extra,
                "bidirectional_kv_xfer": self.bidirectional,
                "kv_recompute_threshold": self.threshold,
                "decoder_kv_blocks_ttl": self.ttl_s,
                "kv_lease_duration": self.lease_s,
            },
        }


def _number(extra: dict, key: str, default: float) -> float:
    value = extra.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"kv_connector_extra_config.{key} must be a non-negative number, not {value!r}")
    return float(value)


def has_remote_blocks(params: dict | None) -> bool:
    """P-side precondition of the d2p pull (and of notifying D to free its blocks)."""
    return bool(
        params
        and params.get("do_remote_decode")
        and params.get("remote_block_ids")
        and all(p in params for p in REMOTE_FIELDS)
    )


def matched_tokens(params: dict | None, prompt_tokens: int, local_hit: int, threshold: int) -> tuple[int, bool]:
    """``NixlPullConnectorScheduler.get_num_new_matched_tokens`` (no prefill backoff)."""
    if params is not None and params.get("do_remote_prefill"):
        count = prompt_tokens - local_hit
        if count > 0:
            return count, True
    if has_remote_blocks(params):
        count = int(kvrules.pull_count(params.get("remote_num_tokens") or 0, prompt_tokens, local_hit))
        if kvrules.loads(count, threshold):
            return count, True
    return 0, False


def read_expired(now: float, expiry: float | None) -> bool:
    """``_is_turn2_read_expired``: decline when D's blocks have at most 5 s left (None: never)."""
    return expiry is not None and bool(kvrules.read_declined(expiry - now))


def outcome(params: dict | None, prompt_tokens: int, local_hit: int, threshold: int) -> str:
    """kvtrace decision outcome for a P-side (d2p) request before any load starts."""
    offered = has_remote_blocks(params)
    count = kvrules.pull_count((params or {}).get("remote_num_tokens") or 0, prompt_tokens, local_hit)
    return sc.OUTCOMES[int(kvrules.d2p_outcome(offered, count, local_hit, threshold))]


def check_offer(
    params: dict, prompt: list[int], local_hit: int, threshold: int, mode: str
) -> tuple[dict, tuple | None]:
    """P's check of D's digest (:mod:`kvtrace.kvdigest`), as the instrumented connector does it:
    (the decision's verification attributes, None or, when ``enforce`` trims the offer,
    ``(count, load, outcome)`` by :func:`kvrules.enforced_outcome`)."""
    n = len(prompt)
    wanted = min(int(params.get("remote_num_tokens") or 0), n)
    verdict = kvdigest.verify(
        kvdigest.offered(params),
        prompt,
        wanted,
        engine_id=params.get("remote_engine_id"),
        request_id=params.get("remote_request_id"),
        block_ids=params.get("remote_block_ids"),
    )
    attrs = kvdigest.attributes(verdict, mode, wanted, local_hit, threshold)
    limit = kvdigest.enforced_limit(verdict, mode, wanted)
    if limit is None:
        return attrs, None
    count = wanted - local_hit
    vcount = int(kvrules.verified_count(limit, n, local_hit))
    code = kvrules.enforced_outcome(kvrules.d2p_outcome(True, count, local_hit, threshold), count, vcount, threshold)
    pull = int(kvrules.enforced_pull(count, vcount, threshold))
    return attrs, (pull, pull > 0, sc.OUTCOMES[int(code)])
