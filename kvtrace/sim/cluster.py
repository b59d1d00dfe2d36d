"""``SimCluster``: simulated vLLM P/D workers speaking 0.33's bidirectional KV protocol.

API (stable; the proxy, bench, demo and tests use it)::

    from kvtrace.sim.cluster import SimCluster

    async with SimCluster(
        n_prefill=1, n_decode=1, *,
        preset="qwen3-32b",          # cost/bytes preset: qwen3-32b | glm5-fp8 | llama-3.3-70b
        kv_config=None,              # vLLM --kv-transfer-config dict; bidirectional on by default
        time_scale=1.0,              # >1 compresses every sleep, TTL and lease
        cost=True,                   # False: zero-cost (no sleeps at all)
        traces_dir=None,             # Parquet traces (else KVTRACE_TRACES_DIR / none)
        tracer_provider=None,        # one provider for every worker (tests)
        tracer_provider_factory=None,  # (service_name, resource_attributes) -> TracerProvider
        host="127.0.0.1", prefill_port=0, decode_port=0,  # 0 = ephemeral; N>1 use port, port+1, ...
        block_size=None, capacity_blocks=65536, link="efa-3200",  # block size None: the preset's
        model=None,                  # served model name; None = accept any, list the preset name
        no_prefix_caching=(),        # roles run with vLLM's --no-enable-prefix-caching: "prefill", "decode"
        cost_model=None,             # kvtrace.sim.fitted.FittedCostModel: its rates, time scale and on/off
        clock=None,                  # simulated clock () -> seconds (tests inject one)
        metrics=None,                # GET /metrics per worker (None: KVTRACE_METRICS, default on)
        stream_interval=1,           # vLLM's --stream-interval (kvtrace.sim.streaming); math.inf: first + rest
    ) as c:
        c.prefill_urls, c.decode_urls          # ["http://127.0.0.1:PORT", ...]
        c.prefill[0].engine, c.decode[0].engine  # Engine: .cache, .holds, .recorder, .kv
        c.set_pull_failure(lambda dst, src, remote_request_id: True)  # make pulls fail

Every worker gets its own TracerProvider (``kvtrace.configure`` with service
``kvtrace-sim-prefill`` / ``kvtrace-sim-decode`` and resource attributes substrate=sim, engine id,
role, time scale, preset, clock (``virtual`` on :mod:`kvtrace.sim.virtual`'s loop, else ``wall``),
prefix caching on/off, bidirectional on/off, KV pool bytes) unless ``tracer_provider`` is given;
providers made here are flushed and shut down on exit.  With metrics on, each worker serves
``GET /metrics`` like a vLLM server (:mod:`kvtrace.sim.metrics`): its recorder counts every KV span
it ends.  On exit every retained block is released (retention ends ``released``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.emit.metrics import KVMetrics
from kvtrace.emit.recorder import KVRecorder
from kvtrace.sim.costmodel import PRESETS, CostModel
from kvtrace.sim.engine import Engine, Registry
from kvtrace.sim.kvcache import KVCache
from kvtrace.sim.metrics import WorkerMetrics
from kvtrace.sim.scheduler import KVConfig
from kvtrace.sim.virtual import VirtualLoop
from kvtrace.sim.wire import check_tool_calls
from kvtrace.sim.worker import SimWorker

SERVICE = {sc.ROLE_PREFILL: "kvtrace-sim-prefill", sc.ROLE_DECODE: "kvtrace-sim-decode"}
# the workers' KV spans through kvtrace.telemetry.fastspans where it reproduces the provider (one loop thread)
FAST_SPANS = True


class SimCluster:
    def __init__(
        self,
        n_prefill: int = 1,
        n_decode: int = 1,
        *,
        preset: str = "qwen3-32b",
        kv_config: dict | None = None,
        time_scale: float = 1.0,
        cost: bool = True,
        traces_dir: str | None = None,
        tracer_provider=None,
        tracer_provider_factory: Callable | None = None,
        host: str = "127.0.0.1",
        prefill_port: int = 0,
        decode_port: int = 0,
        block_size: int | None = None,
        capacity_blocks: int = 65536,
        link: str = "efa-3200",
        model: str | None = None,
        clock: Callable[[], float] | None = None,
        metrics: bool | None = None,
        no_prefix_caching: tuple[str, ...] | list[str] = (),
        tool_calls: str | None = None,
        cost_model=None,
        stream_interval: float = 1,
    ) -> None:
        if n_prefill < 0 or n_decode < 0 or n_prefill + n_decode == 0:
            raise ValueError("need at least one worker")
        bad = set(no_prefix_caching) - {sc.ROLE_PREFILL, sc.ROLE_DECODE}
        if bad:
            raise ValueError(f"no_prefix_caching: unknown role(s) {sorted(bad)}; use prefill, decode")
        self.no_prefix_caching = frozenset(no_prefix_caching)
        self.stream_interval = stream_interval  # the workers' (kvtrace.sim.streaming)
        # scripted tool calls (kvtrace.sim.wire.scripted_tool_call); None = off
        self.tool_calls = check_tool_calls(tool_calls)
        if preset not in PRESETS and cost_model is None:
            raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
        self.n_prefill, self.n_decode = n_prefill, n_decode
        self.preset, self.link, self.time_scale, self.cost = preset, link, float(time_scale), cost
        # a cost model in the engine's interface (kvtrace.sim.fitted) instead of the preset's: its
        # time scale and on/off are the cluster's, its name the preset attribute
        self.cost_model = cost_model
        if cost_model is not None:
            self.preset, self.time_scale, self.cost = cost_model.name, cost_model.time_scale, cost_model.enabled
        self.kv = KVConfig.from_dict(kv_config)
        self.traces_dir = traces_dir
        self._provider = tracer_provider
        self._factory = tracer_provider_factory
        self.host, self.prefill_port, self.decode_port = host, prefill_port, decode_port
        if block_size is None:  # the preset's (a fitted cost model brings no preset: vLLM's default)
            block_size = PRESETS[preset].block_size if preset in PRESETS else 16
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.model, self.clock = model, clock
        self.metrics = bool(settings.METRICS.get(metrics)) and not settings.DISABLE.get()
        self.registry = Registry()
        self.prefill: list[SimWorker] = []
        self.decode: list[SimWorker] = []
        self._owned_providers: list = []
        # stateless (durations from the preset and the numbers): every worker shares one
        self._cost = self.cost_model or CostModel(
            self.preset, self.link, enabled=self.cost, time_scale=self.time_scale, block_size=self.block_size
        )

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> SimCluster:
        try:
            for i in range(self.n_prefill):
                self.prefill.append(await self._start(sc.ROLE_PREFILL, i, self.prefill_port))
            for i in range(self.n_decode):
                self.decode.append(await self._start(sc.ROLE_DECODE, i, self.decode_port))
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        for worker in self.prefill + self.decode:
            await worker.stop()
            worker.engine.shutdown()
        for provider in self._owned_providers:
            try:
                provider.shutdown()
            except Exception:  # telemetry never raises into the host
                pass
        self._owned_providers.clear()

    # ------------------------------------------------------------------ accessors
    @property
    def prefill_urls(self) -> list[str]:
        return [f"http://{self.host}:{w.port}" for w in self.prefill]

    @property
    def decode_urls(self) -> list[str]:
        return [f"http://{self.host}:{w.port}" for w in self.decode]

    @property
    def engines(self) -> dict[str, Engine]:
        return dict(self.registry.engines)

    def set_pull_failure(self, predicate: Callable[[str, str, str], bool] | None) -> None:
        """``predicate(dst_engine_id, src_engine_id, remote_request_id)`` True -> that pull fails."""
        self.registry.fail_pull = predicate

    # ------------------------------------------------------------------ internals
    def _engine_id(self, role: str, index: int) -> str:
        base = self.kv.engine_id or "sim"
        return f"{base}-{role}-{index}"

    def _tracer_provider(self, role: str, engine_id: str):
        if self._provider is not None:
            return self._provider
        attrs = {
            sc.SUBSTRATE: sc.SUBSTRATE_SIM,
            sc.ENGINE_ID: engine_id,
            sc.ENGINE_ROLE: role,
            sc.SIM_TIME_SCALE: self.time_scale,
            sc.SIM_PRESET: self.preset,
            sc.SIM_CLOCK: _clock(),
            sc.ENGINE_PREFIX_CACHING: role not in self.no_prefix_caching,
            sc.KV_BIDIRECTIONAL: self.kv.bidirectional,
            sc.ENGINE_KV_POOL_BYTES: self.capacity_blocks * self.block_size * self._cost.bytes_per_token,
        }
        if self._factory is not None:
            provider = self._factory(SERVICE[role], attrs)
        else:
            import kvtrace

            provider = kvtrace.configure(
                SERVICE[role], traces_dir=self.traces_dir, resource_attributes=attrs, handle_sigterm=False
            )
        self._owned_providers.append(provider)
        return provider

    async def _start(self, role: str, index: int, base_port: int) -> SimWorker:
        engine_id = self._engine_id(role, index)
        cost = self._cost
        kv_metrics = KVMetrics() if self.metrics else None
        recorder = KVRecorder(
            self._tracer_provider(role, engine_id),
            engine_id=engine_id,
            role=role,
            block_size=self.block_size,
            bytes_per_block=cost.bytes_per_token * self.block_size,
            threshold=self.kv.threshold,
            ttl_s=self.kv.ttl_s,
            load_failure_policy=self.kv.kv_load_failure_policy,
            metrics=kv_metrics,
            fast_spans=FAST_SPANS,
        )
        engine = Engine(
            engine_id=engine_id,
            role=role,
            host=self.host,
            port=0,
            kv=self.kv,
            cache=KVCache(self.capacity_blocks, self.block_size),
            cost=cost,
            recorder=recorder,
            registry=self.registry,
            clock=self.clock,
            prefix_caching=role not in self.no_prefix_caching,
        )
        model = self.model or self.preset
        worker = SimWorker(
            engine,
            model=model,
            max_model_len=self.capacity_blocks * self.block_size,
            strict_model=self.model is not None,
            metrics=WorkerMetrics(model, kv_metrics) if kv_metrics is not None else None,
            tool_calls=self.tool_calls,
            stream_interval=self.stream_interval,
        )
        port = base_port + index if base_port else 0
        engine.port = await worker.start(self.host, port)
        return worker


def _clock() -> str:
    """The clock the workers run on (they start on the running loop): the virtual loop's or wall time."""
    return sc.CLOCK_VIRTUAL if isinstance(asyncio.get_running_loop(), VirtualLoop) else sc.CLOCK_WALL
