"""``kvtrace bench`` programmatic API: multi-turn agent workloads against OpenAI-compatible
endpoints, one traced session per conversation, with an A/B mode.

    result = run_bench("http://127.0.0.1:8000", scenario="coding-agent", sessions=8, traces_dir="t")
    print(result.format()); json.dump(result.to_dict(), f)
    ab = run_ab("http://127.0.0.1:8000", "http://127.0.0.1:8001", scenario="coding-agent", repeat=3)

``arun_bench`` / ``arun_ab`` are the coroutine versions (tests run them beside an in-process
simulator and proxy).  The workload comes from a built-in scenario name, a
:class:`~kvtrace.bench.scenarios.Scenario`, a :class:`~kvtrace.bench.workload.Workload`, or an
input file (:mod:`kvtrace.bench.vllm_inputs`); one ``seed`` draws the same workload for every
endpoint and repeat (a per-run nonce word keeps repeats from hitting earlier runs' prefix cache).

Concurrency: ``max_active_conversations`` sessions run at once (default ``clients``); at most
``clients`` LLM requests are in flight (default 4); ``request_rate`` (requests/s, Poisson) paces
request starts.  A timed workload (a production trace replayed with its arrival times,
:mod:`kvtrace.bench.mooncake`) runs every session at once and bounds nothing by default: its
pauses are the arrivals.
``time_scale`` multiplies tool waits, app work and pauses (not model time).
"""

from __future__ import annotations

import asyncio
import copy
import math
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import kvtrace
from kvtrace.agent.api import Agent
from kvtrace.analysis import compare
from kvtrace.bench import scenarios as scn
from kvtrace.bench import stats
from kvtrace.bench.runner import Collector, Pacer, RequestRecord, RunOptions, SessionRunner, Sleep
from kvtrace.bench.workload import Workload, from_scenario

DEFAULT_CLIENTS = 4


class BenchError(ValueError):
    """Unusable bench arguments (one line; the CLI turns it into CLIError)."""


@dataclass
class BenchConfig:
    scenario: str | scn.Scenario | None = None
    input: str | None = None
    workload: Workload | None = None
    published: str | None = None  # a built-in workload (kvtrace.bench.published)
    prefix: int | None = None  # the first turn's prefix (published workloads, generate configs)
    model: str | None = None
    sessions: int | None = None
    clients: int | None = None  # None: 4, or unbounded for a timed workload
    max_active_conversations: int | None = None
    request_rate: float = math.inf
    seed: int = 0
    warmup: int = 0
    time_scale: float = 1.0
    repeat: int = 1
    ignore_eos: bool = True
    max_tokens: int | None = None
    request_timeout_s: float = 600.0
    api_key: str | None = None
    nonce: str | None = None

    def validate(self) -> None:
        if sum(x is not None for x in (self.scenario, self.input, self.workload, self.published)) != 1:
            raise BenchError("give exactly one of a scenario, an input file or a workload")
        if self.published is not None:
            from kvtrace.bench import published

            try:
                published.get(self.published)
            except ValueError as exc:
                raise BenchError(str(exc)) from None
        if self.prefix is not None and (self.prefix < 0 or self.scenario is not None or self.workload is not None):
            raise BenchError("prefix (>= 0) goes with a built-in workload or a generate_conversations input")
        for name in ("clients", "repeat"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise BenchError(f"{name} must be >= 1")
        if self.sessions is not None and self.sessions < 1:
            raise BenchError("sessions must be >= 1")
        if self.max_active_conversations is not None and self.max_active_conversations < 1:
            raise BenchError("max_active_conversations must be >= 1")
        if self.warmup < 0 or self.time_scale < 0 or not self.request_rate > 0:
            raise BenchError("warmup and time_scale must be >= 0, request_rate > 0")

    def build(self, seed: int, nonce: str, sessions: int | None = None) -> Workload:
        if self.workload is not None:
            return self.workload
        if self.published is not None:
            return self._published(seed, nonce, sessions)
        if self.input is not None:
            from kvtrace.bench import vllm_inputs

            try:
                return vllm_inputs.load(
                    self.input,
                    seed=seed,
                    nonce=nonce,
                    sessions=sessions or self.sessions,
                    max_tokens=self.max_tokens,
                    prefix=self.prefix,
                )
            except vllm_inputs.InputError as exc:
                raise BenchError(str(exc)) from None
        scenario = self.scenario if isinstance(self.scenario, scn.Scenario) else _scenario(self.scenario)
        return from_scenario(scenario, sessions or self.sessions, seed, nonce)

    def _published(self, seed: int, nonce: str, sessions: int | None) -> Workload:
        from kvtrace.bench import published, vllm_inputs

        spec = published.get(self.published)
        prefix = self.prefix if self.prefix is not None else spec.prefix
        conf = spec.config if prefix is None else published.with_prefix(spec.config, prefix)
        wl = vllm_inputs.generate(conf, seed=seed, nonce=nonce, max_tokens=self.max_tokens)
        wl.name = spec.name if prefix is None else f"{spec.name} prefix={prefix}"
        n = sessions or self.sessions
        wl.sessions = wl.sessions[:n] if n else wl.sessions
        return wl

    def as_dict(self) -> dict:
        # fields one by one: asdict would deep-copy a Workload (every session, every turn's text)
        skip = ("workload", "api_key", "scenario")
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in skip}
        out["scenario"] = self.scenario.name if isinstance(self.scenario, scn.Scenario) else self.scenario
        out["request_rate"] = None if math.isinf(self.request_rate) else self.request_rate
        return out


def _scenario(name: str) -> scn.Scenario:
    try:
        return scn.get(name)
    except ValueError as exc:
        raise BenchError(str(exc)) from None


@dataclass
class BenchResult:
    url: str
    label: str
    workload: str
    model: str
    config: dict
    duration_s: float = 0.0
    requests: list = field(default_factory=list)
    turns: list = field(default_factory=list)
    sessions: list = field(default_factory=list)

    def summary(self) -> dict:
        return stats.summarize(self.requests, self.turns, self.sessions)

    def to_dict(self) -> dict:
        return {
            "url": self.url,
            "label": self.label,
            "workload": self.workload,
            "model": self.model,
            "config": self.config,
            "duration_s": self.duration_s,
            "summary": self.summary(),
            "requests": [asdict(r) for r in self.requests],
            "turns": [asdict(t) for t in self.turns],
            "sessions": [asdict(s) for s in self.sessions],
        }

    def format(self) -> str:
        title = f"kvtrace bench [{self.label}] {self.workload} -> {self.url} ({self.model}), {self.duration_s:.1f} s"
        return stats.format_summary(self.summary(), title)


@dataclass
class ABResult:
    a: BenchResult
    b: BenchResult
    comparison: list[dict]

    def to_dict(self) -> dict:
        return {"a": self.a.to_dict(), "b": self.b.to_dict(), "comparison": self.comparison}

    def format(self) -> str:
        return "\n\n".join(
            [
                self.a.format(),
                self.b.format(),
                f"A/B: B={self.b.url} over A={self.a.url}\n" + stats.format_comparison(self.comparison),
            ]
        )


class Progress:
    """One self-rewriting stderr line (tqdm is not required), on a terminal only: written to a file or
    a pipe its carriage returns would leave every update on one long line of the log."""

    def __init__(self, enabled: bool, total: int, label: str, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.enabled, self.total, self.label = enabled and self.stream.isatty(), total, label
        self.done = self.errors = 0
        self.t0 = self.last = time.perf_counter()

    def __call__(self, rec: RequestRecord) -> None:
        self.done += 1
        self.errors += rec.error is not None and not rec.interrupted
        now = time.perf_counter()
        if self.enabled and (now - self.last > 0.1 or self.done >= self.total):
            self.last = now
            self.stream.write(
                f"\r[{self.label}] requests {self.done}/{self.total} errors {self.errors} {now - self.t0:.1f}s "
            )
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def api_base(url: str) -> str:
    """``http://host:port`` or ``.../v1`` -> the client's base URL (ending in /v1)."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise BenchError(f"--url must start with http:// or https://, not {url!r}")
    return url if url.endswith("/v1") else url + "/v1"


class _Side:
    """One endpoint: its traced client and the records of every repeat."""

    def __init__(
        self, url: str, label: str, cfg: BenchConfig, agent: Agent, progress: bool, sleep: Sleep, direct: bool = False
    ) -> None:
        from kvtrace.agent.openai_wrap import TracedAsyncOpenAI

        self.url, self.label, self.cfg, self.agent, self.sleep = url, label, cfg, agent, sleep
        self.client = TracedAsyncOpenAI(
            base_url=api_base(url),
            api_key=cfg.api_key or "EMPTY",
            max_retries=0,
            timeout=cfg.request_timeout_s,
            agent=agent,
        )
        if direct:  # the SDK's request and span without its machinery (kvtrace.agent.direct)
            from kvtrace.agent.direct import DirectChat

            self.client = DirectChat(self.client, agent)
        self.progress = progress
        self.result: BenchResult | None = None

    async def model(self) -> str:
        if self.cfg.model:
            return self.cfg.model
        try:
            models = await self.client.models.list()
        except Exception as exc:
            raise BenchError(f"cannot list models at {self.url} ({type(exc).__name__}); pass --model") from None
        if not models.data:
            raise BenchError(f"{self.url} serves no model; pass --model")
        return models.data[0].id

    async def run(self, rep: int, nonce: str, tag: str) -> None:
        cfg = self.cfg
        if self.result is None:
            workload = cfg.build(cfg.seed, nonce)
            self.result = BenchResult(
                self.url, self.label, workload.name, await self.model(), {**cfg.as_dict(), "url": self.url}
            )
            if cfg.warmup:
                warm = cfg.build(cfg.seed + 1, nonce + "w", sessions=cfg.warmup)
                warm.sessions = warm.sessions[: cfg.warmup]
                await self._execute(
                    warm, Collector(time.perf_counter()), f"{tag}-{self.label}w", f"{self.label} warm-up"
                )
        workload = cfg.build(cfg.seed, nonce)
        out = Collector(time.perf_counter(), repeat=rep)
        t0 = time.perf_counter()
        await self._execute(workload, out, f"{tag}-{self.label}{rep}", f"{self.label} {rep + 1}/{cfg.repeat}")
        self.result.duration_s += time.perf_counter() - t0
        self.result.requests += out.requests
        self.result.turns += out.turns
        self.result.sessions += out.sessions

    async def _execute(self, workload: Workload, out: Collector, prefix: str, label: str) -> None:
        cfg = self.cfg
        clients = cfg.clients or (max(1, len(workload.sessions)) if workload.timed else DEFAULT_CLIENTS)
        opts = RunOptions(
            model=self.result.model,
            time_scale=cfg.time_scale,
            ignore_eos=cfg.ignore_eos,
            request_timeout_s=cfg.request_timeout_s,
            scenario=workload.name,
            thinking=workload.thinking,
            keep_reasoning=workload.keep_reasoning,
        )
        bar = Progress(self.progress, workload.n_llm_calls, label)
        out.on_request = bar
        runner = SessionRunner(
            self.client,
            self.agent,
            opts,
            out,
            slots=asyncio.Semaphore(clients),
            pacer=Pacer(cfg.request_rate, cfg.seed, self.sleep),
            sleep=self.sleep,
        )
        plans = iter(workload.sessions)

        async def worker() -> None:
            for plan in plans:  # shared iterator: each worker takes the next session
                await runner.run(plan, f"{prefix}-{plan.name}")

        # a timed workload's first pause is its session's start: every session must begin at once
        default_active = len(workload.sessions) if workload.timed else clients
        active = min(cfg.max_active_conversations or default_active, len(workload.sessions))
        try:
            await asyncio.gather(*(worker() for _ in range(active)))
        finally:
            bar.close()

    async def close(self) -> None:
        await self.client.close()


def _provider(tracer_provider, traces_dir):
    if tracer_provider is not None:
        return tracer_provider, False
    return kvtrace.configure("kvtrace-bench", traces_dir=traces_dir, handle_sigterm=False), True


async def _drive(
    urls: list[tuple[str, str]], cfg: BenchConfig, tracer_provider, traces_dir, progress, sleep, direct: bool = False
) -> list[BenchResult]:
    cfg.validate()
    provider, owned = _provider(tracer_provider, traces_dir)
    agent = Agent(provider, name="kvtrace-bench")
    sides = [_Side(url, label, cfg, agent, progress, sleep, direct) for url, label in urls]
    tag = cfg.nonce if cfg.nonce is not None else uuid.uuid4().hex[:6]
    try:
        for rep in range(cfg.repeat):  # A, B, A, B, ...: drift hits both sides alike
            for side in sides:
                await side.run(rep, f"{tag}r{rep}", tag)
        return [side.result for side in sides]
    finally:
        for side in sides:
            await side.close()
        if owned:
            provider.shutdown()  # flush every span before returning
        else:
            provider.force_flush()


async def arun_bench(
    url: str,
    *,
    tracer_provider=None,
    traces_dir: str | None = None,
    progress: bool = False,
    sleep: Sleep = asyncio.sleep,
    label: str = "A",
    direct_client: bool = False,
    **config: Any,
) -> BenchResult:
    """Run the workload against ``url``; ``config`` = :class:`BenchConfig` fields.  ``direct_client``:
    chat calls through :class:`kvtrace.agent.direct.DirectChat` (the SDK's requests and spans, less
    its CPU) instead of the ``openai`` SDK."""
    cfg = _config(config)
    (result,) = await _drive([(url, label)], cfg, tracer_provider, traces_dir, progress, sleep, direct_client)
    return result


async def arun_ab(
    url_a: str,
    url_b: str,
    *,
    tracer_provider=None,
    traces_dir: str | None = None,
    progress: bool = False,
    sleep: Sleep = asyncio.sleep,
    **config: Any,
) -> ABResult:
    """The same seeded workload against ``url_a`` (A) and ``url_b`` (B), repeats interleaved."""
    cfg = _config(config)
    a, b = await _drive([(url_a, "A"), (url_b, "B")], cfg, tracer_provider, traces_dir, progress, sleep)
    return ABResult(a, b, compare.compare(stats.values(a), stats.values(b), seed=cfg.seed))


def _config(config: dict) -> BenchConfig:
    try:
        return BenchConfig(**config)
    except TypeError as exc:
        raise BenchError(str(exc)) from None


def run_bench(url: str, **kwargs: Any) -> BenchResult:
    """Synchronous :func:`arun_bench`."""
    return asyncio.run(arun_bench(url, **kwargs))


def run_ab(url_a: str, url_b: str, **kwargs: Any) -> ABResult:
    """Synchronous :func:`arun_ab`."""
    return asyncio.run(arun_ab(url_a, url_b, **kwargs))
