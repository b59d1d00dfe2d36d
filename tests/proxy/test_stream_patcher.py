"""The proxy's stream patcher: D's bytes pass through unchanged except the final chunk, which
gets kv_transfer_params (and usage); lines split over any number of network chunks; an invalid
chunk keeps the lines before it."""

from __future__ import annotations

import json

import pytest

from kvtrace import semconv as sc
from kvtrace.proxy.stream import InvalidChunk, StreamPatcher


def _chunk(finish=None, kvp=None, usage=None, choices=True):
    obj = {"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": finish}] if choices else []}
    if kvp is not None or finish:
        obj["kv_transfer_params"] = kvp
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@pytest.mark.parametrize("split", [1, 7, 1000])
@pytest.mark.parametrize("include_usage", [False, True])
def test_patcher_passes_bytes_through_and_patches_final(split, include_usage):
    body = (
        _chunk()
        + _chunk()
        + _chunk("stop", {"do_remote_decode": True})
        + _chunk(usage={"prompt_tokens": 3}, choices=False)
        + b"data: [DONE]\n\n"
    )
    seen = []
    p = StreamPatcher(
        patch_usage_chunk=include_usage,
        drop_usage=not include_usage,
        make_kv=lambda: {"k": len(seen)},
        on_params=seen.append,
    )
    out = b"".join(p.feed(body[i : i + split]) for i in range(0, len(body), split)) + p.flush()
    events = [json.loads(e[6:]) for e in out.decode().split("\n\n") if e.startswith("data: {")]
    assert out.startswith(_chunk() + _chunk())  # untouched bytes
    assert seen == [{"do_remote_decode": True}] and p.usage == {"prompt_tokens": 3} and p.done
    assert p.finish_reasons == ["stop"]
    if include_usage:
        assert len(events) == 4 and events[-1][sc.RESPONSE_KV_TRANSFER] == {"k": 1}
        assert sc.RESPONSE_KV_TRANSFER not in events[2]
    else:
        assert len(events) == 3 and events[-1][sc.RESPONSE_KV_TRANSFER] == {"k": 1}
        assert out.endswith(b"\n\ndata: [DONE]\n\n") and b"\n\n\n" not in out


@pytest.mark.parametrize("split", [1, 5, 4096])
def test_patcher_line_split_over_many_chunks_and_invalid_chunk_keeps_prior_lines(split):
    good = _chunk()
    bad = b'data: {"choices":[{"finish_reason":7}]}\n\n'
    body = good + b'data: {"choices":[{"delta":{"content":"' + b"z" * 10_000 + b'"}}]}\n\n' + bad
    p = StreamPatcher(patch_usage_chunk=False, drop_usage=True, make_kv=None, on_params=lambda _: None)
    out = []
    with pytest.raises(InvalidChunk, match="finish_reason is not a string") as err:
        for i in range(0, len(body), split):
            out.append(p.feed(body[i : i + split]))
    assert b"".join(out) + err.value.passed == body[: len(body) - len(bad)]  # every line before the bad one
