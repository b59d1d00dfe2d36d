"""The simulator's KV holds on D expire on the injected clock."""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.sim.holds import Hold, Holds


def test_holds_expire_on_the_injected_clock():
    now = [100.0]
    released = []
    holds = Holds(lambda: now[0], 1.0, lambda h, reason: released.append((h.internal_id, reason)))
    holds.add(Hold("a", "ra", [1], 16, 110.0, True))
    holds.add(Hold("b", "rb", [2], 16, 130.0, False))
    now[0] = 110.0
    assert holds.sweep() == 1 and released == [("a", sc.RETENTION_EXPIRED)]
    assert holds.pop("b", sc.RETENTION_READ).block_ids == [2]
    assert released[-1] == ("b", sc.RETENTION_READ) and len(holds) == 0
    assert holds.pop("b", sc.RETENTION_READ) is None


def test_a_heartbeating_reader_keeps_a_lease_then_it_lapses_two_thirds_of_a_lease_later():
    now = [100.0]
    released = []
    holds = Holds(lambda: now[0], 1.0, lambda h, reason: released.append((h.internal_id, reason)))
    holds.add(Hold("p", "rp", [1], 16, 130.0, False))
    holds.start_renewal("p")
    now[0] = 500.0
    assert holds.sweep() == 0 and "p" in holds  # D still waits to read it
    holds.stop_renewal("p", 20.0)
    assert holds.get("p").deadline == 520.0
    now[0] = 519.9
    assert holds.sweep() == 0
    now[0] = 520.0
    assert holds.sweep() == 1 and released == [("p", sc.RETENTION_EXPIRED)]
    holds.stop_renewal("p", 20.0)  # no longer held: nothing to do
