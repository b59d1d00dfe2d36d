"""Scheduler-side instrumentation: turns what NixlConnector's scheduler hooks see into
:class:`~kvtrace.emit.recorder.KVRecorder` calls.

Lives in the EngineCore process, next to vLLM's scheduler, and is driven only by
:class:`~kvtrace.vllm.connector.KVTraceNixlConnector` *after* it forwarded each hook to
NixlConnector, with NixlConnector's result.  Every entry point is wrapped by :func:`~kvtrace.emit.guard.never_raise`:
an exception in here is logged once per hook and never reaches vLLM.

Per request (keyed by vLLM's internal request id):

- ``on_new_request`` starts the engine span; the leg is read from ``kv_transfer_params``
  before NixlConnector mutates them: ``do_remote_decode`` = P leg (phase prefill, direction
  d2p: the next turn's P pulls D's retained blocks), ``do_remote_prefill`` = D leg (phase
  decode, p2d); neither = not disaggregated (engine span only, no decision).
- ``verify`` (get_num_new_matched_tokens, before the forward, once): a P leg offered D's blocks
  checks the offer's digest against the prompt (:mod:`kvtrace.kvdigest`); under ``enforce`` a
  shorter verified prefix rewrites the offer (``remote_num_tokens`` and ``remote_block_ids``
  trimmed to it: NIXL reads the tail of that list for the blocks it loads), so vLLM's own rule
  loads only verified tokens or recomputes.
- ``matched`` (get_num_new_matched_tokens; may run several times while the request cannot be
  allocated) keeps the latest inputs; ``allocated`` (update_state_after_alloc; its
  ``num_external_tokens`` is what the scheduler really loads) makes the decision and, when
  tokens are loaded, starts the transfer span.
- ``connector_output`` (update_connector_output, every step): finished / failed receiving end
  transfers (``expired`` when the worker's stats in the same output count declined expired
  reads), NIXL stats are attributed, ``finished_sending`` of a retained request ends its
  retention (``expired`` when past D's own deadline, else ``read``).
- ``finished`` (request_finished*): retention starts on D when the returned params carry
  ``do_remote_decode`` with held blocks, and the digest of the tokens they hold joins the
  recorder's summary, which goes into the params.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kvtrace import kvdigest
from kvtrace import semconv as sc
from kvtrace.emit.guard import never_raise
from kvtrace.emit.recorder import KVRecorder
from kvtrace.vllm.blockhash import BlockHashing
from kvtrace.vllm.config import public_request_id

log = logging.getLogger(__name__)
_REMOTE_KEYS = frozenset(("remote_engine_id", "remote_request_id", "remote_host", "remote_port"))
_ABORT_ERRORS = {"FINISHED_ABORTED": "aborted", "FINISHED_ERROR": "error"}


@dataclass(slots=True)
class _Req:
    phase: str
    direction: str | None
    prompt_tokens: int
    local: int = 0
    offered: int = 0  # min(remote_num_tokens, prompt) on a P leg
    has_remote: bool = False
    decided: bool = False
    peer: str | None = None
    remote_request_id: str | None = None
    deadline: float | None = None  # peer's remote_blocks_expiry_time (peer clock)
    loading: bool = False
    block_ids: tuple | list = ()  # per KV-cache group: the blocks being loaded
    limit: int | None = None  # verify=enforce: the offer was trimmed to this many tokens
    verdict: kvdigest.Verdict | None = None  # P's check of D's offer (d2p with an offer), once


def _has_remote(params: dict) -> bool:
    return bool(params.get("remote_block_ids")) and params.keys() >= _REMOTE_KEYS


def _context_entry(params: dict | None) -> dict | None:
    """The proxy's kvtrace context; a worker summary echoed back (it has engine_id) is not one."""
    if not params:
        return None
    entry = params.get(sc.KV_PARAMS_KEY)
    if isinstance(entry, dict) and sc.KVT_ENGINE_ID in entry and sc.CTX_TRACEPARENT not in entry:
        return {k: v for k, v in params.items() if k != sc.KV_PARAMS_KEY}
    return params


class SchedulerProbe:
    """Instrumentation state of one scheduler-side connector."""

    def __init__(
        self,
        recorder: KVRecorder,
        *,
        block_bytes: list[int],
        bidirectional: bool,
        verify: str = sc.VERIFY_RECORD,
        hashing: BlockHashing | None = None,
    ) -> None:
        self.recorder = recorder
        self.hashing = hashing  # None: v1 digests only (tests, another vLLM)
        self._blocks: kvdigest.BlockConfig | None = None  # hashing.config(), once known
        self.verify_mode = verify
        self.threshold = recorder.threshold
        self.block_bytes = block_bytes
        self.bidirectional = bidirectional
        self._reqs: dict[str, _Req] = {}
        self._loading: dict[str, _Req] = {}
        self._retained: dict[str, float | None] = {}  # request id -> own expiry (perf_counter)
        # requests vLLM failed for a failed load: it frees them (request_finished) before it
        # hands the same step's connector output to update_connector_output
        self._deferred: dict[str, dict] = {}

    # ------------------------------------------------------------------ request arrives
    @never_raise()
    def on_new_request(self, request) -> None:
        rid = request.request_id
        if rid in self._reqs:
            return
        params = request.kv_transfer_params
        if params and params.get("do_remote_decode"):
            phase, direction = sc.ROLE_PREFILL, sc.DIRECTION_D2P
        elif params and params.get("do_remote_prefill"):
            phase, direction = sc.ROLE_DECODE, sc.DIRECTION_P2D
        else:
            phase, direction = sc.ROLE_BOTH, None
        prompt = int(request.num_prompt_tokens)
        st = _Req(phase, direction, prompt)
        if params:
            st.has_remote = _has_remote(params)
            st.peer = params.get("remote_engine_id")
            st.remote_request_id = params.get("remote_request_id")
            st.deadline = params.get("remote_blocks_expiry_time")
            st.offered = min(int(params.get("remote_num_tokens") or 0), prompt) if phase == sc.ROLE_PREFILL else prompt
        self._reqs[rid] = st
        self.recorder.request_started(
            rid,
            phase=phase,
            prompt_tokens=prompt,
            kv_params=_context_entry(params),
            headers=request.trace_headers,
            public_id=public_request_id(rid),
        )

    def _block_config(self) -> kvdigest.BlockConfig | None:
        if self.hashing is not None:
            self._blocks = self.hashing.config()
        return self._blocks

    # ------------------------------------------------------------------ the decision
    @never_raise()
    def verify(self, request) -> None:
        st = self._reqs.get(request.request_id)
        if st is None or st.verdict is not None or st.direction != sc.DIRECTION_D2P or not st.has_remote:
            return
        params = request.kv_transfer_params
        st.verdict = verdict = kvdigest.verify(
            kvdigest.offered(params),
            request.prompt_token_ids or (),
            st.offered,
            engine_id=params.get("remote_engine_id"),
            request_id=params.get("remote_request_id"),
            block_ids=params.get("remote_block_ids"),
            block_hashes=request.block_hashes,
            blocks=self._blocks or self._block_config(),
        )
        # its attributes wait for the local hit (the mismatch's wrong tokens): allocated()
        st.limit = kvdigest.enforced_limit(verdict, self.verify_mode, st.offered)
        if st.limit is not None:
            _trim_offer(params, st.limit, self.recorder.block_size)

    @never_raise()
    def matched(self, request, num_computed_tokens: int) -> None:
        st = self._reqs.get(request.request_id)
        if st is not None and not st.decided:
            st.local = int(num_computed_tokens)

    @never_raise()
    def allocated(self, request, blocks, num_external_tokens: int) -> None:
        rid = request.request_id
        st = self._reqs.get(rid)
        if st is None or st.decided or st.direction is None:
            return
        st.decided = True
        pulled = int(num_external_tokens) if num_external_tokens > 0 else 0
        verification = None
        if st.verdict is not None:
            verification = kvdigest.attributes(st.verdict, self.verify_mode, st.offered, st.local, self.threshold)
        self.recorder.decision(
            rid,
            direction=st.direction,
            outcome=None if pulled else self._no_load_outcome(st),  # None: settled when the load ends
            prompt_tokens=st.prompt_tokens,
            local_hit_tokens=st.local,
            remote_tokens=st.offered if st.has_remote else 0,
            pulled_tokens=pulled,
            expiry_deadline=st.deadline,
            expiry_remaining_s=self._remaining(st),
            peer_engine_id=st.peer,
            remote_request_id=st.remote_request_id,
            verification=verification,
        )
        if pulled:
            self._start_transfer(rid, st, blocks, pulled)

    def _no_load_outcome(self, st: _Req) -> str:
        if not st.has_remote:
            return sc.OUTCOME_NO_REMOTE
        wanted = st.offered - st.local
        if wanted <= 0:
            return sc.OUTCOME_LOCAL_HIT
        if st.direction == sc.DIRECTION_D2P and self.threshold > 0 and wanted < self.threshold:
            return sc.OUTCOME_BELOW_THRESHOLD
        if st.limit is not None:  # kvrules.enforced_outcome: the verified part did not clear the threshold
            return sc.OUTCOME_UNVERIFIED
        # the scheduler declined a load NixlConnector offered (e.g. prompt logprobs)
        return sc.OUTCOME_LOCAL_HIT if st.local > 0 else sc.OUTCOME_NO_REMOTE

    @staticmethod
    def _remaining(st: _Req) -> float | None:
        # remote_blocks_expiry_time is on D's perf_counter (CLOCK_MONOTONIC): comparable on one
        # host; across hosts it is off by the hosts' boot-time difference.
        if st.deadline is None:
            return None
        return round(float(st.deadline) - time.perf_counter(), 3)

    def _start_transfer(self, rid: str, st: _Req, blocks, tokens: int) -> None:
        per_group = blocks.get_unhashed_block_ids_all_groups()
        if len(per_group) == 1:  # the common case, without a generator
            nbytes = len(per_group[0]) * self.block_bytes[0]
        else:
            nbytes = sum(len(ids) * size for ids, size in zip(per_group, self.block_bytes, strict=True))
        st.loading = True
        st.block_ids = per_group  # checked against invalid_block_ids only when there are some
        self._loading[rid] = st
        self.recorder.transfer_started(
            rid,
            direction=st.direction,
            tokens=tokens,
            blocks=len(per_group[0]) if per_group else 0,
            peer_engine_id=st.peer,
            remote_request_id=st.remote_request_id,
            nbytes=nbytes,
        )

    # ------------------------------------------------------------------ worker results
    @never_raise()
    def connector_output(self, output) -> None:
        recving = output.finished_recving
        sending = output.finished_sending
        failed_ids = getattr(output, "failed_recving", None)
        invalid = output.invalid_block_ids
        stats = getattr(output.kv_connector_stats, "data", None)
        if not (recving or sending or failed_ids or invalid or stats or self._deferred):
            return
        if self._loading and (recving or failed_ids or invalid):
            self._end_transfers(set(recving or ()), set(failed_ids or ()), invalid, stats)
        elif stats:
            log.debug("kvtrace: NIXL stats with no finishing transfer (in vllm:nixl_* metrics)")
        if self._deferred:
            deferred, self._deferred = self._deferred, {}
            for rid, kwargs in deferred.items():
                self._loading.pop(rid, None)
                self.recorder.request_finished(rid, **kwargs)
        if sending and self._retained:
            now = time.perf_counter()
            for rid in sending:
                if rid in self._retained:
                    deadline = self._retained.pop(rid)
                    expired = deadline is not None and now >= deadline
                    self.recorder.retention_ended(rid, sc.RETENTION_EXPIRED if expired else sc.RETENTION_READ)

    def _end_transfers(self, recving: set, failed_ids: set, invalid, stats: dict | None) -> None:
        failed = {rid for rid in failed_ids if rid in self._loading}
        if invalid:
            failed |= {
                rid for rid, st in self._loading.items() if any(not invalid.isdisjoint(ids) for ids in st.block_ids)
            }
        ok = [rid for rid in recving if rid in self._loading and rid not in failed]
        n_expired = len(stats.get("num_kv_expired_reqs", ())) if stats else 0
        # the worker declines a read near D's deadline: the least time left is the likeliest
        ranked = sorted(failed, key=lambda r: self._remaining(self._loading[r]) or float("inf"))
        expired = set(ranked[:n_expired])
        timing = {}
        if stats and len(ok) == 1 and stats.get("transfer_duration"):
            timing = {
                "xfer_ms": sum(stats["transfer_duration"]) * 1e3,
                "post_ms": sum(stats.get("post_duration", ())) * 1e3,
            }
        elif stats:
            event = _stats_event(stats)
            for rid in (*ok, *ranked):
                self.recorder.nixl_stats(rid, event)
        for rid in ok:
            self._loading.pop(rid).loading = False
            self.recorder.transfer_finished(rid, status=sc.TRANSFER_OK, **timing)
        for rid in ranked:
            self._loading.pop(rid).loading = False
            status = sc.TRANSFER_EXPIRED if rid in expired else sc.TRANSFER_FAILED
            self.recorder.transfer_finished(rid, status=status, error_type=status)

    # ------------------------------------------------------------------ request leaves
    @never_raise()
    def finished(self, request, delay_free: bool, params: dict | None) -> None:
        rid = request.request_id
        st = self._reqs.pop(rid, None)
        if st is None:
            return
        status = getattr(request.status, "name", "")
        finish = dict(
            output_tokens=int(request.num_output_tokens),
            cached_tokens=max(0, int(getattr(request, "num_cached_tokens", 0) or 0)),
            error_type=_ABORT_ERRORS.get(status),
        )
        if st.loading and status == "FINISHED_ERROR":
            self._deferred[rid] = finish  # its load result is in this step's connector output
            return
        self._loading.pop(rid, None)
        if delay_free and params and params.get("do_remote_decode") and st.phase != sc.ROLE_PREFILL:
            block_ids = params.get("remote_block_ids") or [[]]
            first = block_ids[0] if block_ids and isinstance(block_ids[0], list) else block_ids
            self.recorder.retention_started(
                rid,
                blocks=len(first),
                tokens=int(params.get("remote_num_tokens") or 0),
                expiry_deadline=params.get("remote_blocks_expiry_time"),
            )
            self._retained[rid] = params.get("remote_blocks_expiry_time")
        summary = self.recorder.request_finished(rid, **finish)
        if params is not None and summary:
            if rid in self._retained:
                summary[sc.KVT_DIGEST] = _digest(request, params, self._blocks or self._block_config())
            params[sc.KV_PARAMS_KEY] = summary

    @never_raise()
    def metrics_payload(self) -> dict | None:
        """The recorder's counters since the last call (:class:`~kvtrace.emit.metrics.KVMetrics`
        payload), for the connector stats vLLM carries to its /metrics; None when nothing changed."""
        metrics = self.recorder.metrics
        return metrics.drain() if metrics is not None else None

    @never_raise()
    def shutdown(self) -> None:
        self._retained.clear()
        self.recorder.shutdown()


def _digest(request, params: dict, blocks: kvdigest.BlockConfig | None = None) -> dict:
    """D: the digest of the tokens its retained blocks hold (remote_num_tokens of them): v2 over
    the request's vLLM block hashes when they cover them and the configuration (``blocks``) is
    known, else v1."""
    n = int(params.get("remote_num_tokens") or 0)
    engine_id, request_id = params.get("remote_engine_id"), params.get("remote_request_id")
    block_ids = params.get("remote_block_ids")
    if blocks is not None and kvdigest.covers(request.block_hashes, n, blocks):
        return kvdigest.make_blocks(
            request.block_hashes,
            request.all_token_ids,
            n,
            blocks,
            engine_id=engine_id,
            request_id=request_id,
            block_ids=block_ids,
        )
    return kvdigest.make(request.all_token_ids, n, engine_id=engine_id, request_id=request_id, block_ids=block_ids)


def _trim_offer(params: dict, limit: int, block_size: int) -> None:
    """``verify: enforce``: make the offer cover the first ``limit`` tokens only.  NIXL pairs the
    blocks it loads with the *tail* of remote_block_ids, so the list is cut to the blocks of those
    tokens; with several KV-cache groups (hybrid models) the positions differ per group, so the
    offer is emptied instead (P recomputes; D is still notified)."""
    groups = params.get("remote_block_ids") or []
    nested = bool(groups) and isinstance(groups[0], list)
    if nested and len(groups) > 1:
        limit = 0
    keep = -(-limit // block_size)
    params["remote_num_tokens"] = limit
    if keep:
        params["remote_block_ids"] = [groups[0][:keep]] if nested else groups[:keep]


def _stats_event(stats: dict) -> dict:
    """kvtrace.nixl.* attributes of one interval of NixlKVConnectorStats.data."""
    return {
        sc.NIXL_NUM_TRANSFERS: len(stats.get("transfer_duration", ())),
        sc.NIXL_BYTES: int(sum(stats.get("bytes_transferred", ()))),
        sc.NIXL_XFER_MS: float(sum(stats.get("transfer_duration", ())) * 1e3),
        sc.NIXL_POST_MS: float(sum(stats.get("post_duration", ())) * 1e3),
        sc.NIXL_NUM_FAILED: len(stats.get("num_failed_transfers", ())) + len(stats.get("num_failed_handshakes", ())),
        sc.NIXL_NUM_EXPIRED: len(stats.get("num_kv_expired_reqs", ())),
    }
