"""Unit tests: conversation table, stream patcher, metadata merge for uninstrumented workers,
the CLI's flags and settings (the fuzz corpus is in test_proxy_fuzz.py)."""

from __future__ import annotations

import json

import pytest

from kvtrace import semconv as sc
from kvtrace.proxy import metadata
from kvtrace.proxy.stream import InvalidChunk, StreamPatcher
from kvtrace.proxy.table import ConversationTable


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


# ---------------------------------------------------------------------------- table
def test_table_offer_reasons_and_age():
    clock = Clock()
    t = ConversationTable(ttl_s=450, clock=clock)
    assert t.begin(None).reason == sc.OFFER_NO_CONVERSATION_ID
    first = t.begin("a")
    assert (first.index, first.offered, first.reason) == (0, False, sc.OFFER_NO_ENTRY)
    assert t.store("a", 0, {"x": 1}, "http://d0")
    clock.t = 10
    turn = t.begin("a")
    assert (turn.index, turn.offered, turn.reason, turn.entry_age_s) == (1, True, sc.OFFER_OFFERED, 10)
    assert turn.entry.params == {"x": 1} and turn.entry.decode_endpoint == "http://d0"
    turn.consumed()
    assert t.begin("a").reason == sc.OFFER_NO_ENTRY  # consumed on read, as upstream
    t.store("a", 2, {"x": 2}, "http://d1")
    clock.t = 10 + 451
    old = t.begin("a")
    assert (old.offered, old.reason, old.entry_age_s) == (False, sc.OFFER_ENTRY_TOO_OLD, 451)


def test_table_restore_and_ordering():
    t = ConversationTable(ttl_s=450, clock=Clock())
    t.begin("a")
    t.store("a", 0, {"turn": 0}, "d")
    failed = t.begin("a")  # turn 1 takes the entry, then P fails
    failed.restore()
    assert t.peek("a").params == {"turn": 0}
    ok = t.begin("a")  # turn 2 takes it again
    late = t.begin("a")  # turn 3 concurrently: nothing left to offer
    assert ok.offered and not late.offered
    t.store("a", 3, {"turn": 3}, "d")
    assert not t.store("a", 2, {"turn": 2}, "d")  # an older turn never overwrites a newer entry
    ok.restore()  # nor does a restore
    assert t.peek("a").params == {"turn": 3}


def test_table_lru_bound():
    t = ConversationTable(ttl_s=450, max_entries=2, clock=Clock())
    for key in ("a", "b"):
        t.begin(key)
        t.store(key, 0, {}, "d")
    t.begin("a")  # a is now most recent
    t.begin("c")
    assert t.peek("b") is None and t.begin("b").index == 0  # b was evicted, turn counter restarts


def test_evict_stale():
    clock = Clock()
    t = ConversationTable(ttl_s=5, clock=clock)
    t.store("a", 0, {}, "d")
    clock.t = 6
    t.store("b", 0, {}, "d")  # drops a on its way
    health = t.health()
    assert (health["evicted_stale"], health["cached_conversations"], len(t)) == (1, 1, 1)
    assert health["table_bytes"] == t.nbytes > 0 and health["conversations"] == 2


# ---------------------------------------------------------------------------- stream
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


# ---------------------------------------------------------------------------- metadata
def test_metadata_from_raw_params_and_usage():
    offered = {"remote_num_tokens": 300, "remote_engine_id": "d7"}
    p_usage = {"prompt_tokens": 400, "prompt_tokens_details": {"cached_tokens": 256}}
    d_params = {"do_remote_decode": True, "remote_block_ids": [[1, 2, 3, 4]]}
    common = dict(
        trace_id="t",
        request_id="r",
        session_id="s",
        turn=1,
        offered_params=offered,
        p_params={},
        p_usage=p_usage,
        prefill_answered=True,
        d_params=d_params,
        fallback=sc.FALLBACK_NONE,
        ttft_ms=1.5,
    )
    kv = metadata.build(offered=True, offer_reason=sc.OFFER_OFFERED, **common)
    assert kv == {
        sc.KVT_TRACE_ID: "t",
        sc.KVT_REQUEST_ID: "r",
        sc.KVT_SESSION_ID: "s",
        sc.KVT_TURN: 1,
        sc.KVT_OFFERED: True,
        sc.KVT_OFFER_REASON: sc.OFFER_OFFERED,
        sc.KVT_DECISION: None,
        sc.KVT_PROMPT_TOKENS: 400,
        sc.KVT_LOCAL_HIT_TOKENS: None,
        sc.KVT_REMOTE_TOKENS: 300,
        sc.KVT_PULLED_TOKENS: None,
        sc.KVT_RECOMPUTED_TOKENS: 144,
        sc.KVT_BYTES: None,
        sc.KVT_TRANSFER_MS: None,
        sc.KVT_PEER_ENGINE_ID: "d7",
        sc.KVT_RETAINED_BLOCKS: 4,
        sc.KVT_RETAINED_BYTES: None,
        sc.KVT_RETAINED_TTL_S: None,
        sc.KVT_PREFILL: None,
        sc.KVT_DECODE: None,
        sc.KVT_FALLBACK: sc.FALLBACK_NONE,
        sc.KVT_TTFT_MS: 1.5,
    }
    kv = metadata.build(offered=False, offer_reason=sc.OFFER_NO_ENTRY, **common)
    assert (kv[sc.KVT_LOCAL_HIT_TOKENS], kv[sc.KVT_PULLED_TOKENS], kv[sc.KVT_REMOTE_TOKENS]) == (256, 0, 0)
    assert set(kv) == set(sc.KV_TRANSFER_FIELDS) - {sc.KVT_ENGINE_ID, sc.KVT_ROLE}


# ---------------------------------------------------------------------------- CLI
def test_cli_config_shape_and_errors():
    from kvtrace.cli import CLIError, build_parser
    from kvtrace.cli.proxy import build_config

    args = build_parser().parse_args(
        [
            "proxy",
            "--prefiller-hosts",
            "a",
            "b",
            "--prefiller-ports",
            "1",
            "2",
            "--decoder-port",
            "3",
            "4",
            "--prefill-failure",
            "decode_only",
            "--no-patch",
        ]
    )
    cfg = build_config(args)
    assert [w.base for w in cfg.prefill] == ["http://a:1", "http://b:2"]
    assert [w.base for w in cfg.decode] == ["http://localhost:3", "http://localhost:4"]
    assert (cfg.host, cfg.conversation_ttl_s, cfg.prefill_failure, cfg.patch_responses) == (
        "127.0.0.1",
        450.0,
        "decode_only",
        False,
    )
    bad = build_parser().parse_args(["proxy", "--prefiller-hosts", "a", "b", "--prefiller-ports", "1", "2", "3"])
    with pytest.raises(CLIError, match="prefiller hosts"):
        build_config(bad)
    with pytest.raises(CLIError, match="conversation_ttl_s"):
        build_config(build_parser().parse_args(["proxy", "--conversation-ttl", "0"]))


def test_cli_hardening_flags_and_settings(monkeypatch):
    from kvtrace.cli import CLIError, build_parser
    from kvtrace.cli.proxy import build_config

    cfg = build_config(build_parser().parse_args(["proxy"]))
    assert (
        cfg.request_timeout_s,
        cfg.max_upstream_bytes,
        cfg.client_header_timeout_s,
        cfg.client_body_timeout_s,
        cfg.max_table_bytes,
        cfg.max_id_bytes,
        cfg.decoder_kv_ttl_s,
    ) == (1800.0, 64 << 20, 60.0, 60.0, 256 << 20, 256, None)
    monkeypatch.setenv("KVTRACE_PROXY_REQUEST_TIMEOUT", "30")
    monkeypatch.setenv("KVTRACE_PROXY_MAX_ID_BYTES", "64")
    monkeypatch.setenv("KVTRACE_PROXY_DECODER_KV_TTL", "15")
    args = build_parser().parse_args(
        [
            "proxy",
            "--max-id-bytes",
            "128",
            "--max-upstream-bytes",
            "1000",
            "--client-header-timeout",
            "5",
            "--client-body-timeout",
            "6",
            "--max-table-bytes",
            "4096",
        ]
    )
    cfg = build_config(args)  # flags beat the environment, the environment beats the defaults
    assert (
        cfg.request_timeout_s,
        cfg.max_upstream_bytes,
        cfg.client_header_timeout_s,
        cfg.client_body_timeout_s,
        cfg.max_table_bytes,
        cfg.max_id_bytes,
        cfg.decoder_kv_ttl_s,
    ) == (30.0, 1000, 5.0, 6.0, 4096, 128, 15.0)
    with pytest.raises(CLIError, match="request_timeout_s must be > 0"):
        build_config(build_parser().parse_args(["proxy", "--request-timeout", "0"]))
    monkeypatch.setenv("KVTRACE_PROXY_MAX_TABLE_BYTES", "lots")
    with pytest.raises(CLIError, match="KVTRACE_PROXY_MAX_TABLE_BYTES='lots' is not a valid int"):
        build_config(build_parser().parse_args(["proxy"]))


def test_cli_refuses_an_unwritable_trace_directory_before_listening(tmp_path, capsys, monkeypatch):
    from kvtrace.cli import main

    (tmp_path / "file").write_text("x")
    target = tmp_path / "file" / "traces"
    monkeypatch.setattr("kvtrace.proxy.server.start", lambda *a, **k: pytest.fail("the proxy started"))
    assert main(["proxy", "--traces", str(target), "--port", "0"]) == 2
    assert capsys.readouterr().err == f"kvtrace proxy: error: cannot write traces to {target}: Not a directory\n"


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
