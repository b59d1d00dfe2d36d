"""The prefix table: which session a request continues, and whether it extends what was served.

For each session the proxy keeps the identity (:mod:`.identity`) of the last turn it served and
never its text: its kind and header hash, one chained 64-bit hash per position (a chat message; a
turn's part of a completions prompt, with the offset where it ends), then the reply D streamed.
Two prompts agree up to position ``i`` exactly when their ``h[i]`` agree.

- :meth:`PrefixTable.find`: a chat request without a session id continues the session whose last
  served turn (its request messages, or those plus the reply) is a proper prefix of its messages;
  the longest such prefix wins.  Each chat session is indexed under those two hashes, so a lookup
  is at most one dict probe per message.
- :meth:`PrefixTable.check`: a turn of a known session ``extends`` (it starts with the whole last
  served turn, reply included, or repeats that turn's request exactly: a retry, whose prompt is a
  prefix of what D holds), is ``unknown`` (it goes past a served request whose reply the proxy
  could not read: n > 1, token ids, an unreadable stream), ``diverged`` (position ``i`` differs or
  is missing, or the header changed: position 0), ``reused_id`` (nothing in common with the served
  turn from its first position, or another kind of request: another conversation under the same
  id) or is ``new`` (nothing recorded).
- :meth:`PrefixTable.served`: record a turn once D's answer finished, unless a newer turn (by the
  conversation table's turn index, assigned when a request starts) is recorded already: an older
  turn finishing late changes neither table.  :meth:`PrefixTable.turn` says which turn the record
  is; the proxy offers D's blocks only when they are that turn's.

The reply is rebuilt from D's stream by :class:`Reply` at the cost of one compiled-regex scan per
network chunk (kept only while prefix matching is on).

Bounds: at most ``max_sessions`` sessions and about ``max_bytes`` bytes, least recently used
first out (:attr:`PrefixTable.evicted_lru`; ``on_evict`` tells the conversation table, which drops
the session's entry: the two tables are evicted together).  A session costs
:data:`SESSION_OVERHEAD` bytes plus its key, 8 bytes per position of its last turn (16 for text /
ids: the offset too) and :data:`INDEX_OVERHEAD` per index entry (measured with tracemalloc,
rounded up).  Everything runs on the proxy's event loop without awaiting, so each call is atomic.
"""

from __future__ import annotations

import re
import sys
import uuid
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from kvtrace import jsoncodec as codec
from kvtrace import semconv as sc
from kvtrace.proxy import identity
from kvtrace.proxy.identity import Prompt, chain, message_hash

__all__ = ["PrefixTable", "Reply", "chain", "message_hash", "new_session_id"]

# tracemalloc on CPython 3.11: ~190 B per session (record, array header, OrderedDict slot) and
# ~75 B per index entry (the int key and its dict slot); rounded up for the dicts' spare room
SESSION_OVERHEAD = 256
INDEX_OVERHEAD = 100
HASH_BYTES = 8  # one array('q') item per message

# a JSON string's body, a run of plain bytes at a time rather than a byte at a time (an alternation per
# byte was most of the proxy's reading of D's stream: docs/benchmarks.md); possessive, so a string no
# quote closes fails at once instead of trying every way to split its runs
_STRING = rb'"((?:[^"\\]++|\\.)*+)"'
_DELTA = re.compile(rb'"(content|reasoning_content|reasoning)"\s*:\s*' + _STRING)
_TEXT = re.compile(rb'"(text)"\s*:\s*' + _STRING)  # a /v1/completions chunk's choice text
_TOOL_CALLS = b'"tool_calls"'


class Reply:
    """The assistant message of a streamed chat answer (``text``: the text of a streamed
    completion), rebuilt from D's SSE bytes.

    :meth:`feed` gets the complete lines of each network chunk: one regex scan collects the raw
    JSON-string bodies of ``content`` / ``reasoning`` deltas (decoded once, at the end); lines with
    tool calls are decoded as JSON.  ``bad`` when something could not be read (the turn is then
    recorded without its reply)."""

    __slots__ = ("content", "reasoning", "tools", "bad", "text")

    def __init__(self, text: bool = False) -> None:
        self.content: list[bytes] = []
        self.reasoning: list[bytes] = []
        self.tools: dict[int, list] | None = None
        self.bad = False
        self.text = text

    def feed(self, data: bytes) -> None:
        content, reasoning = self.content, self.reasoning
        for key, value in (_TEXT if self.text else _DELTA).findall(data):
            if value:
                (reasoning if key == b"reasoning" or key == b"reasoning_content" else content).append(value)
        if not self.text and _TOOL_CALLS in data:
            self._tool_lines(data)

    def _tool_lines(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if _TOOL_CALLS not in line:
                continue
            try:
                obj: Any = codec.loads(line.strip()[len(b"data:") :])  # not a dict: AttributeError below
                for choice in obj.get("choices") or ():
                    for tc in (choice.get("delta") or {}).get("tool_calls") or ():
                        self._tool(tc)
            except (ValueError, TypeError, AttributeError, RecursionError):
                self.bad = True

    def _tool(self, tc: dict) -> None:
        tools = self.tools if self.tools is not None else {}
        self.tools = tools
        slot = tools.setdefault(tc.get("index", len(tools)), ["", []])
        fn = tc.get("function") or {}
        slot[0] += fn.get("name") or ""
        slot[1].append(fn.get("arguments") or "")

    def message(self) -> dict | str | None:
        """The assistant message (role, content, reasoning, tool_calls; the text of a completion),
        or None if unreadable."""
        if self.bad:
            return None
        if self.text:
            try:
                return _join(self.content)
            except (ValueError, UnicodeDecodeError):
                return None
        try:
            msg: dict[str, object] = {"role": "assistant", "content": _join(self.content)}
            if self.reasoning:
                msg["reasoning"] = _join(self.reasoning)
        except (ValueError, UnicodeDecodeError):
            return None
        if self.tools:
            msg["tool_calls"] = [
                {"function": {"name": name, "arguments": "".join(args)}}
                for _, (name, args) in sorted(self.tools.items())
            ]
        return msg


def _join(parts: list[bytes]) -> str:
    return cast(str, codec.loads(b'"' + b"".join(parts) + b'"')) if parts else ""  # a JSON string


def new_session_id() -> str:
    """A session id the proxy names for a chat that came without one."""
    return sc.PREFIX_SESSION_PREFIX + uuid.uuid4().hex[:16]


@dataclass(slots=True)
class _Record:
    chain: array  # chain hashes of the last served turn: its request's positions, then the reply if known
    n_request: int  # positions of the request
    turn: int | None  # the conversation table's index of that turn (None: not known)
    kind: str  # identity.KIND_*
    header: int  # hash of what else renders the prompt (identity.Prompt.header)
    ends: array | None  # text / ids: where each position ends (characters / tokens)


def _prompt(p: Prompt | list[int]) -> Prompt:
    """A :class:`~kvtrace.proxy.identity.Prompt`; a bare chain stands for chat messages alone."""
    return p if isinstance(p, Prompt) else Prompt(identity.KIND_CHAT, 0, list(p))


class PrefixTable:
    """``on_evict(key)`` runs for each session it drops to stay within its bounds (the proxy drops
    the conversation table's entry with it: D's blocks of a turn it can no longer check)."""

    def __init__(
        self, max_sessions: int = 100_000, max_bytes: int = 64 * 1024 * 1024, on_evict: Callable | None = None
    ) -> None:
        self.max_sessions = int(max_sessions)
        self.max_bytes = int(max_bytes)
        self.on_evict = on_evict
        self._sessions: OrderedDict[str, _Record] = OrderedDict()
        self._index: dict[int, str] = {}
        self.nbytes = 0
        self.evicted_lru = 0
        self.stale_turns = 0  # turns that finished after a newer turn of their session was recorded

    def __len__(self) -> int:
        return len(self._sessions)

    def health(self) -> dict:
        return {
            "prefix_sessions": len(self._sessions),
            "prefix_index": len(self._index),
            "prefix_table_bytes": self.nbytes,
            "prefix_evicted_lru": self.evicted_lru,
            "prefix_stale_turns": self.stale_turns,
        }

    # ------------------------------------------------------------------ lookups
    def find(self, hashes: list[int]) -> str | None:
        """The session whose last served turn is the longest proper prefix of ``hashes``."""
        index = self._index
        for j in range(len(hashes) - 2, -1, -1):
            key = index.get(hashes[j])
            if key is not None:
                return key
        return None

    def turn(self, key: str) -> int | None:
        """The turn index of session ``key``'s record (None: no record, or its turn is unknown)."""
        rec = self._sessions.get(key)
        return rec.turn if rec is not None else None

    def check(self, key: str, prompt: Prompt | list[int]) -> tuple[str, int | None]:
        """``(continuity, diverged_at)`` of a turn of session ``key`` (a text / ids prompt is cut
        at the record's offsets on the way)."""
        rec = self._sessions.get(key)
        if rec is None:
            return sc.CONTINUITY_NEW, None
        self._sessions.move_to_end(key)
        p = _prompt(prompt)
        if p.kind != rec.kind:
            return sc.CONTINUITY_REUSED_ID, 0  # another kind of request renders other tokens from the start
        if rec.ends is not None:
            p.cut(rec.ends)
        hashes = p.hashes
        served, m, n = rec.chain, len(hashes), rec.n_request
        first = _first_difference(served, hashes)
        if first == 0 and (served or hashes):
            return sc.CONTINUITY_REUSED_ID, 0  # nothing in common with the served turn
        if p.header != rec.header:
            return sc.CONTINUITY_DIVERGED, 0  # tools / template / model changed: other tokens from the start
        if m == n and first >= m:
            return sc.CONTINUITY_EXTENDS, None  # a retry: its prompt is a prefix of what D holds
        if first == len(served):
            return (sc.CONTINUITY_EXTENDS, None) if len(served) > n else (sc.CONTINUITY_UNKNOWN, None)
        return sc.CONTINUITY_DIVERGED, first

    # ------------------------------------------------------------------ updates
    def served(self, key: str, prompt: Prompt | list[int], reply: dict | str | None, turn: int | None = None) -> bool:
        """Turn ``turn`` of session ``key`` was answered with ``reply`` (None: unknown).  Not
        recorded when a newer turn of the session already was (``stale_turns``), or when the
        record alone exceeds the byte bound (the session is then dropped: ``on_evict``)."""
        p = _prompt(prompt)
        old = self._sessions.get(key)
        if old is not None and turn is not None and old.turn is not None and old.turn > turn:
            self.stale_turns += 1
            return False
        full = array("q", p.hashes)
        ends = array("q", p.ends) if p.ends is not None else None
        tail = p.reply_hash(reply) if reply is not None and p.reply_known else None
        if tail is not None:
            full.append(tail[0])
            if ends is not None:
                ends.append((ends[-1] if ends else 0) + tail[1])
        if old is not None:
            del self._sessions[key]
            self._forget(key, old)
        rec = _Record(full, len(p.hashes), turn, p.kind, p.header, ends)
        cost = self._cost(key, rec)
        if cost > self.max_bytes:
            self._evicted(key)
            return False
        self._sessions[key] = rec
        self.nbytes += cost
        if rec.kind == identity.KIND_CHAT:  # id-less requests are matched to chat sessions only
            for h in self._ends(rec):
                self._index[h] = key
        self._bound()
        return True

    def forget(self, key: str) -> None:
        """Drop session ``key`` (the conversation table evicted it)."""
        rec = self._sessions.pop(key, None)
        if rec is not None:
            self._forget(key, rec)

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _ends(rec: _Record) -> tuple:
        """The hashes a session is found under: its request's end and, with a reply, the reply's."""
        c, n = rec.chain, rec.n_request
        if not n or rec.kind != identity.KIND_CHAT:
            return ()
        return (c[n - 1], c[-1]) if len(c) > n else (c[n - 1],)

    @staticmethod
    def _cost(key: str, rec: _Record) -> int:
        ends = len(PrefixTable._ends(rec))
        offsets = HASH_BYTES * len(rec.ends) if rec.ends is not None else 0
        return SESSION_OVERHEAD + sys.getsizeof(key) + HASH_BYTES * len(rec.chain) + offsets + INDEX_OVERHEAD * ends

    def _forget(self, key: str, rec: _Record) -> None:
        self.nbytes -= self._cost(key, rec)
        index = self._index
        for h in self._ends(rec):
            if index.get(h) == key:
                del index[h]

    def _evicted(self, key: str) -> None:
        self.evicted_lru += 1
        if self.on_evict is not None:
            self.on_evict(key)

    def _bound(self) -> None:
        sessions = self._sessions
        while (len(sessions) > self.max_sessions or self.nbytes > self.max_bytes) and len(sessions) > 1:
            key, rec = sessions.popitem(last=False)
            self._forget(key, rec)
            self._evicted(key)


def _first_difference(served: array, hashes: list[int]) -> int:
    """Index of the first position where the two chains differ (the shorter length if none)."""
    k = min(len(served), len(hashes))
    if not k or served[k - 1] == hashes[k - 1]:
        return k
    lo, hi = 0, k - 1  # chains agree up to i iff they agree at i: binary search the first difference
    while lo < hi:
        mid = (lo + hi) // 2
        if served[mid] == hashes[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo
