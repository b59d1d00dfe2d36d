"""The proxy's prefix table (kvtrace.proxy.prefix_table): message identity, the reply rebuilt from D's
stream, lookups, continuity, bounds (entries, bytes, RSS under 100k sessions), no text kept."""

from __future__ import annotations

import gc
import json
import re
import subprocess
import sys
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace import semconv as sc
from kvtrace.proxy import prefix_table
from kvtrace.proxy.prefix_table import PrefixTable, Reply, chain, message_hash
from kvtrace.proxy.stream import Aggregator, StreamPatcher

U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text, **kw: {"role": "assistant", "content": text, **kw}  # noqa: E731


def test_message_identity():
    h = lambda m: message_hash(0, m)  # noqa: E731
    parts = lambda *texts: {"role": "user", "content": [{"type": "text", "text": t} for t in texts]}  # noqa: E731
    assert h(U("h\ni")) == h(parts("h", "i")) and h(U("hi")) == h(parts("hi"))  # vLLM joins parts with "\n"
    assert h(U("hi")) != h(parts("h", "i"))  # renders "h\ni": other tokens
    assert h(U("hi")) != h(U("hi ")) and h(U("hi")) != h(A("hi")) and h(U("hi")) != h({"role": "user"})
    assert h(A("x", reasoning="r")) == h(A("x", reasoning_content="r")) != h(A("x"))
    call = lambda i: {"id": i, "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}  # noqa: E731
    assert h(A(None, tool_calls=[call("c1")])) == h(A("", tool_calls=[call("c2")]))  # ids are not template input
    assert h({"role": ["odd"], "content": "x"}) == h({"role": ["odd"], "content": "x"})  # unhashable role: no error
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a"}}]}
    assert h(image) != h({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "b"}}]})
    c = chain([U("a"), A("b"), U("c")])
    assert c[:2] == chain([U("a"), A("b")]) and c[0] == h(U("a")) and c[2] != chain([U("a"), A("B"), U("c")])[2]


def _sse(deltas: list[dict], finish: bool = True) -> bytes:
    out = b""
    for i, d in enumerate(deltas):
        last = finish and i == len(deltas) - 1
        obj = {"id": "x", "choices": [{"index": 0, "delta": d, "finish_reason": "length" if last else None}]}
        out += b"data: " + json.dumps(obj).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


DELTAS = [
    {"role": "assistant", "content": ""},
    {"reasoning": 'think "hard"\n'},
    {"reasoning": "\U0001f600"},
    {"content": "a\\b "},
    {"content": "caf\u00e9 \U0001f989"},
    {"content": "</end>"},
]


def test_reply_rebuilt_from_any_chunking_equals_the_aggregated_message():
    data = _sse(DELTAS)
    agg = Aggregator(chat=True)
    agg.feed(data)
    want = message_hash(7, agg.body()["choices"][0]["message"])
    for step in (1, 3, 7, len(data)):  # network chunks cut anywhere, even inside an escape
        reply, seen = Reply(), []
        patcher = StreamPatcher(
            patch_usage_chunk=False,
            drop_usage=False,
            make_kv=None,
            on_params=lambda p: None,
            reply=reply,
            on_finish=lambda seen=seen, reply=reply: seen.append(reply.message()),
        )
        for i in range(0, len(data), step):
            patcher.feed(data[i : i + step])
        msg = reply.message()
        assert msg == {
            "role": "assistant",
            "content": "a\\b caf\u00e9 \U0001f989</end>",
            "reasoning": 'think "hard"\n\U0001f600',
        }
        assert seen == [msg] and message_hash(7, msg) == want


def test_reply_with_ascii_escapes_and_tool_calls():
    raw = (
        b'data: {"choices":[{"index":0,"delta":{"content":"\\u00e9\\ud83e\\udd89"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function",'
        b'"function":{"name":"get","arguments":"{\\"content\\": "}}]}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}\n\n'
    )
    reply = Reply()
    reply.feed(raw)
    assert reply.message() == {
        "role": "assistant",
        "content": "\u00e9\U0001f989",
        "tool_calls": [{"function": {"name": "get", "arguments": '{"content": 1}'}}],
    }
    bad = Reply()
    bad.feed(b'data: {"choices":[{"delta":{"tool_calls":[nope]}}]}\n')
    assert bad.message() is None
    unreadable = Reply()
    unreadable.feed(b'data: {"choices":[{"delta":{"content":"\\x"}}]}\n')
    assert unreadable.message() is None


def test_find_check_and_served():
    t = PrefixTable()
    turn0 = chain([U("q0")])
    t.served("s", turn0, A("a0"))
    assert t.find(turn0) is None  # the same request again is not a continuation
    nxt = chain([U("q0"), A("a0"), U("q1")])
    assert t.find(nxt) == "s" and t.check("s", nxt) == (sc.CONTINUITY_EXTENDS, None)
    stripped = chain([U("q0"), A("a0-"), U("q1")])
    assert t.find(stripped) == "s" and t.check("s", stripped) == (sc.CONTINUITY_DIVERGED, 1)
    assert t.check("s", turn0) == (sc.CONTINUITY_EXTENDS, None)  # a retry of the served request
    assert t.check("s", chain([U("other")])) == (sc.CONTINUITY_REUSED_ID, 0)  # nothing in common: another conversation
    assert t.check("nobody", nxt) == (sc.CONTINUITY_NEW, None)
    t.served("s", nxt, A("a1"))  # the next turn replaces the record and its index entries
    assert t.find(chain([U("q0"), A("a0"), U("q1"), A("a1"), U("q2")])) == "s"
    assert t.find(chain([U("q0"), A("a0"), U("zz")])) is None  # turn 0's ends are no longer indexed
    t.served("t", chain([U("q0"), A("a0"), U("q1")]), None)  # reply unknown: found by the request end only
    assert len(t) == 2 and t.health()["prefix_index"] == 2  # "t" took over the shared request-end entry
    assert t.find(chain([U("q0"), A("a0"), U("q1"), A("other"), U("q2")])) == "t"  # the newest owner wins


def test_longest_prefix_wins():
    t = PrefixTable()
    t.served("short", chain([U("a")]), A("b"))
    t.served("long", chain([U("a"), A("b"), U("c")]), A("d"))
    assert t.find(chain([U("a"), A("b"), U("c"), A("d"), U("e")])) == "long"
    assert t.find(chain([U("a"), A("b"), U("x")])) == "short"
    t.served("other", chain([U("a")]), A("b"))  # the same served turn again: the newest owner wins
    assert t.find(chain([U("a"), A("b"), U("x")])) == "other"
    assert t.find(chain([U("a"), A("b"), U("c"), A("d"), U("e")])) == "long"


def test_bounds_entries_and_bytes_with_counted_evictions():
    t = PrefixTable(max_sessions=3)
    for i in range(5):
        t.served(f"s{i}", chain([U(str(i))]), A("x"))
    assert len(t) == 3 and t.evicted_lru == 2 and t.health()["prefix_index"] == 6
    assert (
        t.check("s0", chain([U("0")]))[0] == sc.CONTINUITY_NEW
        and t.check("s4", chain([U("4")]))[0] != sc.CONTINUITY_NEW
    )
    t.check("s2", chain([U("2")]))  # touched: s3 is now the least recently used
    t.served("s5", chain([U("5")]), A("x"))
    assert (
        t.check("s3", chain([U("3")]))[0] == sc.CONTINUITY_NEW
        and t.check("s2", chain([U("2")]))[0] != sc.CONTINUITY_NEW
    )
    small = PrefixTable(max_bytes=2000)
    long = chain([U(str(i)) for i in range(100)])  # 800 B of hashes alone
    small.served("a", long, A("x"))
    small.served("b", long, A("x"))
    assert len(small) == 1 and small.nbytes <= 2000 and small.evicted_lru == 1
    small.served("huge", chain([U(str(i)) for i in range(400)]), None)  # alone above the bound: not kept
    assert small.evicted_lru == 2 and small.check("huge", [])[0] == sc.CONTINUITY_NEW


def test_no_text_is_kept():
    secret = "the launch code is 1234 " * 10
    t = PrefixTable()
    t.served("s", chain([U(secret)]), A(secret + " reply"))
    gc.collect()
    seen, stack = set(), [t]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, type):
            continue
        seen.add(id(o))
        assert not (isinstance(o, (str, bytes)) and "launch" in str(o))
        if isinstance(o, (str, bytes, int, float)):
            continue
        stack.extend(gc.get_referents(o))


_RSS_SCRIPT = textwrap.dedent("""
    import gc, json, resource, sys
    from kvtrace.proxy.prefix_table import PrefixTable, chain, new_session_id

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()

    def feed(t, n, tag):
        sysmsg = {"role": "system", "content": "you are a coding agent " * 20}
        for i in range(n):
            msgs = [sysmsg, {"role": "user", "content": f"{tag} task {i}"}, {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": f"run {i}"}]
            key = new_session_id()
            t.find(chain(msgs))
            t.check(key, chain(msgs))
            t.served(key, chain(msgs), {"role": "assistant", "content": f"done {i}"})

    gc.collect(); base = rss()
    bounded = PrefixTable(max_sessions=100_000, max_bytes=4 * 1024 * 1024)
    feed(bounded, 100_000, "b")
    gc.collect(); after_bounded = rss()
    full = PrefixTable(max_sessions=100_000, max_bytes=10**9)
    feed(full, 100_000, "f")
    gc.collect(); after_full = rss()
    print(json.dumps({"base": base, "bounded": after_bounded - base, "full": after_full - after_bounded,
                      "bounded_len": len(bounded), "bounded_bytes": bounded.nbytes,
                      "bounded_evicted": bounded.evicted_lru,
                      "bounded_index": len(bounded._index), "full_len": len(full), "full_bytes": full.nbytes,
                      "full_index": len(full._index)}))
""")


def test_table_stays_within_bounds_under_100k_sessions_rss_measured():
    out = subprocess.run([sys.executable, "-c", _RSS_SCRIPT], capture_output=True, text=True, timeout=300, check=True)
    r = json.loads(out.stdout)
    mib = 1024 * 1024
    # the byte bound holds: fewer sessions kept, every other one evicted and counted, index in step
    assert r["bounded_bytes"] <= 4 * mib and r["bounded_len"] + r["bounded_evicted"] == 100_000
    assert r["bounded_len"] < 100_000 and r["bounded_index"] == 2 * r["bounded_len"]
    assert r["bounded"] <= 4 * mib + 6 * mib, r  # RSS grew by the bound plus allocator slack
    # unbounded by bytes: 100k sessions kept, and the accounted bytes cover what RSS shows
    assert r["full_len"] == 100_000 and r["full_index"] == 200_000
    assert r["full"] <= r["full_bytes"] * 1.25 + 6 * mib, r
    print(
        f"RSS: bounded {r['bounded'] / mib:.1f} MiB for {r['bounded_len']} kept of 100k "
        f"(bound 4 MiB); full {r['full'] / mib:.1f} MiB, accounted {r['full_bytes'] / mib:.1f} MiB"
    )


def test_new_session_ids_are_prefixed_and_distinct():
    ids = {prefix_table.new_session_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith(sc.PREFIX_SESSION_PREFIX) for i in ids)


# what the reply's pattern was before it took a run of plain bytes at a time (a byte at a time,
# backtracking): the two must find the same strings in any bytes
_BYTE_AT_A_TIME = re.compile(rb'"(content|reasoning_content|reasoning)"\s*:\s*"((?:[^"\\]|\\.)*)"')


_PARTS = [b'"content"', b'"reasoning":', b":", b" ", b'"', b"\\", b'\\"', b"ab", b"\n", b"\xc3\xa9"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PARTS)))
def test_the_reply_pattern_finds_what_the_byte_at_a_time_one_did(parts):
    data = b"".join(parts)
    assert prefix_table._DELTA.findall(data) == _BYTE_AT_A_TIME.findall(data)
