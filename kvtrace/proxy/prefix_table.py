"""The prefix table: which chat session a request continues, and whether it extends what was served.

For each chat session the proxy keeps the *chain hashes* of the last turn it served and never its
text: one 64-bit hash per message, each chained on the one before
(``h[i] = hash((h[i-1], role, content, reasoning, tool calls))``), the assistant reply it streamed
last.  Two message lists agree up to index ``i`` exactly when their ``h[i]`` agree (CPython's
``hash`` of text is SipHash with a per-process secret key, so collisions cannot be forged from
outside; by chance they are ~1e-9 likely among 100k sessions).

- :meth:`PrefixTable.find`: a request without a session id continues the session whose last
  served turn (its request messages, or those plus the reply) is a proper prefix of its messages;
  the longest such prefix wins.  Each session is indexed under those two hashes, so a lookup is at
  most one dict probe per message.
- :meth:`PrefixTable.check`: a turn of a known session ``extends`` (its messages start with the
  whole last served turn, reply included, or repeat that turn's request exactly: a retry, whose
  prompt is a prefix of what D holds), ``diverged`` (message ``i`` differs from the served turn or
  is missing: the prompt no longer extends what D holds) or is ``new`` (nothing recorded).
- :meth:`PrefixTable.served`: record a turn once D's answer finished.

Message identity (:func:`message_hash`): role; content (a string, a list of text parts joined, or
else its JSON); reasoning (``reasoning``, else ``reasoning_content``: what vLLM passes to the chat
template); tool calls (function name and arguments).  Names and tool-call ids are ignored.  The
reply is rebuilt from D's stream by :class:`Reply` at the cost of one compiled-regex scan per
network chunk (kept only while prefix matching is on).

Bounds: at most ``max_sessions`` sessions and about ``max_bytes`` bytes, least recently used
first out (:attr:`PrefixTable.evicted_lru`).  A session costs :data:`SESSION_OVERHEAD` bytes plus
its key, 8 bytes per message of its last turn and :data:`INDEX_OVERHEAD` per index entry (measured
with tracemalloc, rounded up).  Everything runs on the proxy's event loop without awaiting, so each
call is atomic.
"""

from __future__ import annotations

import re
import sys
import uuid
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, cast

from kvtrace import semconv as sc
from kvtrace.proxy import codec

# tracemalloc on CPython 3.11: ~190 B per session (record, array header, OrderedDict slot) and
# ~75 B per index entry (the int key and its dict slot); rounded up for the dicts' spare room
SESSION_OVERHEAD = 256
INDEX_OVERHEAD = 100
HASH_BYTES = 8  # one array('q') item per message

_DELTA = re.compile(rb'"(content|reasoning_content|reasoning)"\s*:\s*"((?:[^"\\]|\\.)*)"')
_TOOL_CALLS = b'"tool_calls"'


def _text(value: object) -> object:
    """A message's content as the chat template sees it: text parts joined, else the JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value
    ):
        return "".join(p["text"] for p in value)
    return codec.dumps(value)


def _tools(calls: object) -> tuple:
    if not isinstance(calls, list):
        return (codec.dumps(calls),)
    out: list[object] = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            out.append((_text(fn.get("name")), _text(fn.get("arguments"))))
        else:
            out.append(codec.dumps(c))
    return tuple(out)


def message_hash(prev: int, m: dict) -> int:
    """The chain hash of message ``m`` after ``prev`` (0 for the first message)."""
    content = m.get("content")
    reasoning = m.get("reasoning") or m.get("reasoning_content")
    calls = m.get("tool_calls")
    key = (
        prev,
        m.get("role"),
        content if type(content) is str else _text(content),
        "" if reasoning is None else _text(reasoning),
        _tools(calls) if calls else (),
    )
    try:
        return hash(key)
    except TypeError:  # an unhashable role: the message's JSON stands in
        return hash((prev, codec.dumps(m)))


def chain(messages: list) -> list[int]:
    """Chain hashes of ``messages`` (a validated list of dicts): O(messages + their text)."""
    out, h = [], 0
    for m in messages:
        h = message_hash(h, m)
        out.append(h)
    return out


class Reply:
    """The assistant message of a streamed chat answer, rebuilt from D's SSE bytes.

    :meth:`feed` gets the complete lines of each network chunk: one regex scan collects the raw
    JSON-string bodies of ``content`` / ``reasoning`` deltas (decoded once, at the end); lines with
    tool calls are decoded as JSON.  ``bad`` when something could not be read (the turn is then
    recorded without its reply)."""

    __slots__ = ("content", "reasoning", "tools", "bad")

    def __init__(self) -> None:
        self.content: list[bytes] = []
        self.reasoning: list[bytes] = []
        self.tools: dict[int, list] | None = None
        self.bad = False

    def feed(self, data: bytes) -> None:
        content, reasoning = self.content, self.reasoning
        for key, value in _DELTA.findall(data):
            if value:
                (content if key == b"content" else reasoning).append(value)
        if _TOOL_CALLS in data:
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

    def message(self) -> dict | None:
        """The assistant message (role, content, reasoning, tool_calls), or None if unreadable."""
        if self.bad:
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
    chain: array  # chain hashes of the last served turn: request messages, then the reply if known
    n_request: int  # messages of the request


class PrefixTable:
    def __init__(self, max_sessions: int = 100_000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_sessions = int(max_sessions)
        self.max_bytes = int(max_bytes)
        self._sessions: OrderedDict[str, _Record] = OrderedDict()
        self._index: dict[int, str] = {}
        self.nbytes = 0
        self.evicted_lru = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def health(self) -> dict:
        return {
            "prefix_sessions": len(self._sessions),
            "prefix_index": len(self._index),
            "prefix_table_bytes": self.nbytes,
            "prefix_evicted_lru": self.evicted_lru,
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

    def check(self, key: str, hashes: list[int]) -> tuple[str, int | None]:
        """``(continuity, diverged_at)`` of a turn of session ``key`` with chain ``hashes``."""
        rec = self._sessions.get(key)
        if rec is None:
            return sc.CONTINUITY_NEW, None
        self._sessions.move_to_end(key)
        served, m = rec.chain, len(hashes)
        first = _first_difference(served, hashes)
        if first == len(served) or (m == rec.n_request and first >= m):
            return sc.CONTINUITY_EXTENDS, None
        return sc.CONTINUITY_DIVERGED, first

    # ------------------------------------------------------------------ updates
    def served(self, key: str, hashes: list[int], reply: dict | None) -> None:
        """Turn ``hashes`` of session ``key`` was answered with ``reply`` (None: unknown)."""
        full = array("q", hashes)
        if reply is not None:
            full.append(message_hash(hashes[-1] if hashes else 0, reply))
        old = self._sessions.pop(key, None)
        if old is not None:
            self._forget(key, old)
        rec = _Record(full, len(hashes))
        cost = self._cost(key, rec)
        if cost > self.max_bytes:
            self.evicted_lru += 1
            return
        self._sessions[key] = rec
        self.nbytes += cost
        for h in self._ends(rec):
            self._index[h] = key
        self._bound()

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _ends(rec: _Record) -> tuple:
        """The hashes a session is found under: its request's end and, with a reply, the reply's."""
        c, n = rec.chain, rec.n_request
        if not n:
            return ()
        return (c[n - 1], c[-1]) if len(c) > n else (c[n - 1],)

    @staticmethod
    def _cost(key: str, rec: _Record) -> int:
        ends = 2 if len(rec.chain) > rec.n_request else 1
        return SESSION_OVERHEAD + sys.getsizeof(key) + HASH_BYTES * len(rec.chain) + INDEX_OVERHEAD * ends

    def _forget(self, key: str, rec: _Record) -> None:
        self.nbytes -= self._cost(key, rec)
        index = self._index
        for h in self._ends(rec):
            if index.get(h) == key:
                del index[h]

    def _bound(self) -> None:
        sessions = self._sessions
        while (len(sessions) > self.max_sessions or self.nbytes > self.max_bytes) and len(sessions) > 1:
            key, rec = sessions.popitem(last=False)
            self._forget(key, rec)
            self.evicted_lru += 1


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
