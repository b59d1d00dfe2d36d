"""Unit paths of the proxy's verified offers: a prompt's identity for every request kind
(kvtrace.proxy.identity), continuity against the record, turn order and eviction shared by the
prefix table and the conversation table."""

from __future__ import annotations

import pytest

from kvtrace import semconv as sc
from kvtrace.proxy import identity
from kvtrace.proxy.prefix_table import PrefixTable
from kvtrace.proxy.table import ConversationTable

U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text: {"role": "assistant", "content": text}  # noqa: E731
PARAMS = {"do_remote_decode": True, "remote_block_ids": [[1, 2]], "remote_num_tokens": 100}


def chat(messages, **extra):
    return identity.chat({"model": "m", "messages": messages, **extra})


def text(prompt, **extra):
    return identity.completion({"model": "m", "prompt": prompt, **extra})


def served(t: PrefixTable, key: str, prompt, reply, turn: int) -> None:
    t.check(key, prompt)  # as the proxy does: check at the start, record at the end
    assert t.served(key, prompt, reply, turn)


@pytest.mark.parametrize(
    "change",
    [
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"chat_template": "{{ messages }}"},
        {"model": "other-lora"},
        {"add_generation_prompt": False},
        {"continue_final_message": True},
    ],
)
def test_a_chat_continuation_that_changes_what_renders_the_prompt_diverges_at_its_start(change):
    t = PrefixTable()
    served(t, "s", chat([U("q0")]), A("a0"), 0)
    nxt = [U("q0"), A("a0"), U("q1")]
    assert t.check("s", chat(nxt)) == (sc.CONTINUITY_EXTENDS, None)
    assert t.check("s", chat(nxt, **change)) == (sc.CONTINUITY_DIVERGED, 0)


def test_content_parts_hash_as_the_string_vllm_joins_them_into():
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert chat([parts]).hashes == chat([U("a\nb")]).hashes != chat([U("ab")]).hashes


def test_a_text_prompt_is_cut_at_the_record_and_extends_only_through_the_served_reply():
    t = PrefixTable()
    served(t, "s", text("P0 "), "R0 ", 0)
    assert t.check("s", text("P0 R0 P1 ")) == (sc.CONTINUITY_EXTENDS, None)
    assert t.check("s", text("P0 ")) == (sc.CONTINUITY_EXTENDS, None)  # a retry
    assert t.check("s", text("P0 X")) == (sc.CONTINUITY_DIVERGED, 1)  # shorter than the reply, other text
    assert t.check("s", text("P0 R1 P1 ")) == (sc.CONTINUITY_DIVERGED, 1)  # the reply rewritten
    assert t.check("s", text("Q0 R0 P1 ")) == (sc.CONTINUITY_REUSED_ID, 0)  # another conversation
    assert t.check("s", text("P0 R0 P1 ", add_special_tokens=False)) == (sc.CONTINUITY_DIVERGED, 0)
    p1 = text("P0 R0 P1 ")
    served(t, "s", p1, "R1 ", 1)
    assert p1.ends == [3, 6, 9]  # cut where turn 0's prompt and reply ended, then the rest
    assert t.check("s", text("P0 R0 P1 R1 P2")) == (sc.CONTINUITY_EXTENDS, None)
    assert t.check("s", text("P0 R0 P9 R1 P2")) == (sc.CONTINUITY_DIVERGED, 2)


def test_prompts_whose_reply_the_proxy_cannot_read_are_unknown_past_their_request():
    ids = [5, 6, 7]
    for prompt, nxt in (
        (identity.completion({"prompt": ids}), identity.completion({"prompt": ids + [9]})),
        (chat([U("q")], n=2), chat([U("q"), A("one of two"), U("q2")], n=2)),
        (text("P ", echo=True), text("P P R ")),
    ):
        t = PrefixTable()
        served(t, "s", prompt, "a reply the proxy may have read", 0)
        assert t.check("s", nxt) == (sc.CONTINUITY_UNKNOWN, None)
        assert t.check("s", prompt) == (sc.CONTINUITY_EXTENDS, None)  # the same request again


def test_another_kind_of_request_under_the_id_is_reused_id():
    t = PrefixTable()
    served(t, "s", text("hello "), "there ", 0)
    assert t.check("s", chat([U("hello ")])) == (sc.CONTINUITY_REUSED_ID, 0)
    assert t.check("s", identity.completion({"prompt": [1, 2]})) == (sc.CONTINUITY_REUSED_ID, 0)
    batch = identity.completion({"prompt": ["a", "b"]})
    assert batch.kind == identity.KIND_OPAQUE and t.check("s", batch) == (sc.CONTINUITY_REUSED_ID, 0)


def test_an_older_turn_finishing_late_does_not_replace_the_prefix_record():
    t = PrefixTable()
    served(t, "s", chat([U("q0")]), A("a0"), 0)
    newer = chat([U("q0"), A("a0"), U("B")])
    assert t.served("s", newer, A("b"), 2)
    assert not t.served("s", chat([U("q0"), A("a0"), U("A")]), A("a"), 1)
    assert (t.turn("s"), t.stale_turns) == (2, 1)
    assert t.check("s", chat([U("q0"), A("a0"), U("B"), A("b"), U("next")])) == (sc.CONTINUITY_EXTENDS, None)


def test_an_older_turn_finishing_late_does_not_store_its_blocks_even_after_the_newer_were_taken():
    clock = lambda: 0.0  # noqa: E731
    table = ConversationTable(450, clock=clock)
    for _ in range(3):
        table.begin("c")  # turns 0, 1, 2 started
    assert table.store("c", 2, PARAMS, "d0")
    table.begin("c").consumed()  # turn 3 took turn 2's blocks
    assert not table.store("c", 1, {**PARAMS, "remote_num_tokens": 7}, "d0")
    assert table.peek("c") is None
    stale = table.begin("c")
    assert (stale.offered, stale.reason) == (False, sc.OFFER_NO_ENTRY)


def test_blocks_of_another_turn_than_the_checked_record_are_not_offered():
    table = ConversationTable(450, clock=lambda: 0.0)
    table.begin("c")
    table.store("c", 0, PARAMS, "d0")
    turn = table.begin("c", checked=True, history=None)  # the record is gone: the history is unknown
    assert (turn.offered, turn.reason, turn.dropped_tokens) == (False, sc.OFFER_HISTORY_UNKNOWN, None)
    table.store("c", 1, PARAMS, "d0")
    assert table.begin("c", checked=True, history=0).reason == sc.OFFER_HISTORY_UNKNOWN  # turn 1's blocks
    table.store("c", 2, PARAMS, "d0")
    assert table.begin("c", checked=True, history=2).reason == sc.OFFER_OFFERED
    table.store("c", 3, PARAMS, "d0")
    reused = table.begin("c", sc.OFFER_REUSED_ID, checked=True, history=3)
    assert (reused.offered, reused.reason, reused.dropped_tokens) == (False, sc.OFFER_REUSED_ID, None)
    assert table.peek("c") is None  # another conversation's request drops the blocks


def test_the_two_tables_are_evicted_together():
    table = ConversationTable(450, max_entries=2, clock=lambda: 0.0)
    chains = PrefixTable(max_sessions=2, on_evict=table.drop)
    table.on_evict = chains.forget
    for key in ("a", "b"):
        table.begin(key)
        table.store(key, 0, PARAMS, "d0")
        served(chains, key, chat([U(key)]), A("x"), 0)
    served(chains, "z", chat([U("z")]), A("x"), 0)  # the prefix table evicts "a"
    assert chains.turn("a") is None and table.peek("a") is None and table.peek("b") is not None
    table.begin("y")
    table.begin("w")  # the conversation table evicts "b", its least recently used
    assert table.peek("b") is None and chains.turn("b") is None
    over = PrefixTable(max_bytes=1000, on_evict=table.drop)
    table.begin("big")
    table.store("big", 0, PARAMS, "d0")
    assert not over.served("big", chat([U(str(i)) for i in range(200)]), None, 0)  # alone past the bound
    assert table.peek("big") is None and over.evicted_lru == 1
