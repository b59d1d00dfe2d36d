"""The simulator's tokenizer in C (``kvtrace.sim._ctok``) gives the Python reference's ids
(``tokenizer._PIECE`` split, ``zlib.crc32 % VOCAB_SIZE`` per piece) on any text, and the same error."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.sim import tokenizer

# every class the regex tells apart: special tokens and near-misses, Unicode whitespace that is not
# ASCII (U+0085, U+00A0, U+2028, U+3000, the separators U+001C-U+001F), multi-byte text
ALPHABET = ["<", "|", ">", "a", "z", "_", "A", "0", " ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f"]
ALPHABET += ["\x85", "\xa0", "\u1680", "\u2000", "\u200b", "\u2028", "\u3000", "é", "字", "😀", "<|", "|>"]
ALPHABET += ["<|im_start|>", "<|end_think|>", "<|A|>", "<||>", "<|a b|>", "word ", "x<y"]


@pytest.fixture(scope="module")
def c_encode():
    from support.require import require_vllm

    # the README's test command (KVTRACE_REQUIRE_VLLM=1) builds the extension: fail there, skip elsewhere
    return require_vllm("kvtrace.sim._ctok").encode


def _reference(text: str) -> list[int]:
    return [zlib.crc32(p.encode()) % tokenizer.VOCAB_SIZE for p in tokenizer._PIECE.findall(text)]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join))
def test_c_ids_are_the_regex_and_crc32_ids(c_encode, text):
    assert c_encode(text) == _reference(text) == tokenizer._py_encode(text)


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(exclude_categories=["Cs"]), max_size=60))
def test_c_ids_match_on_any_unicode_text(c_encode, text):
    assert c_encode(text) == _reference(text)


def test_a_chat_prompt_and_a_long_text(c_encode):
    prompt = tokenizer.render_chat([{"role": "user", "content": "Hi <there>\u00a0 friend"}])
    assert c_encode(prompt) == _reference(prompt)
    assert len(c_encode(prompt)) == len(tokenizer._PIECE.findall(prompt)) == 10
    long = "cache block\u3000token\n\n " * 50_000
    assert c_encode(long) == _reference(long)


def test_a_lone_surrogate_raises_as_str_encode_does(c_encode):
    with pytest.raises(UnicodeEncodeError):
        tokenizer._py_encode("a \ud800b")
    with pytest.raises(UnicodeEncodeError):
        c_encode("a \ud800b")


def test_only_str_is_accepted(c_encode):
    with pytest.raises(TypeError):
        c_encode(b"bytes")


def test_the_installed_package_uses_the_c_tokenizer(c_encode):
    """Where the extension was built (the README's test command requires it), encode runs it."""
    assert tokenizer.IMPLEMENTATION == "c" and tokenizer.encode is c_encode


def test_an_id_is_one_object_however_often_it_is_made(c_encode):
    """The memo keeps millions of ids: each is a reference to one int per id, not an int each."""
    first, again = c_encode("cache block "), c_encode("block cache again ")
    assert first == [tokenizer.piece_id("cache "), tokenizer.piece_id("block ")] and min(first) > 256
    assert first[0] is again[1] and first[1] is again[0]
