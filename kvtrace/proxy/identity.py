"""What determines a prompt's tokens, as the proxy sees it without a tokenizer: one :class:`Prompt`
per request of any kind it forwards, compared with the session's last served turn by
:mod:`.prefix_table` before D's blocks are offered.

A prompt is a *kind* (``chat``; ``text`` or ``ids``: a /v1/completions prompt as a string or as
token ids; ``opaque``: a batch of prompts or prompt embeddings, compared whole), a *header* and
*positions*, each with a chained hash (``h[i] = hash((h[i-1], position i))``), so two prompts agree
up to position ``i`` exactly when their ``h[i]`` agree:

- **header**: everything besides the messages that the chat template renders or the tokenizer
  reads: ``model`` (another model, or LoRA adapter, means other KV), ``tools``, ``chat_template``,
  ``chat_template_kwargs``, ``add_generation_prompt``, ``continue_final_message``, ``documents``,
  ``add_special_tokens``.  Templates render tools before the first message, so a header that
  changed changes the tokens from the start.
- **chat positions**: one per message (:func:`message_hash`): role; content (a string; a list of
  text parts joined with ``"\\n"``, as vLLM joins them for string-format templates, so the
  renderings that are equal hash equal; else the parts' JSON); reasoning (``reasoning``, else
  ``reasoning_content``); tool calls (function name and arguments).  Names and tool-call ids are
  ignored.
- **text / ids positions**: a completions prompt is one string (or token list) with no message
  boundaries, so it is cut where the session's record was cut (:meth:`Prompt.cut`): at the end of
  each earlier turn's prompt and reply, then the rest.  The record keeps those offsets (characters
  or tokens), never the text.

``reply_known``: the proxy can read back what D generated for this request (one choice, no
``echo``, not token ids: a token-id prompt's continuation is made of ids the response does not
carry).  Without it a next turn that goes past this request cannot be checked against D's blocks.
CPython's ``hash`` of text is SipHash with a per-process key, so collisions cannot be forged from
outside.
"""

from __future__ import annotations

from kvtrace import jsoncodec as codec

KIND_CHAT = "chat"
KIND_TEXT = "text"
KIND_IDS = "ids"
KIND_OPAQUE = "opaque"

CHAT_HEADER = (
    "model",
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "documents",
    "add_special_tokens",
)
TEXT_HEADER = ("model", "add_special_tokens")


def _text(value: object) -> object:
    """A message's content as a string-format chat template sees it: text parts joined with a
    newline (vLLM's ``_parse_chat_message_content_parts``), else the JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value
    ):
        return "\n".join(p["text"] for p in value)
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


def _header(kind: str, body: dict, fields: tuple) -> int:
    present = [(f, body[f]) for f in fields if body.get(f) is not None]
    return hash((kind, codec.dumps(present))) if present else hash(kind)


class Prompt:
    """One request's identity: ``kind``, ``header``, ``hashes`` (one per position) and, for text /
    ids, ``ends`` (the offset where each position ends) and the prompt itself until it is served."""

    __slots__ = ("kind", "header", "hashes", "ends", "units", "reply_known")

    def __init__(self, kind: str, header: int, hashes: list[int], units=None, reply_known: bool = True) -> None:
        self.kind, self.header, self.hashes, self.units, self.reply_known = kind, header, hashes, units, reply_known
        self.ends: list[int] | None = None if units is None else [len(units)]

    def cut(self, ends) -> None:
        """Text / ids: recompute the positions at a record's ``ends`` (those within the prompt),
        then the rest of the prompt as one more position."""
        units = self.units
        if units is None:
            return
        hashes, mine, h, start, n = [], [], 0, 0, len(units)
        for e in ends:
            if e > n:
                break
            h = hash((h, units[start:e] if self.kind == KIND_TEXT else tuple(units[start:e])))
            hashes.append(h)
            mine.append(e)
            start = e
        if start < n or not mine:
            hashes.append(hash((h, units[start:] if self.kind == KIND_TEXT else tuple(units[start:]))))
            mine.append(n)
        self.hashes, self.ends = hashes, mine

    def reply_hash(self, reply: object) -> tuple[int, int] | None:
        """The chain hash of D's reply after this prompt, and its length in units (None: unknown)."""
        prev = self.hashes[-1] if self.hashes else 0
        if self.kind == KIND_CHAT:
            return (message_hash(prev, reply), 0) if isinstance(reply, dict) else None
        if self.kind == KIND_TEXT and isinstance(reply, str):
            return hash((prev, reply)), len(reply)
        return None


def chat(body: dict) -> Prompt:
    """A /v1/chat/completions request (messages already validated)."""
    return Prompt(KIND_CHAT, _header(KIND_CHAT, body, CHAT_HEADER), chain(body["messages"]), None, _one(body))


def completion(body: dict) -> Prompt:
    """A /v1/completions request (prompt already validated: a string or a non-empty list)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one is that prompt
    one = _one(body) and not body.get("echo")
    if body.get("prompt_embeds") is None:
        if isinstance(prompt, str):
            p = Prompt(KIND_TEXT, _header(KIND_TEXT, body, TEXT_HEADER), [], prompt, one)
            p.cut(())
            return p
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            p = Prompt(KIND_IDS, _header(KIND_IDS, body, TEXT_HEADER), [], prompt, False)
            p.cut(())
            return p
    raw = codec.dumps([prompt, body.get("prompt_embeds")])
    return Prompt(KIND_OPAQUE, _header(KIND_OPAQUE, body, TEXT_HEADER), [hash(raw)], None, False)


def _one(body: dict) -> bool:
    return (body.get("n") or 1) == 1 and (body.get("best_of") or 1) == 1
