"""Ports for the rigs: never the same one twice, though the kernel may give a released port to the
next bind(0) (a rig's collector was once handed its simulator's port)."""

from __future__ import annotations

import socket

from kvtrace.bench import arms
from kvtrace.testing import wait


class _Kernel:
    """socket.socket whose bind(0) gives the port released last when one is free again, else a new
    one: the worst case of a real kernel's choice."""

    def __init__(self, first: int) -> None:
        self.next, self.bound, self.released = first, set(), []

    def __call__(self, *args, **kwargs):
        kernel = self

        class Sock:
            port = None

            def bind(self, addr):
                free = [p for p in kernel.released if p not in kernel.bound]
                if free:
                    self.port = free[-1]
                else:
                    self.port, kernel.next = kernel.next, kernel.next + 1
                kernel.bound.add(self.port)

            def getsockname(self):
                return ("127.0.0.1", self.port)

            def close(self):
                if self.port in kernel.bound:
                    kernel.bound.discard(self.port)
                    kernel.released.append(self.port)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.close()

        return Sock()


def test_free_port_never_returns_a_port_it_returned_before(monkeypatch):
    kernel = _Kernel(41001)
    monkeypatch.setattr(wait, "_GIVEN", set())
    monkeypatch.setattr(socket, "socket", kernel)
    assert [wait.free_port() for _ in range(4)] == [41001, 41002, 41003, 41004]
    assert kernel.bound == set()  # every socket it opened is closed


def test_free_port_gives_a_port_nothing_listens_on():
    port = wait.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # EADDRINUSE if anything held it


def test_bench_arms_ports_are_chosen_while_all_are_bound(monkeypatch):
    kernel = _Kernel(42001)
    with monkeypatch.context() as m:
        m.setattr(arms.socket, "socket", kernel)
        assert arms._free_ports(3) == [42001, 42002, 42003]
    assert kernel.bound == set()
    assert len(set(arms._free_ports(3))) == 3  # the real kernel
