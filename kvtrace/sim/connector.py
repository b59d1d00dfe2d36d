"""The connector half of a simulated engine: what vLLM's NixlConnector (pull mode, bidirectional)
does around a request, split from :mod:`kvtrace.sim.engine` so that module keeps the scheduler
side (admission, prefill, decode, freeing) and this one the KV protocol.

On the way in, D's p2d load of the prompt from P (or only a notification on a full local hit) and
P's d2p decision on D's retained blocks (threshold, expiry, the digest check), then the pull itself
from the source engine through the :class:`~kvtrace.sim.engine.Registry`; on the way out,
``request_finished``'s hold (P's lease, D's retention) and the ``kv_transfer_params`` it returns.
The spans go through the engine's :class:`~kvtrace.emit.recorder.KVRecorder` where the real
connector records them.

:class:`Connector` is a mixin of :class:`~kvtrace.sim.engine.Engine`: its methods are the engine's
and read the engine's attributes (declared below); they call back :meth:`Engine._load_failed` and
:meth:`Engine._free`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvtrace import semconv as sc
from kvtrace.sim import scheduler
from kvtrace.sim.holds import Hold, Holds

if TYPE_CHECKING:
    from kvtrace.emit.recorder import KVRecorder
    from kvtrace.sim.costmodel import CostModel
    from kvtrace.sim.engine import Engine, Generation, Registry
    from kvtrace.sim.kvcache import KVCache


class Connector:
    """The NixlConnector methods of :class:`~kvtrace.sim.engine.Engine` (a mixin, no state of its own)."""

    # the engine's, set in Engine.__init__
    engine_id: str
    host: str
    port: int
    kv: scheduler.KVConfig
    cache: KVCache
    cost: CostModel
    recorder: KVRecorder
    registry: Registry
    holds: Holds
    clock: Callable[[], float]

    if TYPE_CHECKING:  # the engine's, called back

        def _free(self, block_ids: list[int], reason: str = ...) -> None: ...

        def _load_failed(self, gen: Generation, error: str) -> None: ...

    def _heartbeat(self, params: dict) -> Engine | None:
        """D renews P's lease from the request's arrival until its load ends (vLLM's heartbeats)."""
        src = self.registry.engines.get(params.get("remote_engine_id"))
        if src is not None:
            src.holds.start_renewal(params.get("remote_request_id"))
        return src

    async def _remote_prefill(self, gen: Generation, count: int, load: bool) -> None:
        """D: pull the prompt's blocks from P (p2d); a full local hit only notifies P."""
        p = gen.params
        common = dict(
            prompt_tokens=len(gen.prompt),
            local_hit_tokens=gen.local_hit,
            remote_tokens=len(gen.prompt),
            peer_engine_id=p.get("remote_engine_id"),
            remote_request_id=p.get("remote_request_id"),
            threshold=self.kv.threshold,
        )
        if not load:
            self.recorder.decision(gen.record_id, direction=sc.DIRECTION_P2D, outcome=sc.OUTCOME_LOCAL_HIT, **common)
            self._notify(p, sc.RETENTION_RELEASED)
            return
        self.recorder.decision(gen.record_id, direction=sc.DIRECTION_P2D, outcome=None, pulled_tokens=count, **common)
        await self._pull(gen, count, sc.DIRECTION_P2D, expiry=None)

    async def _reverse_pull(self, gen: Generation, count: int, load: bool) -> None:
        """P (or a plain request): the bidirectional d2p decision."""
        p = gen.params
        n = len(gen.prompt)
        if not self.kv.bidirectional or not scheduler.has_remote_blocks(p):
            self.recorder.decision(
                gen.record_id,
                direction=sc.DIRECTION_D2P,
                outcome=sc.OUTCOME_NO_REMOTE,
                prompt_tokens=n,
                local_hit_tokens=gen.local_hit,
            )
            return
        expiry = p.get("remote_blocks_expiry_time")
        common = dict(
            prompt_tokens=n,
            local_hit_tokens=gen.local_hit,
            remote_tokens=p.get("remote_num_tokens") or 0,
            peer_engine_id=p.get("remote_engine_id"),
            remote_request_id=p.get("remote_request_id"),
            threshold=self.kv.threshold,
        )
        if isinstance(expiry, (int, float)):
            common.update(expiry_deadline=float(expiry), expiry_remaining_s=round(float(expiry) - self.clock(), 6))
        common["verification"], enforced = scheduler.check_offer(
            p, gen.prompt, gen.local_hit, self.kv.threshold, self.kv.verify
        )
        if enforced is not None:  # verify=enforce: only the verified prefix, or recompute
            count, load, outcome = enforced
        if not load:
            if enforced is None:
                outcome = scheduler.outcome(p, n, gen.local_hit, self.kv.threshold)
            self.recorder.decision(gen.record_id, direction=sc.DIRECTION_D2P, outcome=outcome, **common)
            self._notify(p, sc.RETENTION_RELEASED)  # vLLM's empty read: D frees its blocks
            return
        self.recorder.decision(gen.record_id, direction=sc.DIRECTION_D2P, outcome=None, pulled_tokens=count, **common)
        await self._pull(gen, count, sc.DIRECTION_D2P, expiry=expiry if isinstance(expiry, (int, float)) else None)

    async def _pull(self, gen: Generation, count: int, direction: str, expiry: float | None) -> None:
        p = gen.params
        src_id, remote_req = p.get("remote_engine_id"), p.get("remote_request_id")
        nblocks = math.ceil(count / self.cache.block_size)
        nbytes = nblocks * self.recorder.bytes_per_block
        self.recorder.transfer_started(
            gen.record_id,
            direction=direction,
            tokens=count,
            blocks=nblocks,
            peer_engine_id=src_id,
            remote_request_id=remote_req,
        )
        if direction == sc.DIRECTION_D2P and scheduler.read_expired(self.clock(), expiry):
            self.recorder.transfer_finished(gen.record_id, status=sc.TRANSFER_EXPIRED, error_type=sc.TRANSFER_EXPIRED)
            return self._load_failed(gen, "kv_expired")
        wall = self.cost.wall(self.cost.transfer_s(nbytes))
        if wall > 0:
            await asyncio.sleep(wall)
        error = self._read_remote(src_id, remote_req, direction)
        if error:
            self.recorder.transfer_finished(gen.record_id, status=sc.TRANSFER_FAILED, error_type=error)
            return self._load_failed(gen, error)
        self.recorder.transfer_finished(gen.record_id, status=sc.TRANSFER_OK, xfer_ms=round(wall * 1000, 3))
        gen.pulled = count

    def _read_remote(self, src_id: str, remote_req: str, direction: str) -> str | None:
        """Copy the held blocks from the source engine (frees them there); error type or None."""
        hook = self.registry.fail_pull
        if hook is not None and hook(self.engine_id, src_id, remote_req):
            return "injected_failure"
        src = self.registry.engines.get(src_id)
        if src is None:
            return "unknown_engine"
        reason = sc.RETENTION_READ
        if src.holds.pop(remote_req, reason) is None:
            return "blocks_not_found"
        return None

    def _notify(self, params: dict, reason: str) -> None:
        """Tell the source engine its held blocks are no longer needed (no data read)."""
        src = self.registry.engines.get(params.get("remote_engine_id"))
        if src is not None:
            src.holds.pop(params.get("remote_request_id"), reason)

    def _finished_params(self, gen: Generation, computed: int) -> dict | None:
        """``NixlPullConnectorScheduler.request_finished`` for a normally finished request."""
        p = gen.params
        if not p:
            self._free(gen.blocks)
            return None
        is_p = bool(p.get("do_remote_decode"))
        if not is_p and not self.kv.bidirectional:
            self._free(gen.blocks)
            return None
        block_ids, expiry = list(gen.blocks), None
        if block_ids:
            ttl = self.kv.lease_s if is_p else self.kv.ttl_s
            deadline = self.clock() + ttl
            if not is_p:
                expiry = deadline
                self.recorder.retention_started(
                    gen.record_id, blocks=len(block_ids), tokens=computed, expiry_deadline=deadline
                )
            self.holds.add(Hold(gen.internal_id, gen.record_id, block_ids, computed, deadline, retained=not is_p))
        return dict(
            do_remote_prefill=is_p,
            do_remote_decode=not is_p,
            remote_block_ids=[block_ids],
            remote_engine_id=self.engine_id,
            remote_request_id=gen.internal_id,
            remote_host=self.host,
            remote_port=self.port,
            tp_size=1,
            dcp_size=1,
            pp_size=1,
            remote_num_tokens=computed if block_ids else 0,
            remote_blocks_expiry_time=expiry,
            remote_registration_generation=0,
            transfer_mode="pull",
        )
