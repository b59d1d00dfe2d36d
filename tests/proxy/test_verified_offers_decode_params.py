"""D's final kv_transfer_params are validated before the proxy keeps them for the next turn's offer:
invalid ones are never offered, the request span says why and a counter counts them by field."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvtrace import semconv as sc
from kvtrace.proxy import legs

GOOD = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": "d0",
    "remote_block_ids": [[1, 2, 3]],
    "remote_request_id": "r-d0",
    "remote_host": "10.0.0.9",
    "remote_port": 5600,
    "remote_num_tokens": 40,
    "tp_size": 1,
    "remote_blocks_expiry_time": 1234.5,
    sc.KV_PARAMS_KEY: {sc.KVT_DIGEST: {"v": 1, "chunk": 64, "n": 40, "tags": "AAAAAA=="}},
}
V2_DIGEST = {"v": 2, "chunk": 64, "n": 40, "tags": "AAAAAA==", sc.DIGEST_FINGERPRINT: "5c0a4fd0f39f3b84"}
BAD = [
    ("remote_port", {"remote_port": 70000}, "kv_transfer_params.remote_port is not a port"),
    ("remote_num_tokens", {"remote_num_tokens": -1}, "kv_transfer_params.remote_num_tokens is not an integer in "),
    ("remote_num_tokens", {"remote_num_tokens": True}, "kv_transfer_params.remote_num_tokens is not an integer in "),
    ("tp_size", {"tp_size": 0}, "kv_transfer_params.tp_size is not an integer in 1..4096"),
    ("remote_engine_id", {"remote_engine_id": "e" * 2000}, "kv_transfer_params.remote_engine_id is not a string"),
    (sc.DECODE_PARAMS_NON_FINITE, {"remote_blocks_expiry_time": float("nan")}, "kv_transfer_params holds a non-"),
    ("remote_block_ids", {"remote_block_ids": [[1, -2]]}, "kv_transfer_params.remote_block_ids is not a list of"),
    ("remote_block_ids", {"remote_block_ids": [list(range(42))]}, "kv_transfer_params.remote_block_ids holds 42 "),
    ("remote_block_ids", {"remote_block_ids": []}, "kv_transfer_params.remote_block_ids is not a non-empty list"),
    *(
        ("remote_block_ids", {"remote_block_ids": ids}, "kv_transfer_params.remote_block_ids is not a list of block id")
        for ids in (
            [[1, True]],  # a bool is no block id, though it is an int to Python
            [[1, 2.0]],
            [[1, float("inf")]],
            [[1, "2"]],
            [[1, None]],
            [[1, [2]]],  # a list inside a group
            [1, [2]],  # ... of a flat list
            [[1], 2],  # a group that is no list
            [[1, {"a": 2}]],
        )
    ),
    ("do_remote_decode", {"do_remote_decode": 1}, "kv_transfer_params.do_remote_decode is not a boolean"),
    ("remote_port", {"remote_port": 5600.0}, "kv_transfer_params.remote_port is not a port"),
    ("remote_num_tokens", {"remote_num_tokens": 1 << 25}, "kv_transfer_params.remote_num_tokens is not an integer"),
    ("remote_blocks_expiry_time", {"remote_blocks_expiry_time": "1"}, "kv_transfer_params.remote_blocks_expiry_time"),
    (sc.DECODE_PARAMS_NON_FINITE, {"extra": [1.0, {"x": float("-inf")}]}, "kv_transfer_params holds a non-finite"),
    (sc.DECODE_PARAMS_OBJECT, {sc.KV_PARAMS_KEY: [1]}, f"kv_transfer_params.{sc.KV_PARAMS_KEY} is not an object"),
    (sc.KVT_DIGEST, {sc.KV_PARAMS_KEY: {sc.KVT_DIGEST: {"v": 1, "chunk": 64, "n": 40, "tags": 5}}}, "kv_trans"),
    (sc.KVT_DIGEST, {sc.KV_PARAMS_KEY: {sc.KVT_DIGEST: {"v": 1, "chunk": 0, "n": 1, "tags": ""}}}, "kv_trans"),
    *(
        (
            sc.KVT_DIGEST,
            {sc.KV_PARAMS_KEY: {sc.KVT_DIGEST: {**V2_DIGEST, sc.DIGEST_FINGERPRINT: fp}}},
            f"kv_transfer_params.{sc.KV_PARAMS_KEY}.{sc.KVT_DIGEST} has a fingerprint that is not a short string",
        )
        for fp in (5, "f" * 65, ["ab"])
    ),
]


def test_valid_decode_params_pass():
    assert legs.invalid_decode_params(GOOD) is None
    assert legs.invalid_decode_params({**GOOD, sc.KV_PARAMS_KEY: {sc.KVT_DIGEST: V2_DIGEST}}) is None
    assert legs.invalid_decode_params({"do_remote_decode": False}) is None  # D kept nothing: nothing to check


@pytest.mark.parametrize(
    "ids",
    [[[1, 2, 3]], [4, 5], [[1, 2], [3, 4]], [[]], [[0, 10**30]]],
    ids=["one-group", "flat", "two-groups", "empty-group", "beyond-64-bits"],
)
def test_block_ids_of_any_group_shape_pass(ids):
    assert legs.invalid_decode_params({**GOOD, "remote_block_ids": ids}) is None


@pytest.mark.parametrize("field, change, why", BAD, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD)])
def test_each_invalid_field_is_named(field, change, why):
    got = legs.invalid_decode_params({**GOOD, **change})
    assert got is not None and got[0] == field and got[1].startswith(why)


def _stream(params: dict) -> list[bytes]:
    """D's stream: one token whose finish chunk carries ``params``, then [DONE]."""
    choice = {"index": 0, "delta": {"content": "x"}, "finish_reason": "length"}
    chunk = {"id": "d", "object": "chat.completion.chunk", "model": "fake", "choices": [choice]}
    chunk["kv_transfer_params"] = params
    return [b"data: " + json.dumps(chunk).encode() + b"\n\n", b"data: [DONE]\n\n"]


async def test_invalid_decode_params_are_not_kept_so_the_next_turn_is_not_offered_them(rig_factory):
    bad = {**GOOD, "remote_port": 0}
    rig = await rig_factory(d_kwargs={"script": _stream(bad)})
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True, "conversation_id": "c"}
    for _ in range(2):
        status, _, data = await rig.post(body)
        assert status == 200 and data.endswith(b"data: [DONE]\n\n")
    first, second = await rig.server_span(1), await rig.server_span(2)
    assert first.attributes[sc.PROXY_DECODE_PARAMS_INVALID] == "kv_transfer_params.remote_port is not a port"
    assert (second.attributes[sc.PROXY_OFFER], second.attributes[sc.PROXY_OFFER_REASON]) == (False, sc.OFFER_NO_ENTRY)
    assert rig.proxy.proxy.table.peek("c") is None
    (p0, p1) = [b["kv_transfer_params"] for _, b in rig.p.received]
    assert p1.get("remote_block_ids") is None  # the miss parameters, not D's
    text = rig.proxy.proxy.metrics.render(None)[0].decode()
    samples = {
        s.labels.get(sc.LABEL_FIELD): s.value
        for f in text_string_to_metric_families(text)
        if f.name == sc.METRIC_PROXY_DECODE_PARAMS_REJECTED
        for s in f.samples
        if s.name.endswith("_total")
    }
    assert samples == {"remote_port": 2.0}


async def test_valid_decode_params_are_kept_with_only_the_digest_of_d_kvtrace_entry(rig_factory):
    good = {**GOOD, sc.KV_PARAMS_KEY: {**GOOD[sc.KV_PARAMS_KEY], sc.KVT_ENGINE_ID: "d0", sc.KVT_ROLE: "decode"}}
    rig = await rig_factory(d_kwargs={"script": _stream(good)})
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True, "conversation_id": "c"}
    for _ in range(2):
        status, _, _ = await rig.post(body)
        assert status == 200
    second = await rig.server_span(2)
    assert sc.PROXY_DECODE_PARAMS_INVALID not in (await rig.server_span(1)).attributes
    assert (second.attributes[sc.PROXY_OFFER], second.attributes[sc.PROXY_OFFER_REASON]) == (True, sc.OFFER_OFFERED)
    offered = rig.p.received[1][1]["kv_transfer_params"]
    assert offered[sc.KV_PARAMS_KEY][sc.KVT_DIGEST] == GOOD[sc.KV_PARAMS_KEY][sc.KVT_DIGEST]
    assert {k: v for k, v in offered.items() if k != sc.KV_PARAMS_KEY} == {
        **{k: v for k, v in GOOD.items() if k != sc.KV_PARAMS_KEY},
        "remote_host": "127.0.0.1",  # D's host as the proxy reached it
    }
    assert set(offered[sc.KV_PARAMS_KEY]) == {sc.CTX_TRACEPARENT, sc.CTX_SESSION_ID, sc.CTX_TURN, sc.KVT_DIGEST}
