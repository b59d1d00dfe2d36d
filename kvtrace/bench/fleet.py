"""The simulated fleet an arm runs on: how many P and D workers, and the proxy's routing policy
(``kvtrace bench --arms --prefillers N --decoders M --routing POLICY``).

The virtual clock (:mod:`kvtrace.bench.inproc`) starts ``SimCluster(N, M)`` and the proxy app
over it; the wall clock starts ``kvtrace sim --prefill N --decode M`` on consecutive ports and
``kvtrace proxy`` with every worker and ``--routing``.  Either way the routing is the proxy's
(:mod:`kvtrace.routing`), the code a deployment runs.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from kvtrace import semconv as sc
from kvtrace import settings
from kvtrace.bench.api import BenchError
from kvtrace.routing import RoutingError, check_policy


@dataclass(frozen=True)
class Fleet:
    prefillers: int = 1
    decoders: int = 1
    routing: str = sc.ROUTING_ROUND_ROBIN

    @property
    def label(self) -> str:
        return f"{self.prefillers}P{self.decoders}D, routing {self.routing}"

    @property
    def default(self) -> bool:
        return (self.prefillers, self.decoders) == (1, 1)

    def check(self, clients: int | None) -> None:
        """BenchError (one line) for a fleet that cannot serve the workload."""
        try:
            check_policy(self.routing)
        except RoutingError as exc:
            raise BenchError(str(exc)) from None
        if self.prefillers < 1 or self.decoders < 1:
            raise BenchError(
                f"impossible topology {self.prefillers}P{self.decoders}D: a fleet needs at least one prefill "
                "and one decode worker"
            )
        # what the proxy lets wait on its workers (--max-worker-connections + --max-worker-queue each)
        per = int(settings.PROXY_MAX_WORKER_CONNECTIONS.get()) + int(settings.PROXY_MAX_WORKER_QUEUE.get())
        held = min(self.prefillers, self.decoders) * per
        if clients is not None and clients > held:
            raise BenchError(
                f"{clients} clients are more than {self.prefillers}P{self.decoders}D can hold: the proxy queues at "
                f"most {held} requests per role ({per} per worker); add workers or lower --clients"
            )


SINGLE = Fleet()  # 1 P + 1 D: the published setup


def consecutive_free_ports(n: int, host: str, tries: int = 200, held: list[socket.socket] | None = None) -> int:
    """The first of ``n`` consecutive free ports (``kvtrace sim`` numbers its workers port, port+1, ...).
    ``held``: the range's sockets stay bound, added to it (the caller closes them), so that a later
    choice is not handed them: the kernel may give a port just released to the next bind(0)."""
    for _ in range(tries):
        with socket.socket() as probe:
            probe.bind((host, 0))
            base = probe.getsockname()[1]
        if base + n > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind((host, port))
        except OSError:
            for s in socks:
                s.close()
            continue
        if held is None:
            for s in socks:
                s.close()
        else:
            held += socks
        return base
    raise BenchError(f"found no {n} consecutive free ports on {host}")
