"""What tests, benchmarks and scripts that start servers share: a free loopback port, and a
deadline-bounded poll (a wait on a condition, never a sleep used as synchronisation), in a
blocking form and in an asyncio form for code whose condition needs the event loop to run."""

from __future__ import annotations

import asyncio
import inspect
import random
import socket
import time

_GIVEN: set[int] = set()  # every port free_port returned in this process
_LOWEST = 10_000  # free_port's ports: from here to the kernel's ephemeral range
# its own generator: a test that seeds the module's random must not make every run pick the same ports
_RNG = random.Random()


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out as outgoing connections' local ports (Linux's
    ``ip_local_port_range``; its default where that cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, that this process was not given before,
    and that no outgoing connection is given meanwhile: it is drawn below the kernel's ephemeral
    range. A server that binds its port only after a long start-up would otherwise find it taken by
    any connection made in between (seen: a vLLM decode server's NIXL side channel, `Address already
    in use`, twenty seconds after the port was chosen while two other servers started beside it)."""
    low, _ = ephemeral_range()
    if low - _LOWEST >= 1000:
        for _ in range(200):
            port = _RNG.randrange(_LOWEST, low)
            if port not in _GIVEN and _bindable(port):
                _GIVEN.add(port)
                return port
    return _kernel_port()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    """The kernel's choice (bind(0)), never one given before: the kernel may hand the port it just
    released to the next bind(0), so a rig asking for four ports in a row could get one twice
    (seen: the collector on the simulator's port)."""
    held = []  # ports given before stay bound while looking, so bind(0) moves past them
    try:
        while True:
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port not in _GIVEN:
                _GIVEN.add(port)
                return port
    finally:
        for s in held:
            s.close()


def _timeout(deadline_s: float, what: str, last) -> TimeoutError:
    return TimeoutError(f"timed out after {deadline_s:g}s waiting for {what} (last: {last!r})")


def wait_for(predicate, deadline_s: float, what: str, interval: float = 0.2):
    """Call ``predicate`` every ``interval`` s until it returns something true and return that;
    TimeoutError (naming ``what`` and the last value) once ``deadline_s`` has passed."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise _timeout(deadline_s, what, last)


async def wait_for_async(predicate, deadline_s: float, what: str, interval: float = 0.005):
    """:func:`wait_for` inside an event loop: ``predicate`` (a plain function or a coroutine
    function) is called every ``interval`` s, the loop running in between."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    last = None
    while loop.time() < end:
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise _timeout(deadline_s, what, last)
