"""One simulated vLLM engine with a NixlConnector: admission, KV decision, pulls, decode, holds.

The HTTP layer (:mod:`kvtrace.sim.worker`) creates a :class:`Generation` per request with
:meth:`Engine.submit`, awaits :meth:`Generation.prefill`, iterates :meth:`Generation.decode`
and calls :meth:`Generation.finish` (or :meth:`Generation.abort`).  Spans go through
:class:`kvtrace.emit.recorder.KVRecorder`, called where the real connector calls it:
``request_started`` on arrival, ``decision`` after ``get_num_new_matched_tokens``,
``transfer_started/finished`` around the load, ``retention_started`` right before
``request_finished`` on D, ``retention_ended`` when the next P reads (``read``), notifies
without reading (``released``), the TTL passes (``expired``) or the engine stops.  The
connector's side of this (the KV decision, the pull, the hold after a finished request) is in
:mod:`kvtrace.sim.connector`.

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
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvtrace import kvdigest
from kvtrace import semconv as sc
from kvtrace.emit.recorder import KVRecorder
from kvtrace.sim import decoding, scheduler, tokenizer
from kvtrace.sim.connector import Connector
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
    hashes: list[int] = field(default_factory=list)  # the prompt's full blocks' (set at prefill)
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

    async def decode_batches(self, pacer: decoding.Pacer | None):
        """Yield the generated tokens in lists, each at the time of its last token, which
        ``pacer.deliver(i, piece)`` asked to see then (None: only the last); on the virtual loop by
        :mod:`~kvtrace.sim.decoding`'s fast events, else token by token."""
        loop = decoding.fast_loop(self.engine)
        if loop is not None:
            async for batch in decoding.batches(self.engine, self, pacer, loop):
                yield batch
            return
        batch: list[decoding.Token] = []
        async for item in self.engine._decode(self):
            batch.append(item)
            i = len(self.output) - 1  # the engine made max_tokens tokens (tokenizer.generate)
            if i + 1 == self.max_tokens or (pacer is not None and pacer.deliver(i, item[1])):
                yield batch
                batch = []

    def finish(self, finish_reason: str = FINISH_LENGTH) -> dict:
        """Free or hold blocks as vLLM's connector would; returns kv_transfer_params (with the
        kvtrace summary under ``kvtrace``)."""
        return self.engine._finish(self, finish_reason)

    def abort(self, error_type: str) -> None:
        self.engine._abort(self, error_type)


class Engine(Connector):
    """Scheduler + KV cache + connector of one worker (single asyncio loop); the connector's
    methods (decision, pull, hold) are :class:`~kvtrace.sim.connector.Connector`'s."""

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
        self._held_key, self._held_count = (-1, -1), 0  # _held_blocks's last answer, and when
        self._decode_ctx = 0  # sum of context lengths of running decodes (batch KV reads)
        self._ahead: Any = None  # the decode whose steps kvtrace.sim.decoding computed ahead, if any
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
        hashes = gen.hashes = block_hashes(gen.prompt, bs)
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
        # every request that must wait asks, and a full D holds tens of thousands of blocks: the C
        # pool counts them in one pass, again only once references or holds changed (the queue and
        # the holds count their changes; an overloaded fleet spent half its CPU here)
        key = (self.queue.changes, self.holds.changes)
        if key != self._held_key:
            self._held_key = key
            self._held_count = self.cache.held_only([hold.block_ids for hold in self.holds.values()])
        return self._held_count

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
                    await asyncio.sleep(self._step_s())
                    self._decode_ctx += 1
                    ctx += 1
                gen.output.append(tid)
                if i == 0 and self.on_first_token is not None:
                    self.on_first_token(time.perf_counter() - gen.arrival)
                yield tid, piece
        finally:
            self._decode_ctx -= ctx

    def _step_s(self) -> float:
        """The next decode step's duration (wall s) on the running batch's context now."""
        return self._step_at(self._decode_ctx)

    def _step_at(self, ctx: int) -> float:
        """A decode step's duration (wall s) on ``ctx`` tokens of running context."""
        return self.cost.wall(self.cost.decode_step_s(ctx))

    def _finish(self, gen: Generation, finish_reason: str) -> dict:
        if gen.done:
            return {}
        gen.done = True
        computed = len(gen.prompt) + max(len(gen.output) - 1, 0)
        keep = math.ceil(computed / self.cache.block_size)
        tail, gen.blocks = gen.blocks[keep:], gen.blocks[:keep]
        self._free(tail)
        if self.prefix_caching:  # the prompt's full blocks hash as at prefill: go on from the last
            bs, known = self.cache.block_size, gen.hashes
            rest = itertools.chain(gen.prompt[len(known) * bs :], gen.output[:-1])
            hashes = known + block_hashes(rest, bs, known[-1] if known else 0)  # type: ignore[arg-type]
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

    def _abort(self, gen: Generation, error_type: str) -> None:
        decoding.settle(self)  # the tokens it made so far, if its steps were computed ahead
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
