"""Pooled HTTP clients for the P and D workers, routed by :mod:`kvtrace.routing`, and size-capped reads.

One ``aiohttp.ClientSession`` (keep-alive pool) per worker, created when the proxy app starts and
closed when it stops (:mod:`kvtrace.proxy.app` wires both).  :func:`read_body` and :func:`pump` read
a worker's response and stop at ``max_upstream_bytes`` (``response_too_large``), so a misbehaving
worker cannot grow the proxy's memory without bound.

Bursts queue: each worker has a :class:`Gate` of ``max_worker_connections`` slots, one per request
in flight (= one connection), held until aiohttp gives the connection back (the body read, or the
response released or closed).  Requests beyond them wait in FIFO order, at most ``max_worker_queue``
of them; one more gets :class:`PoolFull` (the proxy answers 503 with ``Retry-After``).  Without the
bound, one connection per in-flight request meant thousands of simultaneous connects that overflowed
a worker's accept backlog and failed as ``ConnectionTimeoutError`` (502).  The queue wait is outside
aiohttp's timers: ``ClientTimeout.sock_connect`` (``connect_timeout_s``) bounds each connection
attempt from its start, while aiohttp's ``connect`` (unset) would also count aiohttp's own pool wait.

A worker that cannot be reached (the connection failed: :func:`never_reached`) is out of the routing
for ``worker_cooldown_s`` (:class:`Health`; doubled at each failure in a row, up to
:data:`MAX_COOLDOWN_FACTOR` times), so a dead worker, which fails fast and so always looks least
loaded, does not draw the fleet's turns; after the cooldown the next turn routed to it probes it, and
the first answer puts it back.  While every worker of a role is out, they are all tried.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import aiohttp

from kvtrace import semconv as sc
from kvtrace.jsoncodec import loads
from kvtrace.proxy.config import ProxyConfig, Worker
from kvtrace.routing import Router

log = logging.getLogger(__name__)
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


WAIT_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_EWMA = 0.2  # weight of the newest wait in Gate.recent_wait_s


MAX_COOLDOWN_FACTOR = 16  # a worker down for long is probed every 16 cooldowns (80 s by default)


class Health:
    """Whether one worker is in the routing: out for a cooldown after it could not be reached.
    Times are the event loop's (the virtual clock's in a simulated fleet)."""

    def __init__(self, cooldown_s: float) -> None:
        self.cooldown_s = cooldown_s
        self.failures = 0  # connection failures in a row
        self.ejections = 0  # for /metrics
        self.down_until = 0.0

    def up(self, now: float) -> bool:
        return now >= self.down_until

    def failed(self, now: float) -> None:
        self.failures += 1
        if self.cooldown_s > 0:
            self.ejections += 1
            self.down_until = now + self.cooldown_s * min(2 ** (self.failures - 1), MAX_COOLDOWN_FACTOR)

    def reached(self) -> None:
        self.failures, self.down_until = 0, 0.0


class PoolFull(Exception):
    """A worker's queue for a connection is full; ``retry_after_s`` is the Retry-After to send."""

    def __init__(self, base: str, queued: int, retry_after_s: int) -> None:
        super().__init__(f"worker {base} is busy: {queued} requests already wait for a connection")
        self.retry_after_s = retry_after_s


class Gate:
    """At most ``limit`` requests in flight to one worker; up to ``max_queue`` more wait, first come
    first served.  A released slot passes straight to the oldest waiter, so no newcomer overtakes it.
    Also counts, for ``/metrics``: waits (histogram over :data:`WAIT_BUCKETS`), refusals."""

    def __init__(self, limit: int, max_queue: int, clock: Callable[[], float] | None = None) -> None:
        self.limit, self.max_queue = limit, max_queue
        self.clock = clock
        self.in_use = 0
        self.queued = 0  # live waiters (the deque may also hold cancelled ones, skipped on release)
        self._waiters: deque[asyncio.Future] = deque()
        self.recent_wait_s = 0.0  # moving average of the waits of requests that queued
        self.rejected = 0
        self.wait_counts = [0] * len(WAIT_BUCKETS)  # per bucket (not cumulative); past the last: wait_over
        self.wait_over = 0
        self.wait_sum = 0.0

    def _now(self) -> float:
        return self.clock() if self.clock is not None else asyncio.get_running_loop().time()

    def _observe(self, waited: float) -> None:
        i = bisect.bisect_left(WAIT_BUCKETS, waited)
        if i < len(WAIT_BUCKETS):
            self.wait_counts[i] += 1
        else:
            self.wait_over += 1
        self.wait_sum += waited

    async def acquire(self, base: str = "") -> float | None:
        """Take a slot: None when one was free, else the seconds waited; PoolFull when the queue is full."""
        if self.in_use < self.limit and not self.queued:
            self.in_use += 1
            self._observe(0.0)
            return None
        if self.queued >= self.max_queue:
            self.rejected += 1
            raise PoolFull(base, self.queued, max(1, math.ceil(self.recent_wait_s)))
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        self.queued += 1
        t0 = self._now()
        try:
            await fut
        except asyncio.CancelledError:  # the client left or the deadline passed while waiting
            if fut.cancelled():
                self.queued -= 1
                if len(self._waiters) > 2 * self.queued + 64:  # drop cancelled entries now and then
                    self._waiters = deque(f for f in self._waiters if not f.done())
            else:  # the slot was handed over just as we were cancelled: pass it on
                self.release()
            raise
        waited = self._now() - t0
        self.recent_wait_s += _EWMA * (waited - self.recent_wait_s)
        self._observe(waited)
        return waited

    def release(self) -> None:
        """Give a slot back: to the oldest live waiter, else free."""
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                self.queued -= 1
                fut.set_result(None)  # in_use unchanged: the slot is now the waiter's
                return
        self.in_use -= 1


@dataclass(eq=False)  # a worker's client is itself: compared by identity
class Client:
    worker: Worker
    session: aiohttp.ClientSession
    gate: Gate
    role: str
    health: Health

    @property
    def host(self) -> str:
        return self.worker.host

    @property
    def port(self) -> int:
        return self.worker.port

    @property
    def base(self) -> str:
        return self.worker.base

    async def post(self, path: str, span, data: bytes, headers: dict) -> aiohttp.ClientResponse:
        """POST through the worker's gate (PoolFull past its queue; a wait is recorded on ``span`` as
        ``sc.PROXY_POOL_WAIT_MS``); the slot is held until the response's connection is given back."""
        waited = await self.gate.acquire(self.base)
        if waited is not None:
            span.set_attribute(sc.PROXY_POOL_WAIT_MS, round(waited * 1000.0, 3))
        try:
            r = await self.session.post(path, data=data, headers=headers)
        except BaseException as exc:
            self.gate.release()
            if never_reached(exc):
                self.unreachable(exc)
            raise
        if self.health.ejections and self.health.failures:  # it was out of the routing
            log.warning("kvtrace proxy: %s worker %s answers again: back in the routing", self.role, self.base)
        self.health.reached()
        conn = r.connection
        if conn is None:  # the whole body came with the head: aiohttp has the connection back already
            self.gate.release()
        else:
            conn.add_callback(self.gate.release)  # called once, when aiohttp releases or closes it
        return r

    def unreachable(self, exc: BaseException) -> None:
        """A connection to the worker failed: out of the routing (unless it already is)."""
        now = asyncio.get_running_loop().time()
        health = self.health
        if not health.up(now):
            return  # a leg that was sent before the worker went out: already counted
        health.failed(now)
        if not health.up(now):
            log.warning(
                "kvtrace proxy: %s worker %s could not be reached (%s): out of the routing for %g s",
                self.role,
                self.base,
                type(exc).__name__,
                health.down_until - now,
            )


class Pool:
    """Clients of all P and D workers; :meth:`choose_prefill` / :meth:`choose_decode` route a turn
    by the configured policy (:mod:`kvtrace.routing`; load = requests in flight or queued) among
    the workers in the routing (:class:`Health`) and not yet ``tried`` by the turn,
    :meth:`decode_order` round-robins requests that are no turn (``GET /v1/models``)."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.prefill: list[Client] = []
        self.decode: list[Client] = []
        self._d: Iterator[Client] = iter(())  # start() makes the round robin
        self._by_base: dict[str, Client] = {}
        self.router = Router(
            config.routing,
            [w.base for w in config.prefill],
            [w.base for w in config.decode],
            max_sessions=config.max_conversations,
        )
        # the request span names the policy and its reasons only where there was a choice
        self.fleet = len(config.prefill) > 1 or len(config.decode) > 1

    async def start(self) -> None:
        cfg = self.config
        # no total / connect timeout: a request's wait for a slot must not count as connecting
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.read_timeout_s)

        def make(w: Worker, role: str) -> Client:
            # aiohttp's own per-host limit only backs the gate up (GET /v1/models does not pass the gate)
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=cfg.max_worker_connections, keepalive_timeout=60)
            session = aiohttp.ClientSession(base_url=w.base, connector=connector, timeout=timeout)
            gate = Gate(cfg.max_worker_connections, cfg.max_worker_queue)
            return Client(w, session, gate, role, Health(cfg.worker_cooldown_s))

        self.prefill = [make(w, sc.ROLE_PREFILL) for w in cfg.prefill]
        self.decode = [make(w, sc.ROLE_DECODE) for w in cfg.decode]
        self._by_base = {c.base: c for c in self.prefill + self.decode}
        self._d = itertools.cycle(self.decode)

    async def close(self) -> None:
        for c in self.prefill + self.decode:
            await c.session.close()

    def decode_order(self) -> list[Client]:
        """Every D from the next in turn on, those out of the routing last (requests that are no turn)."""
        first = self.decode.index(next(self._d))
        order = self.decode[first:] + self.decode[:first]
        t = loop_time()
        return sorted(order, key=lambda c: not c.health.up(t))  # stable: the turn among equals

    def choose_prefill(self, session: str | None, tried: tuple[Client, ...] = ()) -> tuple[Client, str] | None:
        """The P for a turn of ``session``, and why (``sc.ROUTE_REASONS``); None once every P was tried."""
        avoid = _avoid(self.prefill, tried)
        if avoid is None:
            return None
        c = self.router.prefill(session, [_load(x) for x in self.prefill], avoid)
        return self.prefill[c.index], sc.ROUTE_FAILOVER if tried else c.reason

    def choose_decode(
        self, session: str | None, holder: str | None, tried: tuple[Client, ...] = ()
    ) -> tuple[Client, str] | None:
        """The D for a turn; ``holder``: base URL of the D holding the session's blocks, if known."""
        avoid = _avoid(self.decode, tried)
        if avoid is None:
            return None
        c = self.router.decode(session, holder, [_load(x) for x in self.decode], avoid)
        return self.decode[c.index], sc.ROUTE_FAILOVER if tried else c.reason

    def down(self, base: str) -> bool:
        """Worker ``base`` is out of the routing now (it could not be reached)."""
        c = self._by_base.get(base)
        return c is not None and not c.health.up(loop_time())

    def down_count(self, role: str, now: float | None = None) -> int:
        """Workers of ``role`` out of the routing at ``now`` (default: now; /health)."""
        t = loop_time() if now is None else now
        return sum(not c.health.up(t) for c in self.clients(role))

    def gates(self, role: str) -> list[Gate]:
        return [c.gate for c in (self.prefill if role == sc.ROLE_PREFILL else self.decode)]

    def clients(self, role: str) -> list[Client]:
        return self.prefill if role == sc.ROLE_PREFILL else self.decode


def loop_time() -> float:
    """The running loop's time (a virtual fleet's own), else the monotonic clock asyncio's loop uses."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


def _avoid(clients: list[Client], tried: tuple[Client, ...]) -> set[int] | None:
    """Indices of the workers a choice skips: those ``tried`` and, while another is up, those out of
    the routing; None when every worker was tried."""
    now = loop_time()
    out = {i for i, c in enumerate(clients) if c in tried or not c.health.up(now)}
    if len(out) < len(clients):
        return out
    skip = {i for i, c in enumerate(clients) if c in tried}
    return skip if len(skip) < len(clients) else None


def _load(c: Client) -> int:
    return c.gate.in_use + c.gate.queued


def json_object(data: bytes) -> dict | None:
    try:
        obj = loads(data)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def never_reached(exc: BaseException) -> bool:
    """The worker never got the request (connect failed): its table entry is still unused."""
    return isinstance(
        exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, aiohttp.ServerDisconnectedError)
    )
