"""What the proxy knows of D's block retention (``decoder_kv_blocks_ttl``), per decode worker.

An instrumented D (kvtrace connector or simulator) reports it in the ``kvtrace`` object of its final
``kv_transfer_params`` (``retained_ttl_s``); otherwise ``--decoder-kv-ttl`` says it.  (vLLM's own
``remote_blocks_expiry_time`` is a deadline on D's ``perf_counter`` clock, which the proxy cannot
read, so it cannot be turned into a TTL here.)  Used to warn, at start-up and when a D first
reports, that ``--conversation-ttl`` can outlive D's retention, and to name a failed read of an
offered entry ``expired`` (older than the retention minus vLLM's 5 s read margin) or ``failed``.
"""

from __future__ import annotations

import logging

from kvtrace import semconv as sc
from kvtrace.proxy.config import EXPIRY_SAFETY_MARGIN_S, ProxyConfig

log = logging.getLogger(__name__)


class Retention:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.reported: dict[str, float] = {}  # D base URL -> retention it reported, s
        self._warn(config.decoder_kv_ttl_s, "--decoder-kv-ttl")

    def ttl(self, decode_endpoint: str) -> float | None:
        return self.reported.get(decode_endpoint, self.config.decoder_kv_ttl_s)

    def learn(self, decode_endpoint: str, params: dict) -> None:
        """D's final params; remember the retention it reports (cheap when unchanged)."""
        obj = params.get(sc.KV_PARAMS_KEY)
        ttl = obj.get(sc.KVT_RETAINED_TTL_S) if isinstance(obj, dict) else None
        if ttl is None or ttl == self.reported.get(decode_endpoint):
            return
        if isinstance(ttl, (int, float)) and not isinstance(ttl, bool) and ttl > 0:
            self.reported[decode_endpoint] = float(ttl)
            self._warn(float(ttl), f"decode worker {decode_endpoint} (reported)")

    def read_failure(self, decode_endpoint: str, entry_age_s: float) -> str:
        """The decision for an offer P failed to read: ``expired`` or ``failed``."""
        ttl = self.ttl(decode_endpoint)
        if ttl is not None and entry_age_s + EXPIRY_SAFETY_MARGIN_S >= ttl:
            return sc.OUTCOME_EXPIRED
        return sc.OUTCOME_FAILED

    def _warn(self, decoder_ttl_s: float | None, source: str) -> None:
        if decoder_ttl_s is not None and self.config.offer_outlives(decoder_ttl_s):
            log.warning(
                "kvtrace proxy: --conversation-ttl %g s + %g s (vLLM's read margin) reaches D's block retention "
                "%g s from %s: turns resumed after a pause may be offered blocks D has dropped; P then fails "
                "the read and the proxy retries without them (decision 'expired'). Set --conversation-ttl "
                "below %g s.",
                self.config.conversation_ttl_s,
                EXPIRY_SAFETY_MARGIN_S,
                decoder_ttl_s,
                source,
                decoder_ttl_s - EXPIRY_SAFETY_MARGIN_S,
            )
