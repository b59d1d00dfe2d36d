"""``kvtrace proxy``'s command line: the config it builds and its errors, the hardening flags
and their settings, an unwritable trace directory refused before listening."""

from __future__ import annotations

import pytest


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
