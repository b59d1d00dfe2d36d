"""A real prefill/decode set of vLLM servers on loopback, and two drivers: ``run_turn`` talks to
them the way the P/D proxy does (P leg: max_tokens=1, non-streaming, ``do_remote_decode`` + D's
cached params; D leg: streaming with P's params); ``run_agent_session`` drives a chat through the
real kvtrace proxy (in-process, ephemeral port) with the kvtrace agent API and the official
``openai`` client.  Used by tests/vllm/test_end_to_end.py (via support/vllm_scenario.py) and scripts/e2e_stall.py.

Every wait is bounded (readiness, each request's socket reads, each polled condition); when one
runs out, :class:`RigError` carries every running server's stacks (py-spy) and log tail.

Process layout (``layout``): ``uni`` (the rig's default) runs each engine as one EngineCore
process with its worker inside (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, uni executor): no
shared-memory RPC queue between EngineCore and worker.  ``mp`` is vLLM's default on CPU: a
worker process per engine behind the multiproc executor (see docs/troubleshooting.md).
``connector``: ``kvtrace`` (KVTraceNixlConnector and the kvtrace vLLM plugin) or ``plain``
(vLLM's NixlConnector, kvtrace's plugin not loaded: ``VLLM_PLUGINS`` lists every other one).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvtrace import semconv as sc
from kvtrace.testing.wait import free_port, wait_for

from support import vllm_diag as diag
from support.http_json import post

MODEL = "tiny"
AMX_SITE = Path(__file__).parent / "amx_site"
PROXY_SERVICE = "kvtrace-proxy"
AGENT_SERVICE = "kvtrace-agent"
LAYOUTS = ("uni", "mp")
CONNECTORS = ("kvtrace", "plain")
REQUEST_TIMEOUT_S = 90  # per socket read: a silent server for this long is stalled
READY_TIMEOUT_S = 240
_EXTERNAL = re.compile(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\}\s+(\S+)', re.M)


class RigError(AssertionError):
    """A bounded wait of the rig ran out; the message carries stacks and log tails."""


class LegFailed(Exception):
    """D answered without a finished completion (e.g. its KV load failed: NIXL handshake timeout)."""


def plugins_without_kvtrace() -> str:
    """``VLLM_PLUGINS`` value that loads every vLLM general plugin except kvtrace's."""
    from importlib.metadata import entry_points

    return ",".join(e.name for e in entry_points(group="vllm.general_plugins") if e.name != "kvtrace")


@dataclass
class Server:
    """One vLLM OpenAI server with a NIXL connector (kvtrace's or vLLM's plain one)."""

    name: str
    role: str  # prefill | decode (kvtrace role; vLLM runs kv_both)
    model_dir: Path
    traces_dir: Path
    log_dir: Path
    ttl_s: int = 480
    layout: str = "uni"
    connector: str = "kvtrace"
    verify: str | None = None  # kvtrace connector's ``verify`` (None: its default)
    dtype: str = "bfloat16"
    load_format: str = "dummy"  # "safetensors" for vllm_rig.make_sharp_model
    # plain connector only: load kvtrace's plugin for its NIXL progress-thread delay alone (stream
    # patch off), so vLLM's own connector runs without NIXL's idle threads spinning both cores
    plain_nixl_delay: bool = False
    port: int = field(default_factory=free_port)
    side_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def engine_id(self) -> str:
        return f"{self.name}-engine"

    @property
    def service_name(self) -> str:
        return f"vllm-{self.role}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def kv_transfer_config(self) -> dict:
        extra = {"bidirectional_kv_xfer": True, "kv_recompute_threshold": 64, "decoder_kv_blocks_ttl": self.ttl_s}
        ktc = {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_both",
            "kv_buffer_device": "cpu",
            "engine_id": self.engine_id,
            "kv_connector_extra_config": extra,
        }
        if self.connector == "kvtrace":  # kv_load_failure_policy: vLLM's default, fail
            extra[sc.KV_PARAMS_KEY] = {
                "traces_dir": str(self.traces_dir),
                "role": self.role,
                "service_name": self.service_name,
            }
            if self.verify is not None:
                extra[sc.KV_PARAMS_KEY]["verify"] = self.verify
            ktc.update(kv_connector="KVTraceNixlConnector", kv_connector_module_path="kvtrace.vllm.connector")
        return ktc

    def env(self) -> dict:
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",  # a 2-layer model gains nothing from a second OpenMP thread per engine
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CACHE_ROOT": str(self.log_dir / "cache"),
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_port),
            # amx_site/sitecustomize.py: the AMX tile state vLLM's CPU attention needs (SIGILL without)
            "PYTHONPATH": os.pathsep.join(p for p in (str(AMX_SITE), os.environ.get("PYTHONPATH")) if p),
        }
        if self.layout == "uni":
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if self.connector == "kvtrace":
            # process.pid on the spans' resource: the test checks which process made them
            env.update(
                KVTRACE_NIXL_PROGRESS_DELAY_US="500",
                KVTRACE_BATCH_DELAY_MS="200",
                OTEL_EXPERIMENTAL_RESOURCE_DETECTORS="process",
            )
        elif self.plain_nixl_delay:
            env.update(KVTRACE_NIXL_PROGRESS_DELAY_US="500", KVTRACE_VLLM_STREAM_PATCH="0")
        else:
            env["VLLM_PLUGINS"] = plugins_without_kvtrace()
        return env

    def start(self) -> None:
        if self.layout not in LAYOUTS or self.connector not in CONNECTORS:
            raise ValueError(
                f"layout {self.layout!r} not in {LAYOUTS} or connector {self.connector!r} not in {CONNECTORS}"
            )
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            MODEL,
            "--load-format",
            self.load_format,
            "--enforce-eager",
            "--dtype",
            self.dtype,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            "4096",
            "--block-size",
            "128",
            "--distributed-executor-backend",
            self.layout,
            "--kv-transfer-config",
            json.dumps(self.kv_transfer_config()),
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def ready(self) -> bool:
        """True once /health answers 200; RigError if the server exited."""
        if self.proc.poll() is not None:
            raise RigError(f"{self.name} exited with {self.proc.returncode}:\n{diag.tail(self.log_path, 60)}")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def terminate(self) -> None:
        """SIGTERM the server's process group (vLLM shuts its engine down)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout_s: float = 60) -> None:
        """Terminate and wait; SIGKILL the group after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def unpin(self) -> int:
        """Let every thread of this server run on every CPU this process may use; returns how many
        threads were narrower.  vLLM's NIXL worker on CPU pins the thread that builds it to the last
        core of each NUMA node (``NixlConnectorWorker.__init__``: ``os.sched_setaffinity(0,
        [max core])``), and the threads that thread starts later (OpenMP, kvtrace's, OTel's) inherit
        it: on a 2-core host every engine's forward pass would share core 1."""
        wide = os.sched_getaffinity(0)
        narrowed = 0
        for pid in diag.process_tree(self.proc.pid):
            for task in Path(f"/proc/{pid}/task").glob("*"):
                try:
                    if os.sched_getaffinity(int(task.name)) != wide:
                        os.sched_setaffinity(int(task.name), wide)
                        narrowed += 1
                except OSError:  # the thread ended
                    pass
        return narrowed

    def engine_pids(self) -> dict[str, list[int]]:
        """Pids of this server's vLLM processes by title (``VLLM::EngineCore``, ``VLLM::Worker``)."""
        out: dict[str, list[int]] = {}
        for pid in diag.process_tree(self.proc.pid)[1:]:
            name = diag.title(pid)
            if name.startswith("VLLM::"):
                out.setdefault(name, []).append(pid)
        return out

    def external_kv_tokens(self) -> float:
        """vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} (0 if absent)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=REQUEST_TIMEOUT_S) as r:
            text = r.read().decode()
        return sum(float(v) for v in _EXTERNAL.findall(text))


class Rig:
    """The servers of one run; bounded waits that fail with every server's stacks and logs."""

    def __init__(self, servers: list[Server], *, unpin: bool = True) -> None:
        self.servers = servers
        self.unpin = unpin  # see Server.unpin
        self.started = time.monotonic()

    def progress(self, what: str) -> None:
        """One line per step (scripts/e2e_stall.py reads a silent minute as a stall)."""
        print(f"[rig +{time.monotonic() - self.started:6.1f}s] {what}", flush=True)

    def fail(self, reason: str) -> RigError:
        return RigError(diag.report(reason, self.servers))

    def start(self, deadline_s: float = READY_TIMEOUT_S) -> None:
        """Start every server at once and wait until all answer /health."""
        for s in self.servers:
            s.start()
        self.wait_for(
            lambda: all([s.ready() for s in self.servers]),
            deadline_s=deadline_s,
            what="every vLLM server answering /health",
            interval=1.0,
        )
        self.progress("servers ready: " + ", ".join(f"{s.name}={s.engine_pids()}" for s in self.servers))
        if self.unpin:
            self.progress("threads unpinned from one core: " + ", ".join(f"{s.name}={s.unpin()}" for s in self.servers))

    def stop(self) -> None:
        """Stop every server, all at once."""
        for s in self.servers:
            s.terminate()
        for s in self.servers:
            s.stop()

    def wait_for(self, fn, *, deadline_s: float, what: str, interval: float = 0.5):
        """:func:`wait_for`, but RigError with stacks and logs when the deadline passes."""
        try:
            return wait_for(fn, deadline_s=deadline_s, what=what, interval=interval)
        except TimeoutError as exc:
            raise self.fail(str(exc)) from None

    def call(self, what: str, fn, *args, **kwargs):
        """Run one request; a socket timeout (a server silent for REQUEST_TIMEOUT_S) or a refused
        connection becomes RigError with stacks and logs."""
        try:
            return fn(*args, **kwargs)
        except (TimeoutError, ConnectionError) as exc:
            raise self.fail(f"{what}: {exc!r}") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc, urllib.error.HTTPError) or not isinstance(exc.reason, (TimeoutError, OSError)):
                raise
            raise self.fail(f"{what}: {exc!r}") from exc


# ---------------------------------------------------------------------------- driver
def _traceparent(trace_id: str) -> str:
    return f"00-{trace_id}-{secrets.token_hex(8)}-01"


def _post(url: str, body: dict, headers: dict) -> dict:
    return post(url, body, headers, timeout=REQUEST_TIMEOUT_S)


def _stream(url: str, body: dict, headers: dict) -> list[dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers})
    chunks = []
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


@dataclass
class Turn:
    request_id: str
    trace_id: str
    prompt: list | None
    p_params: dict | None
    d_params: dict | None
    output_ids: list[int]
    chunks: list[dict]
    p_error: str | None = None


def run_turn(
    rig: Rig,
    p: Server,
    d: Server,
    *,
    session: str,
    turn: int,
    prompt,
    cached: dict | None,
    max_tokens: int,
    chat: bool = False,
    attempts: int = 2,
    p_fails: bool = False,
    sampling: dict | None = None,
    verbatim_offer: bool = False,
) -> Turn:
    """One proxied turn; retried once on an HTTP error (a NIXL handshake timeout fails the load
    and, under kv_load_failure_policy=fail, the request); a silent server fails the rig at once.
    ``p_fails``: P is expected to fail the request (a declined expired read); the D leg is then
    skipped.  D's leg streams when D runs kvtrace (its plugin puts ``kv_transfer_params`` on the
    finish chunk), else it is one non-streaming response (plain vLLM 0.32 returns the params
    only there).  ``sampling``: extra body fields of both legs (e.g. ``temperature``).
    ``verbatim_offer``: P gets ``cached`` as D returned it, D's ``kvtrace`` entry (its digest)
    included and no kvtrace context, as an uninstrumented router (vLLM's example proxy) sends it."""
    for attempt in range(attempts):
        try:
            done = rig.call(
                f"{session} turn {turn} (attempt {attempt})",
                _turn,
                p,
                d,
                session=session,
                turn=turn,
                prompt=prompt,
                cached=cached,
                max_tokens=max_tokens,
                chat=chat,
                suffix=f"r{attempt}",
                p_fails=p_fails,
                sampling=sampling or {},
                verbatim_offer=verbatim_offer,
            )
            rig.progress(f"{session} turn {turn} done")
            return done
        except (urllib.error.HTTPError, LegFailed) as exc:
            rig.progress(f"{session} turn {turn} attempt {attempt} failed: {exc!r}")
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def _turn(p, d, *, session, turn, prompt, cached, max_tokens, chat, suffix, p_fails, sampling, verbatim_offer) -> Turn:
    rid = f"{session}-t{turn}-{suffix}"
    trace_id = secrets.token_hex(16)
    route = "/v1/chat/completions" if chat else "/v1/completions"
    payload = {"messages": prompt} if chat else {"prompt": prompt, "return_token_ids": True}
    ctx = {sc.CTX_SESSION_ID: session, sc.CTX_TURN: turn}
    p_tp = _traceparent(trace_id)
    p_kv = {
        **(cached or {}),
        "do_remote_decode": True,
        "do_remote_prefill": False,
        sc.KV_PARAMS_KEY: {**ctx, sc.CTX_TRACEPARENT: p_tp},
    }
    if verbatim_offer and cached:
        p_kv = {**cached, "do_remote_decode": True, "do_remote_prefill": False}
    p_body = {
        "model": MODEL,
        **payload,
        **sampling,
        "max_tokens": 1,
        "stream": False,
        "ignore_eos": True,
        "kv_transfer_params": p_kv,
    }
    try:
        p_resp = _post(p.url + route, p_body, {"X-Request-Id": rid, "traceparent": p_tp})
    except urllib.error.HTTPError as exc:
        if not p_fails:
            raise
        return Turn(rid, trace_id, prompt, None, None, [], [], p_error=f"HTTP {exc.code}")
    p_params = p_resp.get("kv_transfer_params")
    if p_fails:
        return Turn(rid, trace_id, prompt, p_params, None, [], [], p_error=str(p_resp.get("choices")))
    d_tp = _traceparent(trace_id)
    d_kv = {
        **{k: v for k, v in p_params.items() if k != sc.KV_PARAMS_KEY},
        sc.KV_PARAMS_KEY: {**ctx, sc.CTX_TRACEPARENT: d_tp},
    }
    stream = d.connector == "kvtrace"
    d_body = {
        "model": MODEL,
        **payload,
        **sampling,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "stream": stream,
        "ignore_eos": True,
        "kv_transfer_params": d_kv,
    }
    headers = {"X-Request-Id": rid, "traceparent": d_tp}
    chunks = _stream(d.url + route, d_body, headers) if stream else [_post(d.url + route, d_body, headers)]
    output_ids: list[int] = []
    for c in chunks:
        for choice in c.get("choices") or ():
            output_ids += choice.get("token_ids") or []
    finals = [c for c in chunks if any(ch.get("finish_reason") for ch in c.get("choices") or ())]
    if not finals or finals[-1]["choices"][0]["finish_reason"] != "length":
        raise LegFailed(f"D's leg of {rid} did not finish: last chunk {chunks[-1] if chunks else None!r}")
    d_params = finals[-1].get("kv_transfer_params")
    return Turn(rid, trace_id, prompt, p_params, d_params, output_ids, chunks)


# ---------------------------------------------------------------------------- agent -> kvtrace proxy
@dataclass
class AgentTurn:
    """One agent turn sent through the kvtrace proxy (its successful attempt)."""

    index: int  # the agent's turn index
    proxy_turn: int  # the proxy's turn index = proxy requests this session sent before it
    attempts: int
    chunks: list  # openai ChatCompletionChunk objects, in order
    kv_transfer: dict | None  # what the traced stream saw (stream.kv_transfer)
    last_kv_transfer: dict | None  # kvtrace.agent.last_kv_transfer() right after the stream
    result: object  # kvtrace.agent.LLMResult
    reply: str


async def run_agent_session(
    rig: Rig,
    p: Server,
    d: Server,
    traces: Path,
    *,
    session: str,
    user_turns: list[str],
    max_tokens: list[int],
    attempts: int = 2,
) -> list[AgentTurn]:
    """A streaming chat session: agent session -> one agent turn per user message -> traced
    ``openai`` call -> kvtrace proxy (started here on port 0, P = ``p``, D = ``d``) -> P and D.
    Agent and proxy export Parquet into ``traces``; both providers are flushed and shut down
    before returning.  A turn is retried once on a quick API error (a NIXL handshake timeout
    fails the request; the proxy keeps D's location when P fails); an error that took
    REQUEST_TIMEOUT_S (a silent server) fails the rig at once."""
    from kvtrace import telemetry
    from kvtrace.agent import Agent
    from kvtrace.proxy.config import ProxyConfig, Worker
    from kvtrace.proxy.server import start

    proxy_tp = telemetry.configure(PROXY_SERVICE, traces_dir=traces, handle_sigterm=False)
    agent_tp = telemetry.configure(AGENT_SERVICE, traces_dir=traces, handle_sigterm=False)
    config = ProxyConfig(
        prefill=[Worker("127.0.0.1", p.port)], decode=[Worker("127.0.0.1", d.port)], read_timeout_s=REQUEST_TIMEOUT_S
    )
    running = await start(config, proxy_tp, port=0)
    try:
        return await _agent_turns(
            rig, running.url, Agent(agent_tp, name="vllm-e2e-agent"), session, user_turns, max_tokens, attempts
        )
    finally:
        await running.close()
        for provider in (agent_tp, proxy_tp):
            provider.force_flush()
            provider.shutdown()


async def _agent_turns(rig, url, agent, session, user_turns, max_tokens, attempts) -> list[AgentTurn]:
    import openai

    from kvtrace.agent import TracedAsyncOpenAI

    client = TracedAsyncOpenAI(
        base_url=url + "/v1", api_key="kvtrace-e2e", max_retries=0, timeout=REQUEST_TIMEOUT_S + 10, agent=agent
    )
    messages: list[dict] = []
    turns: list[AgentTurn] = []
    sent = 0
    try:
        async with agent.session(session, scenario="vllm-e2e"):
            for index, (text, n) in enumerate(zip(user_turns, max_tokens, strict=True)):
                messages.append({"role": "user", "content": text})
                async with agent.turn():
                    for attempt in range(attempts):
                        sent += 1
                        began = time.monotonic()
                        try:
                            turn = await _agent_call(client, messages, n)
                            break
                        except openai.APIError as exc:
                            if time.monotonic() - began >= REQUEST_TIMEOUT_S:
                                raise rig.fail(f"agent turn {index} (attempt {attempt}): {exc!r}") from exc
                            if attempt + 1 == attempts:
                                raise
                rig.progress(f"agent turn {index} done")
                turn.index, turn.proxy_turn, turn.attempts = index, sent - 1, attempt + 1
                messages.append({"role": "assistant", "content": turn.reply})
                turns.append(turn)
    finally:
        await client.close()
    return turns


async def _agent_call(client, messages: list[dict], max_tokens: int) -> AgentTurn:
    from kvtrace.agent import last_kv_transfer

    stream = await client.chat.completions.create(
        model=MODEL,
        messages=list(messages),
        max_tokens=max_tokens,
        stream=True,
        extra_body={"min_tokens": max_tokens, "ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    reply = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return AgentTurn(-1, -1, 0, chunks, stream.kv_transfer, last_kv_transfer(), stream.result, reply)
