"""A real prefill/decode pair of vLLM servers on loopback, and two drivers: ``run_turn`` talks to
them the way the P/D proxy does (P leg: max_tokens=1, non-streaming, ``do_remote_decode`` + D's
cached params; D leg: streaming with P's params); ``run_agent_session`` drives a chat through the
real kvtrace proxy (in-process, ephemeral port) with the kvtrace agent API and the official
``openai`` client.  Used by test_vllm_e2e.py only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kvtrace import semconv as sc

MODEL = "tiny"
PROXY_SERVICE = "kvtrace-proxy"
AGENT_SERVICE = "kvtrace-agent"
_EXTERNAL = re.compile(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\}\s+(\S+)', re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """One vLLM OpenAI server with the kvtrace connector."""

    name: str
    role: str  # prefill | decode (kvtrace role; vLLM runs kv_both)
    model_dir: Path
    traces_dir: Path
    log_dir: Path
    ttl_s: int = 480
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

    def start(self) -> None:
        extra = {
            "bidirectional_kv_xfer": True,
            "kv_recompute_threshold": 64,
            "decoder_kv_blocks_ttl": self.ttl_s,
            sc.KV_PARAMS_KEY: {"traces_dir": str(self.traces_dir), "role": self.role,
                               "service_name": self.service_name},
        }
        ktc = {"kv_connector": "KVTraceNixlConnector", "kv_connector_module_path": "kvtrace.vllm.connector",
               "kv_role": "kv_both", "kv_buffer_device": "cpu", "engine_id": self.engine_id,
               "kv_connector_extra_config": extra}  # kv_load_failure_policy: vLLM's default, fail
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "VLLM_CACHE_ROOT": str(self.log_dir / "cache"),
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_port),
            "KVTRACE_NIXL_PROGRESS_DELAY_US": "500", "KVTRACE_BATCH_DELAY_MS": "200",
        }
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--served-model-name", MODEL, "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16",
               "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", "4096", "--block-size", "128",
               "--kv-transfer-config", json.dumps(ktc)]
        log = open(self.log_dir / f"{self.name}.log", "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, deadline_s: float = 240) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)  # polling interval of a deadline wait
        raise TimeoutError(f"{self.name} not ready after {deadline_s}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def log_tail(self, n: int = 60) -> str:
        path = self.log_dir / f"{self.name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""

    def external_kv_tokens(self) -> float:
        """vllm:prompt_tokens_by_source_total{source="external_kv_transfer"} (0 if absent)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        return sum(float(v) for v in _EXTERNAL.findall(text))


# ---------------------------------------------------------------------------- driver
def _traceparent(trace_id: str) -> str:
    return f"00-{trace_id}-{secrets.token_hex(8)}-01"


def _post(url: str, body: dict, headers: dict, timeout: float = 180) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _stream(url: str, body: dict, headers: dict, timeout: float = 180) -> list[dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers})
    chunks = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
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


def run_turn(p: Server, d: Server, *, session: str, turn: int, prompt, cached: dict | None, max_tokens: int,
             chat: bool = False, attempts: int = 2, p_fails: bool = False) -> Turn:
    """One proxied turn; retried once on an upstream error (a NIXL handshake timeout fails the
    load and, under kv_load_failure_policy=fail, the request).  ``p_fails``: P is expected to
    fail the request (a declined expired read); the D leg is then skipped."""
    for attempt in range(attempts):
        try:
            return _turn(p, d, session=session, turn=turn, prompt=prompt, cached=cached, max_tokens=max_tokens,
                         chat=chat, suffix=f"r{attempt}", p_fails=p_fails)
        except (urllib.error.URLError, TimeoutError, ConnectionError):
            if attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def _turn(p, d, *, session, turn, prompt, cached, max_tokens, chat, suffix, p_fails) -> Turn:
    rid = f"{session}-t{turn}-{suffix}"
    trace_id = secrets.token_hex(16)
    route = "/v1/chat/completions" if chat else "/v1/completions"
    payload = {"messages": prompt} if chat else {"prompt": prompt, "return_token_ids": True}
    ctx = {sc.CTX_SESSION_ID: session, sc.CTX_TURN: turn}
    p_tp = _traceparent(trace_id)
    p_kv = {**(cached or {}), "do_remote_decode": True, "do_remote_prefill": False,
            sc.KV_PARAMS_KEY: {**ctx, sc.CTX_TRACEPARENT: p_tp}}
    p_body = {"model": MODEL, **payload, "max_tokens": 1, "stream": False, "ignore_eos": True,
              "kv_transfer_params": p_kv}
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
    d_kv = {**{k: v for k, v in p_params.items() if k != sc.KV_PARAMS_KEY},
            sc.KV_PARAMS_KEY: {**ctx, sc.CTX_TRACEPARENT: d_tp}}
    d_body = {"model": MODEL, **payload, "max_tokens": max_tokens, "min_tokens": max_tokens, "stream": True,
              "ignore_eos": True, "kv_transfer_params": d_kv}
    chunks = _stream(d.url + route, d_body, {"X-Request-Id": rid, "traceparent": d_tp})
    output_ids: list[int] = []
    for c in chunks:
        for choice in c.get("choices") or ():
            output_ids += choice.get("token_ids") or []
    finals = [c for c in chunks if any(ch.get("finish_reason") for ch in c.get("choices") or ())]
    d_params = finals[-1].get("kv_transfer_params") if finals else None
    return Turn(rid, trace_id, prompt, p_params, d_params, output_ids, chunks)


def wait_for(fn, *, deadline_s: float, what: str, interval: float = 0.5):
    """Poll ``fn`` until it returns a truthy value (deadline wait, not a sleep-as-sync)."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {deadline_s}s waiting for {what} (last: {last!r})")


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


async def run_agent_session(p: Server, d: Server, traces: Path, *, session: str, user_turns: list[str],
                            max_tokens: list[int], attempts: int = 2) -> list[AgentTurn]:
    """A streaming chat session: agent session -> one agent turn per user message -> traced
    ``openai`` call -> kvtrace proxy (started here on port 0, P = ``p``, D = ``d``) -> P and D.
    Agent and proxy export Parquet into ``traces``; both providers are flushed and shut down
    before returning.  A turn is retried once on an API error (a NIXL handshake timeout fails the
    request; the proxy keeps D's location when P fails)."""
    from kvtrace import telemetry
    from kvtrace.agent import Agent
    from kvtrace.proxy.config import ProxyConfig, Worker
    from kvtrace.proxy.server import start

    proxy_tp = telemetry.configure(PROXY_SERVICE, traces_dir=traces, handle_sigterm=False)
    agent_tp = telemetry.configure(AGENT_SERVICE, traces_dir=traces, handle_sigterm=False)
    config = ProxyConfig(prefill=[Worker("127.0.0.1", p.port)], decode=[Worker("127.0.0.1", d.port)],
                         read_timeout_s=180)
    running = await start(config, proxy_tp, port=0)
    try:
        return await _agent_turns(running.url, Agent(agent_tp, name="vllm-e2e-agent"), session, user_turns,
                                  max_tokens, attempts)
    finally:
        await running.close()
        for provider in (agent_tp, proxy_tp):
            provider.force_flush()
            provider.shutdown()


async def _agent_turns(url, agent, session, user_turns, max_tokens, attempts) -> list[AgentTurn]:
    import openai

    from kvtrace.agent import TracedAsyncOpenAI

    client = TracedAsyncOpenAI(base_url=url + "/v1", api_key="kvtrace-e2e", max_retries=0, timeout=180, agent=agent)
    messages: list[dict] = []
    turns: list[AgentTurn] = []
    sent = 0
    try:
        async with agent.session(session, scenario="vllm-e2e"):
            for index, (text, n) in enumerate(zip(user_turns, max_tokens)):
                messages.append({"role": "user", "content": text})
                async with agent.turn():
                    for attempt in range(attempts):
                        sent += 1
                        try:
                            turn = await _agent_call(client, messages, n)
                            break
                        except openai.APIError:
                            if attempt + 1 == attempts:
                                raise
                turn.index, turn.proxy_turn, turn.attempts = index, sent - 1, attempt + 1
                messages.append({"role": "assistant", "content": turn.reply})
                turns.append(turn)
    finally:
        await client.close()
    return turns


async def _agent_call(client, messages: list[dict], max_tokens: int) -> AgentTurn:
    from kvtrace.agent import last_kv_transfer

    stream = await client.chat.completions.create(
        model=MODEL, messages=list(messages), max_tokens=max_tokens, stream=True,
        extra_body={"min_tokens": max_tokens, "ignore_eos": True})
    chunks = [chunk async for chunk in stream]
    reply = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return AgentTurn(-1, -1, 0, chunks, stream.kv_transfer, last_kv_transfer(), stream.result, reply)
