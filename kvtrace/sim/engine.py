"""One simulated vLLM engine with a NixlConnector: admission, KV decision, pulls, decode, holds.

The HTTP layer (:mod:`kvtrace.sim.worker`) creates a :class:`Generation` per request with
:meth:`Engine.submit`, awaits :meth:`Generation.prefill`, iterates :meth:`Generation.decode`
and calls :meth:`Generation.finish` (or :meth:`Generation.abort`).  Spans go through
:class:`kvtrace.emit.recorder.KVRecorder`, called where the real connector calls it:
``request_started`` on arrival, ``decision`` after ``get_num_new_matched_tokens``,
``transfer_started/finished`` around the load, ``retention_started`` right before
``request_finished`` on D, ``retention_ended`` when the next P reads (``read``), notifies
without reading (``released``), the TTL passes (``expired``) or the engine stops.

Engines find each other through a :class:`Registry` (in-process stand-in for NIXL's side
channel): a pull asks the source engine for the held request's blocks, which frees them there.

Admission goes through :class:`~kvtrace.sim.kvcache.BlockQueue`, vLLM's FCFS waiting queue: held
blocks (P's lease, D's retention) are referenced, so never evicted, and a request that needs them
waits until a read, a notification or the TTL returns them; a request that waited carries
``kvtrace.engine.queue.*`` on its engine span (:meth:`KVRecorder.queued`).

``prefix_caching=False`` is vLLM's ``--no-enable-prefix-caching``: no lookup (local hit 0) and no
block is published for later requests; blocks a peer reads (P's lease, D's retention) are still held.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtrace import kvdigest
from kvtrace import semconv as sc
from kvtrace.emit.recorder import KVRecorder
from kvtrace.sim import scheduler, tokenizer
from kvtrace.sim.costmodel import CostModel
from kvtrace.sim.holds import Hold, Holds
from kvtrace.sim.kvcache import BlockQueue, KVCache, Wait, block_hashes

FINISH_LENGTH = "length"


def block_ids_of(params: dict) -> list:
    """The first KV-cache group's block ids of a params object."""
    ids = params.get("remote_block_ids") or [[]]
    return ids[0] if ids and isinstance(ids[0], list) else ids


class EngineError(Exception):
    """A request failed inside the engine; ``status``/``err_type`` follow vLLM's error JSON."""

    def __init__(self, message: str, status: int = 500, err_type: str = "InternalServerError") -> None:
        super().__init__(message)
        self.status = status
        self.err_type = err_type


@dataclass
class Registry:
    """Engines by engine id, shared by the workers of one cluster.  ``fail_pull(dst_engine_id,
    src_engine_id, remote_request_id) -> bool`` lets tests make a pull fail."""

    engines: dict[str, Engine] = field(default_factory=dict)
    fail_pull: Callable[[str, str, str], bool] | None = None


@dataclass
class Generation:
    """One request's life on an engine."""

    engine: Engine
    record_id: str
    internal_id: str
    prompt: list[int]
    max_tokens: int
    params: dict | None
    phase: str
    seed: int
    blocks: list[int] = field(default_factory=list)
    local_hit: int = 0
    pulled: int = 0
    output: list[int] = field(default_factory=list)
    done: bool = False
    arrival: float = field(default_factory=time.perf_counter)  # wall clock, for vLLM's TTFT metric
    thinking: bool = False  # reasoning first (chat_template_kwargs.enable_thinking)

    @property
    def cached_tokens(self) -> int:
        return self.local_hit + self.pulled

    async def prefill(self) -> None:
        await self.engine._prefill(self)

    async def decode(self):
        """Yield ``(token_id, text_piece)`` for each generated token."""
        async for item in self.engine._decode(self):
            yield item

    def finish(self, finish_reason: str = FINISH_LENGTH) -> dict:
        """Free or hold blocks as vLLM's connector would; returns kv_transfer_params (with the
        kvtrace summary under ``kvtrace``)."""
        return self.engine._finish(self, finish_reason)

    def abort(self, error_type: str) -> None:
        self.engine._abort(self, error_type)


class Engine:
    """Scheduler + KV cache + connector of one worker (single asyncio loop)."""

    def __init__(
        self,
        *,
        engine_id: str,
        role: str,
        host: str,
        port: int,
        kv: scheduler.KVConfig,
        cache: KVCache,
        cost: CostModel,
        recorder: KVRecorder,
        registry: Registry,
        clock: Callable[[], float] | None = None,
        prefix_caching: bool = True,
    ) -> None:
        self.engine_id = engine_id
        self.prefix_caching = prefix_caching
        self.role = role
        self.host = host
        self.port = port
        self.kv = kv
        self.cache = cache
        self.cost = cost
        self.recorder = recorder
        self.registry = registry
        scale = cost.time_scale
        self.clock = clock or (lambda: time.perf_counter() * scale)
        self.holds = Holds(self.clock, scale, self._on_release)
        self._prefill_lock = asyncio.Lock()
        self.queue = BlockQueue(cache, self.clock, self._held_blocks)
        self._decode_ctx = 0  # sum of context lengths of running decodes (batch KV reads)
        #: called with the wall-clock seconds from arrival to each request's first token
        self.on_first_token: Callable[[float], None] | None = None
        registry.engines[engine_id] = self

    # ------------------------------------------------------------------ entry points
    def submit(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        params: dict | None,
        request_id: str,
        internal_id: str,
        seed: int | None = None,
        headers: dict | None = None,
        thinking: bool = False,
    ) -> Generation:
        need = self.blocks_needed(len(prompt), max_tokens)
        if need > self.cache.capacity:
            raise EngineError(
                f"This request needs {need} KV blocks ({len(prompt)} prompt tokens + "
                f"{max_tokens} output tokens) but the worker holds {self.cache.capacity}.",
                400,
                "BadRequestError",
            )
        if params and params.get("do_remote_decode"):
            phase = sc.ROLE_PREFILL
        elif params and params.get("do_remote_prefill"):
            phase = sc.ROLE_DECODE
        else:
            phase = sc.ROLE_BOTH
        # keyed by the unique internal id, recorded under the X-Request-Id (the join key), as the
        # real connector does
        gen = Generation(
            self,
            internal_id,
            internal_id,
            prompt,
            max_tokens,
            params,
            phase,
            tokenizer.seed_for(prompt, seed),
            thinking=thinking,
        )
        self.recorder.request_started(
            internal_id, phase=phase, prompt_tokens=len(prompt), kv_params=params, headers=headers, public_id=request_id
        )
        return gen

    def blocks_needed(self, prompt_tokens: int, max_tokens: int) -> int:
        """Blocks reserved at admission: every token that will have KV (prompt + output - 1)."""
        return math.ceil((prompt_tokens + max(max_tokens, 1) - 1) / self.cache.block_size)

    @property
    def waiting(self) -> int:
        """Requests queued for KV blocks."""
        return len(self.queue)

    def shutdown(self) -> None:
        """Release every held block (retention ends ``released``) and close open spans."""
        self.holds.release_all(sc.RETENTION_RELEASED)
        self.recorder.shutdown()

    # ------------------------------------------------------------------ prefill side
    async def _prefill(self, gen: Generation) -> None:
        bs = self.cache.block_size
        n = len(gen.prompt)
        hashes = block_hashes(gen.prompt, bs)
        src = self._heartbeat(gen.params) if gen.phase == sc.ROLE_DECODE else None
        try:
            hit = await self._admit(gen, hashes, self.blocks_needed(n, gen.max_tokens))
            gen.local_hit = len(hit) * bs
            count, load = scheduler.matched_tokens(gen.params, n, gen.local_hit, self.kv.threshold)
            if gen.phase == sc.ROLE_DECODE:
                await self._remote_prefill(gen, count, load)
            else:
                await self._reverse_pull(gen, count, load)
        finally:
            if src is not None:  # the load finished (or failed, or was cancelled): heartbeats stop
                src.holds.stop_renewal(gen.params.get("remote_request_id"), src.kv.lease_s * 2 / 3)
        new = n - gen.local_hit - gen.pulled
        if new > 0 and self.cost.enabled:
            async with self._prefill_lock:
                await asyncio.sleep(self.cost.wall(self.cost.prefill_s(new, n)))
        if self.prefix_caching:
            self.cache.commit(gen.blocks[: len(hashes)], hashes)

    def _heartbeat(self, params: dict) -> Engine | None:
        """D renews P's lease from the request's arrival until its load ends (vLLM's heartbeats)."""
        src = self.registry.engines.get(params.get("remote_engine_id"))
        if src is not None:
            src.holds.start_renewal(params.get("remote_request_id"))
        return src

    async def _admit(self, gen: Generation, hashes: list[int], total_blocks: int) -> list[int]:
        """Prefix lookup + block allocation, in vLLM's waiting queue (FCFS) until they fit; a
        wait goes on the request's engine span."""

        def waited(wait: Wait) -> None:
            self.recorder.queued(gen.record_id, self._wait_attributes(wait))

        hit, gen.blocks = await self.queue.admit(hashes, len(gen.prompt), total_blocks, self.prefix_caching, waited)
        return hit

    def _wait_attributes(self, wait: Wait) -> dict:
        attrs = {
            sc.ENGINE_QUEUE_WAIT_MS: round((wait.end - wait.start) / self.cost.time_scale * 1000, 3),
            sc.ENGINE_QUEUE_REASON: wait.reason,
            sc.ENGINE_QUEUE_BLOCKS_NEEDED: wait.needed,
            sc.ENGINE_QUEUE_BLOCKS_FREE: wait.free,
            sc.ENGINE_QUEUE_BLOCKS_HELD: wait.held,
        }
        if wait.freed_by is not None:
            attrs[sc.ENGINE_QUEUE_FREED_BY] = wait.freed_by
        return attrs

    def _held_blocks(self) -> int:
        """Blocks that only holds for remote readers keep referenced (what ending them all frees)."""
        counts = Counter(b for hold in self.holds.values() for b in hold.block_ids)
        return sum(1 for b, n in counts.items() if self.cache.refcount(b) == n)

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

    def _load_failed(self, gen: Generation, error: str) -> None:
        if self.kv.kv_load_failure_policy == "recompute":
            return  # recorder already counts the tokens as recomputed
        self._fail(gen, error)
        raise EngineError("Internal server error", 500, "InternalServerError")

    # ------------------------------------------------------------------ decode side
    async def _decode(self, gen: Generation):
        ids, pieces = tokenizer.generate(gen.seed, gen.max_tokens, gen.thinking)
        ctx = len(gen.prompt)
        self._decode_ctx += ctx
        try:
            for i, (tid, piece) in enumerate(zip(ids, pieces, strict=True)):
                if self.cost.enabled:
                    await asyncio.sleep(self.cost.wall(self.cost.decode_step_s(self._decode_ctx)))
                    self._decode_ctx += 1
                    ctx += 1
                gen.output.append(tid)
                if i == 0 and self.on_first_token is not None:
                    self.on_first_token(time.perf_counter() - gen.arrival)
                yield tid, piece
        finally:
            self._decode_ctx -= ctx

    def _finish(self, gen: Generation, finish_reason: str) -> dict:
        if gen.done:
            return {}
        gen.done = True
        computed = len(gen.prompt) + max(len(gen.output) - 1, 0)
        keep = math.ceil(computed / self.cache.block_size)
        tail, gen.blocks = gen.blocks[keep:], gen.blocks[:keep]
        self._free(tail)
        if self.prefix_caching:
            tokens = gen.prompt + gen.output[:-1]
            hashes = block_hashes(tokens, self.cache.block_size)
            self.cache.commit(gen.blocks[: len(hashes)], hashes)
        params = self._finished_params(gen, computed)
        summary = self.recorder.request_finished(
            gen.record_id, output_tokens=len(gen.output), cached_tokens=gen.cached_tokens
        )
        out = dict(params) if params else {}
        if params and params["do_remote_decode"] and block_ids_of(params):  # D retains: what its blocks hold
            summary[sc.KVT_DIGEST] = kvdigest.make(
                gen.prompt + gen.output[:-1],
                computed,
                engine_id=self.engine_id,
                request_id=gen.internal_id,
                block_ids=params["remote_block_ids"],
            )
        out[sc.KV_PARAMS_KEY] = summary
        return out

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

    def _abort(self, gen: Generation, error_type: str) -> None:
        if not gen.done:
            self._fail(gen, error_type)

    def _fail(self, gen: Generation, error_type: str) -> None:
        gen.done = True
        self._free(gen.blocks)
        gen.blocks = []
        self.recorder.request_finished(
            gen.record_id, output_tokens=len(gen.output), cached_tokens=gen.cached_tokens, error_type=error_type
        )

    # ------------------------------------------------------------------ blocks
    def _free(self, block_ids: list[int], reason: str = sc.FREED_FINISHED) -> None:
        if block_ids:
            self.cache.free(list(reversed(block_ids)))  # vLLM frees tail first: evicted first
            self.queue.released(reason)

    def _on_release(self, hold: Hold, reason: str) -> None:
        self._free(hold.block_ids, reason)
        if hold.retained:
            self.recorder.retention_ended(hold.record_id, reason)
