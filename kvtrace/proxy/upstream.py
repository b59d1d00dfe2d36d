"""Pooled HTTP clients for the P and D workers, with round-robin selection.

One ``aiohttp.ClientSession`` (keep-alive pool, no connection limit) per worker, created when the
proxy app starts and closed when it stops (:mod:`kvtrace.proxy.app` wires both).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import aiohttp

from kvtrace.proxy.config import ProxyConfig, Worker

# what a failed upstream call can raise before or while reading a response
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)


@dataclass
class Client:
    worker: Worker
    session: aiohttp.ClientSession

    @property
    def host(self) -> str:
        return self.worker.host

    @property
    def port(self) -> int:
        return self.worker.port

    @property
    def base(self) -> str:
        return self.worker.base


class Pool:
    """Clients of all P and D workers; ``next_prefill`` / ``next_decode`` round-robin."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.prefill: list[Client] = []
        self.decode: list[Client] = []
        self._p = self._d = None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.config.connect_timeout_s, sock_read=self.config.read_timeout_s
        )

        def make(w: Worker) -> Client:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
            return Client(w, aiohttp.ClientSession(base_url=w.base, connector=connector, timeout=timeout))

        self.prefill = [make(w) for w in self.config.prefill]
        self.decode = [make(w) for w in self.config.decode]
        self._p = itertools.cycle(self.prefill)
        self._d = itertools.cycle(self.decode)

    async def close(self) -> None:
        for c in self.prefill + self.decode:
            await c.session.close()

    def next_prefill(self) -> Client:
        return next(self._p)

    def next_decode(self) -> Client:
        return next(self._d)
