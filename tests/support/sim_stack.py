"""The kvtrace proxy over the zero-cost simulator, in process, with one controllable clock: what
the ``make_stack`` fixture (tests/proxy/conftest.py) builds and the proxy acceptance tests drive."""

from __future__ import annotations

import json

from kvtrace import semconv as sc
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.testing.proxy import closed_port
from kvtrace.testing.wait import wait_for_async

CHAT = "/v1/chat/completions"
MAX_TOKENS = 80  # > kv_recompute_threshold, so the next turn has >= 64 tokens to pull from D


class Clock:
    """One controllable clock for the simulator and the proxy's conversation table."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def worker(url: str) -> Worker:
    host, port = url.rsplit("//", 1)[1].split(":")
    return Worker(host, int(port))


class Stack:
    """A proxy over a zero-cost simulated cluster, an HTTP client, one clock, the span exporter."""

    def __init__(self, cluster, proxy, http, clock, exporter):
        self.cluster, self.proxy, self.http, self.clock, self.exporter = cluster, proxy, http, clock, exporter

    async def chat(self, messages, conv="c1", stream=True, headers=None, **extra):
        body = {"model": "m", "messages": messages, "max_tokens": MAX_TOKENS, "stream": stream, **extra}
        if conv is not None:
            body[sc.BODY_CONVERSATION_ID] = conv
        async with self.http.post(self.proxy.url + CHAT, json=body, headers=headers or {}) as r:
            assert r.status == 200, await r.text()
            data = await r.read()
            trace_header = r.headers.get(sc.HEADER_TRACE_ID)
        if not stream:
            obj = json.loads(data)
            return obj["choices"][0]["message"]["content"], obj, trace_header
        events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        return text, chunks, trace_header

    def spans(self, name=None):
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    async def wait_spans(self, name, n):
        """The spans named ``name`` once there are ``n`` (they end just after the response)."""
        await wait_for_async(lambda: len(self.spans(name)) >= n, 5, f"{n} {name} spans")
        return self.spans(name)


def dead_first_prefiller(cluster, routing: str) -> tuple[ProxyConfig, int]:
    """A proxy's config over ``cluster`` with a dead prefiller (a closed port) before its live one, a
    60 s --worker-cooldown; and the dead one's port."""
    dead = closed_port()
    config = ProxyConfig(
        prefill=[Worker("127.0.0.1", dead), worker(cluster.prefill_urls[0])],
        decode=[worker(u) for u in cluster.decode_urls],
        routing=routing,
        worker_cooldown_s=60.0,
    )
    return config, dead


async def two_turn_sessions(http, url: str, sessions) -> list[int]:
    """Each of ``sessions`` (conversation ids) in turn: a first turn, then the next one on its answer,
    through the proxy at ``url``, non-streaming; the statuses, in order."""
    statuses = []
    for conv in sessions:
        messages = [{"role": "user", "content": f"conversation {conv}, say something " * 10}]
        for _ in range(2):
            body = {"model": "m", "messages": messages, "max_tokens": 70, sc.BODY_CONVERSATION_ID: conv}
            async with http.post(url + CHAT, json=body) as r:
                statuses.append(r.status)
                answer = (await r.json())["choices"][0]["message"]["content"]
            messages = [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "go on"}]
    return statuses


def d2p_decision(rid: str, d: dict, prompt: int, pulled: int, outcome: str, verification: dict) -> dict:
    """The simulated P's whole d2p decision span for request ``rid`` offered D's params ``d``
    (no local hit, the default threshold and TTL)."""
    return {
        sc.GEN_AI_REQUEST_ID: rid,
        sc.ENGINE_ID: "sim-prefill-0",
        sc.ENGINE_ROLE: sc.ROLE_PREFILL,
        sc.KV_DIRECTION: sc.DIRECTION_D2P,
        sc.KV_PROMPT_TOKENS: prompt,
        sc.KV_LOCAL_HIT_TOKENS: 0,
        sc.KV_REMOTE_TOKENS: d["remote_num_tokens"],
        sc.KV_PULLED_TOKENS: pulled,
        sc.KV_RECOMPUTED_TOKENS: prompt - pulled,
        sc.KV_THRESHOLD: 64,
        sc.KV_LOAD_FAILURE_POLICY: "fail",
        sc.KV_EXPIRY_DEADLINE: d["remote_blocks_expiry_time"],
        sc.KV_EXPIRY_REMAINING_S: 480.0,
        sc.KV_PEER_ENGINE_ID: "sim-decode-0",
        sc.KV_REMOTE_REQUEST_ID: d["remote_request_id"],
        sc.KV_OUTCOME: outcome,
        **verification,
    }
