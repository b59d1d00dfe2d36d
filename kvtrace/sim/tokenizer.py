"""Deterministic, cheap stand-in tokenizer and chat template for the simulator.

The worker (:mod:`kvtrace.sim.worker`) tokenises prompts with :func:`encode`; the engine
(:mod:`kvtrace.sim.engine`) generates output with :func:`generate`.  Properties the KV model
relies on:

- the same text always gives the same ids (CRC32 of each piece, no per-process salt);
- text split at a piece boundary tokenises to a prefix: ``encode(a + b) == encode(a) +
  encode(b)`` when ``a`` ends in whitespace or a special token, so a conversation's turn N
  prompt starts with turn N-1's prompt + completion and prefix caching works across turns;
- generated pieces are ``"word "`` (trailing space), so a completion pasted back into the next
  prompt re-tokenises to exactly the generated ids.

Reasoning (a Qwen3-style thinking model behind vLLM's reasoning parser): with
``chat_template_kwargs.enable_thinking`` true, :func:`generate` starts the output with
``<|think|>``, :func:`reasoning_words` words of reasoning (:data:`REASONING_SHARE` of the output,
the share agent traces show) and ``<|end_think|>``; the worker streams the words as ``reasoning``
deltas and the tags as empty deltas.  :func:`render_chat` renders an assistant message's
``reasoning`` (else ``reasoning_content``, as vLLM passes both to the template) between the same
tags, so a client that sends the reasoning back extends what D holds and one that strips it does not.

A piece is a special token ``<|name|>``, a run of non-space characters with its trailing
whitespace, or leading whitespace.
"""

from __future__ import annotations

import re
import zlib
from collections import OrderedDict

VOCAB_SIZE = 100_000
_PIECE = re.compile(r"<\|[a-z_]+\|>|[^\s<]+\s*|<\s*|\s+")
_ids: dict[str, int] = {}
_WORDS = (
    "the of and to in is for on that with as it by at from this be are or an was which "
    "cache block token prefill decode transfer pull reuse latency agent turn tool model "
    "prompt context memory batch engine worker request stream result plan step check"
).split()
_GEN_PIECES = tuple(w + " " for w in _WORDS)

MEMO_TOKENS = 8_000_000  # token ids of recent chat messages kept (~110 MB with their text)
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK = "<|think|>"
END_THINK = "<|end_think|>"
_GENERATION_PROMPT = f"{IM_START}assistant\n"
REASONING_SHARE = 0.4  # of a thinking answer's tokens (agent traces: ~40 % of output is reasoning)


def piece_id(piece: str) -> int:
    tid = _ids.get(piece)
    if tid is None:
        tid = zlib.crc32(piece.encode()) % VOCAB_SIZE
        if len(_ids) < 1_000_000:
            _ids[piece] = tid
    return tid


_GEN_IDS = tuple(piece_id(p) for p in _GEN_PIECES)  # the generated words' ids


def _py_encode(text: str) -> list[int]:
    """Token ids of ``text``."""
    pieces = _PIECE.findall(text)
    try:
        return list(map(_ids.__getitem__, pieces))  # every piece seen before (nearly always)
    except KeyError:
        return [piece_id(p) for p in pieces]


try:  # the same ids in one C pass (kvtrace/sim/_ctok.c), where the extension was built
    from kvtrace.sim._ctok import encode as _c_encode
except ImportError:  # pragma: no cover - a build without a compiler
    _c_encode = None

#: which implementation :func:`encode` is: "c" or "python"
IMPLEMENTATION = "python" if _c_encode is None else "c"
#: token ids of a text
encode = _py_encode if _c_encode is None else _c_encode


class _Memo:
    """The ids of recently encoded texts, least recently used out first past ``max_tokens`` in all.

    Kept as tuples: the garbage collector stops tracking a tuple of ints once it has survived one
    collection, where every full collection would walk a list's millions of ids (docs/benchmarks.md)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens, self.tokens = max_tokens, 0
        self._ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def encode(self, text: str) -> tuple[int, ...]:
        ids = self._ids.get(text)
        if ids is not None:
            self._ids.move_to_end(text)
            return ids
        ids = self._ids[text] = tuple(encode(text))
        self.tokens += len(ids)
        while self.tokens > self.max_tokens and len(self._ids) > 1:
            self.tokens -= len(self._ids.popitem(last=False)[1])
        return ids


#: a chat request's messages, by their rendering: P and D encode the same prompt, and every turn of a
#: conversation repeats the ones before it
_MESSAGES = _Memo(MEMO_TOKENS)


def _render(m: dict) -> str:
    content = m.get("content")
    if isinstance(content, list):
        # vLLM's string-format templates see text parts joined with a newline (chat_utils)
        content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    reasoning = m.get("reasoning") or m.get("reasoning_content")
    think = f"{THINK}{reasoning}{END_THINK}" if isinstance(reasoning, str) and reasoning else ""
    return f"{IM_START}{m.get('role', 'user')}\n{think}{content or ''}{IM_END}\n"


def render_chat(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """ChatML-style template: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message,
    then ``<|im_start|>assistant\\n``.  List contents keep their ``text`` parts, joined with a newline."""
    out = [_render(m) for m in messages]
    if add_generation_prompt:
        out.append(_GENERATION_PROMPT)
    return "".join(out)


def encode_chat(messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """``encode(render_chat(messages, add_generation_prompt))``, a message at a time: each rendered
    message ends in ``<|im_end|>\\n``, where no piece can go on into the next one."""
    out: list[int] = []
    for m in messages:
        out += _MESSAGES.encode(_render(m))
    if add_generation_prompt:
        out += _MESSAGES.encode(_GENERATION_PROMPT)
    return out


def reasoning_words(n: int, thinking: bool) -> int:
    """Reasoning words of an ``n``-token answer (0 unless thinking and n >= 4: the tags and one
    content token must fit)."""
    if not thinking or n < 4:
        return 0
    return max(1, min(n - 3, round(REASONING_SHARE * n)))


def generate(seed: int, n: int, thinking: bool = False) -> tuple[list[int], list[str]]:
    """``n`` output token ids and their text pieces, a deterministic function of ``seed``;
    ``thinking``: ``<|think|>``, :func:`reasoning_words` words, ``<|end_think|>``, then the answer."""
    k = len(_GEN_PIECES)
    cycle = [(seed + i * 7919) % k for i in range(k)]  # word i + k is word i: (k * 7919) % k == 0
    reps = n // k + 1
    pieces = ([_GEN_PIECES[j] for j in cycle] * reps)[:n]
    r = reasoning_words(n, thinking)
    if r:
        pieces = [THINK, *pieces[:r], END_THINK, *pieces[r : n - 2]]
        return [piece_id(p) for p in pieces], pieces
    return ([_GEN_IDS[j] for j in cycle] * reps)[:n], pieces


def delta(i: int, piece: str, reasoning: int) -> tuple[str, str]:
    """The streamed delta of output piece ``i`` of an answer with ``reasoning`` reasoning words:
    (``reasoning`` or ``content``, its text); the think tags stream as empty deltas (vLLM's
    reasoning parser hides them)."""
    if not reasoning or i > reasoning + 1:
        return "content", piece
    if i == reasoning + 1:
        return "content", ""
    return "reasoning", piece if i else ""


def split(pieces: list[str]) -> tuple[str, str | None]:
    """(content, reasoning or None) of a whole answer."""
    if pieces and pieces[0] == THINK and END_THINK in pieces:
        end = pieces.index(END_THINK)
        return "".join(pieces[end + 1 :]), "".join(pieces[1:end])
    return "".join(pieces), None


def seed_for(prompt_ids: list[int], seed: int | None) -> int:
    """The request's ``seed`` if given, else a hash of the prompt (same prompt, same text)."""
    if seed is not None:
        return int(seed) & 0x7FFFFFFF
    return zlib.crc32(repr(prompt_ids[-64:]).encode() + str(len(prompt_ids)).encode())
