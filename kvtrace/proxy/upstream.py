"""Pooled HTTP clients for the P and D workers, with round-robin selection, and size-capped reads.

One ``aiohttp.ClientSession`` (keep-alive pool, no connection limit) per worker, created when the
proxy app starts and closed when it stops (:mod:`kvtrace.proxy.app` wires both).  :func:`read_body`
and :func:`pump` read a worker's response and stop at ``max_upstream_bytes``
(``response_too_large``), so a misbehaving worker cannot grow the proxy's memory without bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import aiohttp

from kvtrace import semconv as sc
from kvtrace.proxy.codec import loads
from kvtrace.proxy.config import ProxyConfig, Worker

# what a failed upstream call can raise before or while reading a response
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError, ConnectionError)


class TooLarge(Exception):
    """The worker's response exceeded ``max_upstream_bytes``."""


async def read_body(r: aiohttp.ClientResponse, cap: int) -> bytes:
    """The whole body of ``r``; TooLarge past ``cap`` bytes (checked before reading when announced)."""
    if r.content_length is not None and r.content_length > cap:
        raise TooLarge
    parts, n = [], 0
    while chunk := await r.content.readany():
        n += len(chunk)
        if n > cap:
            raise TooLarge
        parts.append(chunk)
    return b"".join(parts)


async def pump(
    r: aiohttp.ClientResponse, cap: int, on_first: Callable[[], None], sink: Callable[[bytes], Awaitable[None]]
) -> str | None:
    """Pass ``r``'s body to ``sink`` chunk by chunk (``on_first`` before the first).  Returns the
    upstream error's class name, ``response_too_large`` past ``cap`` bytes, or None at its end."""
    n = 0
    while True:
        try:
            chunk = await r.content.readany()
        except UPSTREAM_ERRORS as exc:
            return type(exc).__name__
        if not chunk:
            return None
        if not n:
            on_first()
        n += len(chunk)
        if n > cap:
            return sc.ERROR_RESPONSE_TOO_LARGE
        await sink(chunk)


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
        self._p: Iterator[Client] = iter(())  # start() makes the round robins
        self._d: Iterator[Client] = iter(())

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


def json_object(data: bytes) -> dict | None:
    try:
        obj = loads(data)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def never_reached(exc: BaseException) -> bool:
    """The worker never got the request (connect failed): its table entry is still unused."""
    return isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError))
