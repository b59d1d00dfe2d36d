"""The simulator's chat prompt is encoded a message at a time (each message's ids kept for the next
leg and the next turn): exactly the ids of the whole rendered prompt, whatever the messages hold."""

from __future__ import annotations

import gc
import random

from kvtrace.sim import tokenizer

PIECES = ["a", "b ", " ", "\n", "<", "<|", "|>", "<|im_end|>", "<|think|>", "x<", "  ", "\t", "é", "<|foo|>"]


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, n)))


def _messages(rng: random.Random) -> list[dict]:
    out = []
    for _ in range(rng.randint(1, 5)):
        c = _text(rng, 12)
        m = {"role": rng.choice(["user", "assistant", "system", "to<ol", "a b"])}
        m["content"] = rng.choice([c, None, [{"type": "text", "text": c}, {"type": "text", "text": "z"}]])
        if rng.random() < 0.3:
            m["reasoning"] = _text(rng, 5)
        out.append(m)
    return out


def test_message_by_message_ids_are_the_whole_prompts_ids():
    rng = random.Random(41)
    for _ in range(2000):
        messages, gen = _messages(rng), rng.random() < 0.8
        whole = [tokenizer.piece_id(p) for p in tokenizer._PIECE.findall(tokenizer.render_chat(messages, gen))]
        assert tokenizer.encode_chat(messages, gen) == whole
        assert tokenizer.encode(tokenizer.render_chat(messages, gen)) == whole


def test_kept_ids_are_bounded_and_never_handed_out_to_be_changed():
    memo = tokenizer._Memo(max_tokens=10)
    first = memo.encode("one two three four five six ")
    assert memo.encode("one two three four five six ") is first and memo.tokens == 6
    memo.encode("seven eight nine ten eleven ")  # 11 tokens: the oldest text goes
    assert memo.tokens == 5 and len(memo._ids) == 1
    ids = tokenizer.encode_chat([{"role": "user", "content": "one two"}])
    ids.append(0)  # the caller's list is its own
    assert tokenizer.encode_chat([{"role": "user", "content": "one two"}]) == ids[:-1]


def test_kept_ids_are_not_walked_by_the_garbage_collector():
    memo = tokenizer._Memo(max_tokens=1000)
    ids = memo.encode("a long message the memo keeps for the next turn ")
    gc.collect()  # a collection it survives: from then on the collector no longer follows it
    assert memo.encode("a long message the memo keeps for the next turn ") is ids and not gc.is_tracked(ids)
    assert list(ids) == tokenizer.encode("a long message the memo keeps for the next turn ")


def test_generated_words_are_word_seed_plus_7919_i_of_the_list_by_its_id():
    """``generate`` repeats a cycle of the word list rather than computing every token: the same ids
    and pieces as the definition (word ``(seed + 7919 i) mod k``, its crc32 id), thinking or not."""
    words = [w + " " for w in tokenizer._WORDS]
    for seed in (0, 1, 39, 40, 12_345, 2**31 - 1):
        for n in (0, 1, 4, 39, 40, 41, 333, 1_000):
            pieces = [words[(seed + i * 7919) % len(words)] for i in range(n)]
            assert tokenizer.generate(seed, n) == ([tokenizer.piece_id(p) for p in pieces], pieces)
            r = tokenizer.reasoning_words(n, True)
            if r:
                thought = [tokenizer.THINK, *pieces[:r], tokenizer.END_THINK, *pieces[r : n - 2]]
                assert tokenizer.generate(seed, n, True) == ([tokenizer.piece_id(p) for p in thought], thought)
