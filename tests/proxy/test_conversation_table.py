"""The proxy's conversation table: why an offer is made or not and the entry's age, restore
and ordering, the LRU bound, stale entries evicted."""

from __future__ import annotations

from kvtrace import semconv as sc
from kvtrace.proxy.table import ConversationTable


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_table_offer_reasons_and_age():
    clock = Clock()
    t = ConversationTable(ttl_s=450, clock=clock)
    assert t.begin(None).reason == sc.OFFER_NO_CONVERSATION_ID
    first = t.begin("a")
    assert (first.index, first.offered, first.reason) == (0, False, sc.OFFER_NO_ENTRY)
    assert t.store("a", 0, {"x": 1}, "http://d0")
    clock.t = 10
    turn = t.begin("a")
    assert (turn.index, turn.offered, turn.reason, turn.entry_age_s) == (1, True, sc.OFFER_OFFERED, 10)
    assert turn.entry.params == {"x": 1} and turn.entry.decode_endpoint == "http://d0"
    turn.consumed()
    assert t.begin("a").reason == sc.OFFER_NO_ENTRY  # consumed on read, as upstream
    t.store("a", 2, {"x": 2}, "http://d1")
    clock.t = 10 + 451
    old = t.begin("a")
    assert (old.offered, old.reason, old.entry_age_s) == (False, sc.OFFER_ENTRY_TOO_OLD, 451)


def test_table_restore_and_ordering():
    t = ConversationTable(ttl_s=450, clock=Clock())
    t.begin("a")
    t.store("a", 0, {"turn": 0}, "d")
    failed = t.begin("a")  # turn 1 takes the entry, then P fails
    failed.restore()
    assert t.peek("a").params == {"turn": 0}
    ok = t.begin("a")  # turn 2 takes it again
    late = t.begin("a")  # turn 3 concurrently: nothing left to offer
    assert ok.offered and not late.offered
    t.store("a", 3, {"turn": 3}, "d")
    assert not t.store("a", 2, {"turn": 2}, "d")  # an older turn never overwrites a newer entry
    ok.restore()  # nor does a restore
    assert t.peek("a").params == {"turn": 3}


def test_table_lru_bound():
    t = ConversationTable(ttl_s=450, max_entries=2, clock=Clock())
    for key in ("a", "b"):
        t.begin(key)
        t.store(key, 0, {}, "d")
    t.begin("a")  # a is now most recent
    t.begin("c")
    assert t.peek("b") is None and t.begin("b").index == 0  # b was evicted, turn counter restarts


def test_evict_stale():
    clock = Clock()
    t = ConversationTable(ttl_s=5, clock=clock)
    t.store("a", 0, {}, "d")
    clock.t = 6
    t.store("b", 0, {}, "d")  # drops a on its way
    health = t.health()
    assert (health["evicted_stale"], health["cached_conversations"], len(t)) == (1, 1, 1)
    assert health["table_bytes"] == t.nbytes > 0 and health["conversations"] == 2
