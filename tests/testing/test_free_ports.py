"""Ports for the rigs: never the same one twice, though the kernel may give a released port to the
next bind(0) (a rig's collector was once handed its simulator's port), and never one the kernel may
give an outgoing connection before the server binds it (a vLLM server's side channel once found its
port taken)."""

from __future__ import annotations

import socket

from kvtrace import semconv as sc
from kvtrace.bench import served
from kvtrace.bench.fleet import Fleet
from kvtrace.testing import wait


class _Kernel:
    """socket.socket whose bind(0) gives the port released last when one is free again, else a new
    one: the worst case of a real kernel's choice.  An explicit port binds unless it is bound."""

    def __init__(self, first: int) -> None:
        self.next, self.bound, self.released = first, set(), []

    def __call__(self, *args, **kwargs):
        kernel = self

        class Sock:
            port = None

            def bind(self, addr):
                free = [p for p in kernel.released if p not in kernel.bound]
                if addr[1]:
                    if addr[1] in kernel.bound:
                        raise OSError(98, "Address already in use")
                    self.port = addr[1]
                elif free:
                    self.port = free[-1]
                else:
                    while kernel.next in kernel.bound:
                        kernel.next += 1
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


class _Draws:
    """wait._RNG's randrange, scripted: the ports it draws, and the bounds it was asked for."""

    def __init__(self, ports: list[int]) -> None:
        self.ports, self.bounds = list(ports), []

    def randrange(self, low: int, high: int) -> int:
        self.bounds.append((low, high))
        return self.ports.pop(0)


def test_free_port_draws_below_the_ephemeral_range_and_never_twice(monkeypatch):
    draws = _Draws([20001, 20001, 20002, 20003, 20002, 20004])
    monkeypatch.setattr(wait, "_GIVEN", set())
    monkeypatch.setattr(wait, "_RNG", draws)
    monkeypatch.setattr(wait, "ephemeral_range", lambda: (32768, 60999))
    monkeypatch.setattr(wait, "_bindable", lambda port: True)
    assert [wait.free_port() for _ in range(4)] == [20001, 20002, 20003, 20004]
    assert set(draws.bounds) == {(10_000, 32768)}


def test_free_port_skips_a_drawn_port_something_holds(monkeypatch):
    monkeypatch.setattr(wait, "_GIVEN", set())
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        others = [p for p in range(taken - 5, taken + 6) if p != taken and 1024 < p <= 65535]
        monkeypatch.setattr(wait, "_RNG", _Draws([taken, *others]))
        monkeypatch.setattr(wait, "ephemeral_range", lambda: (65535, 65535))
        port = wait.free_port()
    assert port in others


def test_free_port_falls_back_to_the_kernel_without_room_below_its_range(monkeypatch):
    kernel = _Kernel(41001)
    monkeypatch.setattr(wait, "_GIVEN", set())
    monkeypatch.setattr(wait, "ephemeral_range", lambda: (10_500, 60999))
    monkeypatch.setattr(socket, "socket", kernel)
    assert [wait.free_port() for _ in range(4)] == [41001, 41002, 41003, 41004]
    assert kernel.bound == set()  # every socket it opened is closed


def test_ephemeral_range_is_the_kernels(monkeypatch):
    low, high = wait.ephemeral_range()
    assert 1024 <= low <= high <= 65535
    monkeypatch.setattr("builtins.open", lambda *a, **k: (_ for _ in ()).throw(PermissionError("no procfs")))
    assert wait.ephemeral_range() == (32768, 60999)


def test_free_port_gives_a_port_nothing_listens_on_outside_the_ephemeral_range():
    port = wait.free_port()
    low, high = wait.ephemeral_range()
    assert not low <= port <= high
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # EADDRINUSE if anything held it


def _arm_ports(fleet: Fleet) -> list[int]:
    proxy, first_p, first_d = served.arm_ports(fleet)
    return [proxy, *range(first_p, first_p + fleet.prefillers), *range(first_d, first_d + fleet.decoders)]


def test_bench_arms_ports_are_chosen_while_all_are_bound(monkeypatch):
    fleet = Fleet(2, 3, sc.ROUTING_ROUND_ROBIN)
    kernel = _Kernel(42001)
    with monkeypatch.context() as m:
        m.setattr(socket, "socket", kernel)
        assert _arm_ports(fleet) == [42001, 42002, 42003, 42004, 42005, 42006]
    assert kernel.bound == set()
    assert len(set(_arm_ports(fleet))) == 6  # the real kernel
