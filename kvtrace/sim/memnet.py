"""In-memory TCP for the virtual-time loop (:mod:`kvtrace.sim.virtual`): servers and connections
that are asyncio transports over nothing but the loop's ready queue.

:class:`MemNet` stands in for the loop's ``create_server`` / ``create_connection`` / ``sock_connect``:
aiohttp's server (the simulated workers, the proxy) registers a port, a client (the proxy's
aiohttp pool, the bench's httpx client) connects to it by port, and each side's writes reach the
other side's protocol as ``data_received`` on the next loop iteration, in order, with EOF and close
delivered like a socket's.  aiohttp's client connects through ``aiohappyeyeballs``, which makes a
socket object and calls ``loop.sock_connect``: that socket is never connected, only its target
address is kept and the socket closed when ``create_connection(sock=...)`` takes it.  No flow
control: nothing here ever pauses a writer (the bench's bodies are small and the buffers are
bounded by the workload).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import socket
from collections.abc import Callable

_EOF = None  # a delivery that is the peer's end of stream
FIRST_PORT = 20000  # servers' ports given for port 0
FIRST_CLIENT_PORT = 50000  # the peer address a server sees


class _FakeSocket:
    """What aiohttp and anyio read off a socket: its addresses and family; options are ignored."""

    family = socket.AF_INET
    type = socket.SOCK_STREAM

    def __init__(self, address: tuple[str, int], peer: tuple[str, int] | None = None) -> None:
        self._address, self._peer = address, peer

    def getsockname(self) -> tuple[str, int]:
        return self._address

    def getpeername(self) -> tuple[str, int]:
        if self._peer is None:
            raise OSError(errno.ENOTCONN, "not connected")
        return self._peer

    def setsockopt(self, *args) -> None:
        return None

    def getsockopt(self, *args) -> int:
        return 0

    def fileno(self) -> int:
        return -1


class MemServer:
    """A listening port: the part of ``asyncio.Server`` aiohttp's sites use."""

    def __init__(self, net: MemNet, factory: Callable, address: tuple[str, int]) -> None:
        self._net, self.factory, self.address = net, factory, address
        self.sockets = [_FakeSocket(address)]
        self._serving = True

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._net.loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        return None

    def close(self) -> None:
        self._serving = False
        self._net.servers.pop(self.address[1], None)

    def close_clients(self) -> None:
        return None  # aiohttp's runner shuts its own connections down

    def abort_clients(self) -> None:
        self.close_clients()

    async def wait_closed(self) -> None:
        return None

    async def __aenter__(self) -> MemServer:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()


class MemTransport(asyncio.Transport):
    """One end of an in-memory connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol, sockname, peername) -> None:
        extra = {"sockname": sockname, "peername": peername, "sslcontext": None}
        super().__init__({**extra, "socket": _FakeSocket(sockname, peername)})
        self._loop, self._protocol = loop, protocol
        self.peer: MemTransport | None = None
        self._closing = self._paused = False
        self._held: list = []  # deliveries that arrived while reading was paused

    # -- the asyncio.Transport surface
    def get_protocol(self):
        return self._protocol

    def set_protocol(self, protocol) -> None:
        self._protocol = protocol

    def is_closing(self) -> bool:
        return self._closing

    def is_reading(self) -> bool:
        return not self._paused and not self._closing

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        if self._paused:
            self._paused = False
            if self._held:
                self._loop.call_soon(self._drain)

    def write(self, data) -> None:
        if self._closing or not data or self.peer is None:
            return
        self.peer._arrive(bytes(data))

    def writelines(self, chunks) -> None:
        self.write(b"".join(chunks))

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        if self.peer is not None:
            self.peer._arrive(_EOF)

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        return None

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self.peer is not None:
            self.peer._arrive(_EOF)
        self._loop.call_soon(self._protocol.connection_lost, None)

    def abort(self) -> None:
        self.close()

    # -- delivery, one loop iteration after the peer's write, in order
    def _arrive(self, item) -> None:
        self._loop.call_soon(self._deliver, item)

    def _deliver(self, item) -> None:
        if self._closing:
            return
        if self._paused or self._held:
            self._held.append(item)
            if not self._paused:
                self._drain()
            return
        self._hand(item)

    def _drain(self) -> None:
        while self._held and not self._paused and not self._closing:
            self._hand(self._held.pop(0))

    def _hand(self, item) -> None:
        if item is _EOF:
            keep = self._protocol.eof_received() if hasattr(self._protocol, "eof_received") else None
            if not keep:
                self.close()
        else:
            self._protocol.data_received(item)


class MemNet:
    """The ports of one virtual loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.servers: dict[int, MemServer] = {}
        self._ports = itertools.count(FIRST_PORT)
        self._client_ports = itertools.count(FIRST_CLIENT_PORT)
        self._targets: dict = {}  # socket -> the address sock_connect was asked for

    def _free_port(self) -> int:
        port = next(self._ports)
        while port in self.servers:
            port = next(self._ports)
        return port

    def listen(self, factory: Callable, host, port) -> MemServer:
        host = host[0] if isinstance(host, (list, tuple)) else (host or "127.0.0.1")
        port = int(port or 0) or self._free_port()
        if port in self.servers:
            raise OSError(errno.EADDRINUSE, f"[virtual] address already in use: {host}:{port}")
        server = MemServer(self, factory, (host, port))
        self.servers[port] = server
        return server

    def remember(self, sock, address) -> None:
        self._targets[sock] = address

    def connect(self, factory: Callable, host, port, sock=None) -> tuple[MemTransport, object]:
        if sock is not None:
            host, port = self._targets.pop(sock, (None, None))[:2]
            sock.close()
        server = self.servers.get(int(port or 0))
        if server is None:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"[virtual] connect call failed ({host}, {port})")
        client_addr = ("127.0.0.1", next(self._client_ports))
        server_proto, client_proto = server.factory(), factory()
        s_end = MemTransport(self.loop, server_proto, server.address, client_addr)
        c_end = MemTransport(self.loop, client_proto, client_addr, server.address)
        s_end.peer, c_end.peer = c_end, s_end
        server_proto.connection_made(s_end)
        client_proto.connection_made(c_end)
        return c_end, client_proto
