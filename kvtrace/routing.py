"""Which prefill (P) and decode (D) worker serves a turn: the routing policies of a P/D fleet.

One :class:`Router` per proxy (:mod:`kvtrace.proxy.upstream` asks it for every leg), the same code
whether the workers are vLLM servers, the served simulator or the virtual-time cluster of
``kvtrace bench --arms`` (which runs the proxy app itself).  A policy sees, per worker, its load
(requests the proxy has in flight or queued to it) and, per session, what the proxy knows of where
its KV lives: the D holding the last turn's blocks (the conversation table's entry) and the P
that prefilled its last turn (remembered here).

- ``round-robin``: P and D in turn, blind to sessions and load (upstream ``disagg_proxy``).
- ``least-loaded``: the worker with the fewest requests in flight; ties go round-robin.
- ``session-affine``: D = the one holding the session's blocks, so D's own prefix cache holds
  the conversation and its pull from P moves only the new tokens; P least-loaded.  A session
  with no holder known, or whose holder is not in the pool, falls back to least-loaded.
- ``kv-aware``: D as ``session-affine``; P = the one that prefilled the session's last turn (its
  prefix cache may hold that prompt, so the pull from D moves less) unless it has more than
  :data:`KV_AWARE_SLACK` requests in flight above the least-loaded P, when the least-loaded wins.

Every choice comes with its reason (``semconv.ROUTE_REASONS``), which the proxy records on the request
span, so a trace shows why a turn went where it went.  Session memory is bounded
(``max_sessions``, least recently used first), like the conversation table.

Workers the proxy cannot reach are ``avoid``-ed: each policy chooses among the others as it would
among all (round-robin's turn passes over them).  When the session's own worker (its D holding the
blocks, or kv-aware's last P) is avoided, the choice among the others says ``failover``; the proxy
also says so when it sends a turn's leg again to another worker after the first could not be reached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from kvtrace import semconv as sc

ROUND_ROBIN, LEAST_LOADED = sc.ROUTING_ROUND_ROBIN, sc.ROUTING_LEAST_LOADED
SESSION_AFFINE, KV_AWARE = sc.ROUTING_SESSION_AFFINE, sc.ROUTING_KV_AWARE
POLICIES = sc.ROUTING_POLICIES

KV_AWARE_SLACK = 2  # kv-aware keeps the session's P while it has at most this many more in flight


class RoutingError(ValueError):
    """An unknown policy or an empty pool (one line)."""


@dataclass(frozen=True)
class Choice:
    index: int  # into the role's worker list
    reason: str


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise RoutingError(f"unknown routing policy {name!r}; choose from {', '.join(POLICIES)}")
    return name


class Router:
    """Chooses P and D per turn for ``policy`` over ``prefill`` and ``decode`` (worker ids: the
    proxy passes base URLs); :meth:`prefill` / :meth:`decode` remember the session's choice."""

    def __init__(self, policy: str, prefill: Sequence[str], decode: Sequence[str], max_sessions: int = 100_000) -> None:
        if not prefill or not decode:
            raise RoutingError("need at least one prefill and one decode worker")
        self.policy = check_policy(policy)
        self.prefill_ids, self.decode_ids = list(prefill), list(decode)
        self._decode_index = {w: i for i, w in enumerate(self.decode_ids)}
        self.max_sessions = max(1, int(max_sessions))
        self._last_p: OrderedDict[str, int] = OrderedDict()
        self._next = {"p": 0, "d": 0}  # round-robin positions, also the tie-break start

    def prefill(self, session: str | None, loads: Sequence[int], avoid: Collection[int] = ()) -> Choice:
        """The P for the next turn of ``session`` (None: unknown) given each P's ``loads``, never
        one of ``avoid`` (indices; it must leave at least one)."""
        if self.policy == ROUND_ROBIN:
            choice = Choice(self._rotate("p", len(self.prefill_ids), avoid), sc.ROUTE_ROTATION)
        else:
            choice = Choice(self._least("p", loads, avoid), sc.ROUTE_LEAST_LOADED)
            last = self._last_p.get(session) if session is not None and self.policy == KV_AWARE else None
            if last is not None and last in avoid:
                choice = Choice(choice.index, sc.ROUTE_FAILOVER)
            elif last is not None and loads[last] <= loads[choice.index] + KV_AWARE_SLACK:
                choice = Choice(last, sc.ROUTE_LAST_PREFILL)
        if session is not None:
            self._remember(session, choice.index)
        return choice

    def decode(
        self, session: str | None, holder: str | None, loads: Sequence[int], avoid: Collection[int] = ()
    ) -> Choice:
        """The D for the next turn; ``holder``: the D (id) that holds the session's blocks, if known;
        never one of ``avoid``."""
        if self.policy == ROUND_ROBIN:
            return Choice(self._rotate("d", len(self.decode_ids), avoid), sc.ROUTE_ROTATION)
        reason = sc.ROUTE_LEAST_LOADED
        if self.policy in (SESSION_AFFINE, KV_AWARE) and holder is not None:
            i = self._decode_index.get(holder)
            if i is not None and i not in avoid:
                return Choice(i, sc.ROUTE_HOLDER)
            if i is not None:
                reason = sc.ROUTE_FAILOVER
        return Choice(self._least("d", loads, avoid), reason)

    def _rotate(self, role: str, n: int, avoid: Collection[int]) -> int:
        i = self._next[role] % n
        for _ in range(n - 1):  # the turn passes over the avoided
            if i not in avoid:
                break
            i = (i + 1) % n
        self._next[role] = i + 1
        return i

    def _least(self, role: str, loads: Sequence[int], avoid: Collection[int]) -> int:
        """The least-loaded worker not avoided; among equals the first at or after the rotation
        point, which then moves past it (so an idle pool spreads new sessions instead of piling on
        worker 0)."""
        n = len(loads)
        start = self._next[role] % n
        best = min((i for i in range(n) if i not in avoid), key=lambda i: (loads[i], (i - start) % n))
        self._next[role] = best + 1
        return best

    def _remember(self, session: str, p: int) -> None:
        self._last_p[session] = p
        self._last_p.move_to_end(session)
        if len(self._last_p) > self.max_sessions:
            self._last_p.popitem(last=False)
