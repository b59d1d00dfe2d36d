"""Server-sent-event handling of D's stream: a pass-through patcher and a non-streaming aggregator.

:class:`StreamPatcher` is the fast path.  The handler feeds it each network chunk from D and
writes what it returns to the client.  Bytes are split at the last newline only; a chunk whose
complete lines cannot carry a ``finish_reason``/``usage`` value or an ``error`` (one compiled regex
search) is returned untouched.  Otherwise only the lines holding a match are cut out and handled;
the bytes between them pass through as slices.  Only those lines are JSON-decoded: the finish chunk yields D's
``kv_transfer_params`` (handed to ``on_params`` so the conversation table learns where D's blocks
live), the usage chunk yields token counts, and the target chunk gets the ``kv_transfer`` object.
When the proxy asked D for usage the client did not ask for, that usage-only chunk is dropped.
With prefix matching on, a :class:`~kvtrace.proxy.prefix_table.Reply` also sees each chunk's complete
lines (one more regex scan) and ``on_finish`` runs once, at the first ``finish_reason``, before
the bytes holding it go to the client (so a next turn cannot arrive before the proxy recorded it).
A line the proxy must read that is not an OpenAI chunk (not a JSON object, ``choices`` not a list,
a ``finish_reason`` that is not a string, ``usage`` or ``kv_transfer_params`` not an object) raises
:class:`InvalidChunk`: the handler then ends the client's stream with an SSE error event.
Incomplete lines are kept as a list of pieces and joined once, so a line split over many network
chunks costs linear, not quadratic, time.

:class:`Aggregator` rebuilds a normal (non-streaming) OpenAI response from D's stream for
clients that asked ``stream: false`` (D's leg always streams, as upstream); any chunk it cannot
read raises :class:`InvalidChunk`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from kvtrace import semconv as sc
from kvtrace.jsoncodec import dumps, loads

# a line that may need handling: a non-null finish_reason / usage value, or an error object
_CANDIDATE = re.compile(rb'"(?:finish_reason|usage)"\s*:\s*(?!null)|"error"')
_DATA = b"data:"
_DONE = b"[DONE]"


class InvalidChunk(ValueError):
    """D sent a line the proxy must read that is not an OpenAI stream chunk (``passed``: the bytes
    of the same network chunk before that line, still due to the client)."""

    passed = b""


def sse_event(obj: object) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def _decode(line: bytes) -> dict | None:
    """JSON object of a ``data:`` line; None for other lines and [DONE]; InvalidChunk if not an object."""
    s = line.strip()
    if not s.startswith(_DATA):
        return None
    payload = s[len(_DATA) :].strip()
    if not payload or payload == _DONE:
        return None
    try:
        obj = loads(payload)
    except (ValueError, RecursionError):
        raise InvalidChunk("data line is not JSON") from None
    if not isinstance(obj, dict):
        raise InvalidChunk("data line is not a JSON object")
    return obj


class _Lines:
    """Split a byte stream at newlines; keep the pieces of the incomplete last line."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.done = False

    def complete(self, chunk: bytes) -> bytes:
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            if chunk:
                self.pieces.append(chunk)
            return b""
        if self.pieces:
            self.pieces.append(chunk[:cut])
            out = b"".join(self.pieces)
            self.pieces = [chunk[cut:]] if cut < len(chunk) else []
        elif cut < len(chunk):
            out = chunk[:cut]
            self.pieces = [chunk[cut:]]
        else:
            out = chunk
        if _DONE in out:
            self.done = True
        return out

    def take_tail(self) -> bytes:
        tail, self.pieces = b"".join(self.pieces), []
        return tail


def _finish_reasons(obj: dict) -> list[str]:
    choices = obj.get("choices")
    if choices is None:
        return []
    if not isinstance(choices, list):
        raise InvalidChunk("choices is not a list")
    reasons = []
    for c in choices:
        r = c.get("finish_reason") if isinstance(c, dict) else None
        if r:
            if not isinstance(r, str):
                raise InvalidChunk("finish_reason is not a string")
            reasons.append(r)
    return reasons


class StreamPatcher:
    """Pass D's SSE stream through, capturing metadata and patching the target chunk.

    ``patch_usage_chunk``: the client asked for ``include_usage``, so ``kv_transfer`` goes on the
    usage chunk; otherwise on the chunk(s) carrying ``finish_reason``.  ``drop_usage``: the
    usage-only chunk was requested by the proxy and is removed.  ``make_kv`` (None = no patching)
    builds the object; it is called after ``on_params`` saw D's params.
    """

    def __init__(
        self,
        *,
        patch_usage_chunk: bool,
        drop_usage: bool,
        make_kv: Callable[[], dict] | None,
        on_params: Callable[[dict], None],
        reply=None,
        on_finish: Callable[[], None] | None = None,
    ) -> None:
        self.patch_usage_chunk = patch_usage_chunk
        self.drop_usage = drop_usage
        self.make_kv = make_kv
        self.on_params = on_params
        self.reply = reply  # kvtrace.proxy.prefix_table.Reply, or None (prefix matching off)
        self.on_finish = on_finish
        self.lines = _Lines()
        self.usage: dict | None = None
        self.finish_reasons: list[str] = []
        self.error: dict | None = None
        self._skip_blank = False

    @property
    def done(self) -> bool:
        return self.lines.done

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to send on for ``chunk``: its complete lines, with the candidate lines handled."""
        out = self.lines.complete(chunk)
        if self.reply is not None:
            self.reply.feed(out)
        pos = self._after_blank(out, 0) if self._skip_blank and out else 0
        m = _CANDIDATE.search(out, pos)
        if m is None:
            return out[pos:]
        parts = []
        while m is not None:
            start = out.rfind(b"\n", pos, m.start()) + 1 or pos
            end = out.find(b"\n", m.start()) + 1  # ``out`` ends with a newline
            parts.append(out[pos:start])
            try:
                parts.append(self._line(out[start:end]))
            except InvalidChunk as exc:
                exc.passed = b"".join(parts)  # the lines before the bad one, for the client
                raise
            pos = self._after_blank(out, end) if self._skip_blank and end < len(out) else end
            m = _CANDIDATE.search(out, pos)
        parts.append(out[pos:])
        return b"".join(parts)

    def flush(self) -> bytes:
        tail = self.lines.take_tail()
        return self.feed(tail + b"\n") if tail.strip() else b""

    def _after_blank(self, out: bytes, pos: int) -> int:
        """After a dropped usage chunk: skip the line at ``pos`` if it is blank (its SSE separator)."""
        self._skip_blank = False
        end = out.find(b"\n", pos) + 1
        return pos if out[pos:end].strip() else end

    def _line(self, line: bytes) -> bytes:
        if not _CANDIDATE.search(line):
            return line
        obj = _decode(line)
        if obj is None:
            return line
        if isinstance(obj.get("error"), dict):
            self.error = obj["error"]
            return line
        patch = False
        reasons = _finish_reasons(obj)
        if reasons:
            first = not self.finish_reasons
            self.finish_reasons.extend(reasons)
            params = obj.get("kv_transfer_params")
            if isinstance(params, dict):
                self.on_params(params)
            elif params is not None:
                raise InvalidChunk("kv_transfer_params is not an object")
            if first and self.on_finish is not None:
                self.on_finish()
            patch = not self.patch_usage_chunk
        usage = obj.get("usage")
        if usage is not None and not isinstance(usage, dict):
            raise InvalidChunk("usage is not an object")
        if isinstance(usage, dict):
            self.usage = usage
            if not obj.get("choices"):
                if self.drop_usage:
                    self._skip_blank = True
                    return b""
                patch = patch or self.patch_usage_chunk
        if not patch or self.make_kv is None:
            return line
        obj[sc.RESPONSE_KV_TRANSFER] = self.make_kv()
        return b"data: " + dumps(obj) + (b"\r\n" if line.endswith(b"\r\n") else b"\n")


class Aggregator:
    """Collect D's stream into a chat.completion / text_completion body."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.lines = _Lines()
        self.head: dict = {}
        self.choices: dict[int, dict] = {}
        self.usage: dict | None = None
        self.kv_params: dict | None = None
        self.error: dict | None = None
        self.finish_reasons: list[str] = []

    @property
    def done(self) -> bool:
        return self.lines.done

    def feed(self, chunk: bytes) -> None:
        for line in self.lines.complete(chunk).splitlines():
            obj = _decode(line)
            if obj is not None:
                try:
                    self._chunk(obj)
                except (TypeError, AttributeError, KeyError, ValueError) as exc:
                    raise InvalidChunk(f"unreadable chunk: {type(exc).__name__}") from None

    def flush(self) -> None:
        tail = self.lines.take_tail()
        if tail.strip():
            self.feed(tail + b"\n")

    def _chunk(self, obj: dict) -> None:
        if isinstance(obj.get("error"), dict):
            self.error = obj["error"]
            return
        if not self.head:
            self.head = {k: obj.get(k) for k in ("id", "created", "model", "system_fingerprint")}
        usage, params = obj.get("usage"), obj.get("kv_transfer_params")
        if usage is not None and not isinstance(usage, dict) or params is not None and not isinstance(params, dict):
            raise InvalidChunk("usage / kv_transfer_params is not an object")
        if usage is not None:
            self.usage = usage
        if params is not None:
            self.kv_params = params
        _finish_reasons(obj)  # validates choices and finish reasons
        for c in obj.get("choices") or ():
            if isinstance(c, dict):
                self._choice(c)

    def _choice(self, c: dict) -> None:
        idx = _index(c.get("index", 0))
        acc = self.choices.setdefault(idx, {"index": idx, "text": [], "reasoning": [], "tools": {}, "logprobs": None})
        if c.get("finish_reason"):
            acc["finish_reason"] = c["finish_reason"]
            self.finish_reasons.append(c["finish_reason"])
            if "stop_reason" in c:
                acc["stop_reason"] = c["stop_reason"]
        if self.chat:
            delta = c.get("delta") or {}
            acc["text"].append(_text(delta.get("content")))
            acc["reasoning"].append(_text(delta.get("reasoning_content") or delta.get("reasoning")))
            for tc in delta.get("tool_calls") or ():
                self._tool(acc["tools"], tc)
        else:
            acc["text"].append(_text(c.get("text")))
        lp = c.get("logprobs")
        if isinstance(lp, dict):
            acc["logprobs"] = _merge_logprobs(acc["logprobs"], lp)

    @staticmethod
    def _tool(tools: dict, tc: dict) -> None:
        slot = tools.setdefault(
            _index(tc.get("index", len(tools))), {"id": None, "type": "function", "name": "", "args": []}
        )
        slot["id"] = tc.get("id") or slot["id"]
        slot["type"] = tc.get("type") or slot["type"]
        fn = tc.get("function") or {}
        slot["name"] += _text(fn.get("name"))
        slot["args"].append(_text(fn.get("arguments")))

    def body(self) -> dict:
        choices = [self._final_choice(self.choices[i]) for i in sorted(self.choices)]
        out = {
            "id": self.head.get("id"),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.head.get("created"),
            "model": self.head.get("model"),
            "choices": choices,
            "usage": self.usage,
        }
        if self.head.get("system_fingerprint"):
            out["system_fingerprint"] = self.head["system_fingerprint"]
        out["kv_transfer_params"] = self.kv_params
        return out

    def _final_choice(self, acc: dict) -> dict:
        base = {"index": acc["index"], "logprobs": acc["logprobs"], "finish_reason": acc.get("finish_reason")}
        if "stop_reason" in acc:
            base["stop_reason"] = acc["stop_reason"]
        if not self.chat:
            return {**base, "text": "".join(acc["text"])}
        msg: dict = {"role": "assistant", "content": "".join(acc["text"])}
        reasoning = "".join(acc["reasoning"])
        if reasoning:
            msg["reasoning_content"] = reasoning
        if acc["tools"]:
            msg["tool_calls"] = [
                {"id": t["id"], "type": t["type"], "function": {"name": t["name"], "arguments": "".join(t["args"])}}
                for _, t in sorted(acc["tools"].items())
            ]
        return {**base, "message": msg}


def _text(v: object) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise InvalidChunk("text field is not a string")
    return v


def _index(v: object) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise InvalidChunk("index is not an integer")
    return v


def _merge_logprobs(acc: dict | None, lp: dict) -> dict:
    if acc is None:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in lp.items()}
    for k, v in lp.items():
        if isinstance(v, list) and isinstance(acc.get(k), list):
            acc[k].extend(v)
    return acc
