"""The top-level ``kvtrace`` command: help text, version, verb summaries."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

import kvtrace
from kvtrace.cli import COMMANDS, build_parser, main, summary
from kvtrace.testing.synth import sample_store


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvtrace {kvtrace.__version__}"


def test_top_level_help_is_prose_not_a_docstring(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and "The ``kvtrace`` command" not in out
    assert "kvtrace demo" in out and "--version" in out


def test_every_verb_summary_is_a_whole_sentence():
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {c.dest: c.help for c in sub._choices_actions}
    assert set(helps) == set(COMMANDS)
    for name, text in helps.items():
        assert text.endswith((".", ")")), f"{name}: summary cut mid-sentence: {text!r}"
        assert text.count("(") == text.count(")"), f"{name}: {text!r}"


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("Run it (e.g. the proxy).  More here.", "Run it (e.g. the proxy)."),
        ("Write a report: tables,\n    charts.\n\n    Options follow.", "Write a report: tables, charts."),
        ("One line only", "One line only"),
    ],
)
def test_summary_takes_the_first_sentence(doc, expected):
    assert summary(doc) == expected


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def _options_without_help(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                missing += _options_without_help(child, f"{prefix} {name}")
        elif (
            not isinstance(action, (argparse._HelpAction, argparse._VersionAction)) and not (action.help or "").strip()
        ):
            missing.append(f"{prefix} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_of_every_command_has_help():
    parser = build_parser()
    assert set(_subparsers(parser)) == set(COMMANDS)  # every command was walked (none missing from this build)
    assert _options_without_help(parser, "kvtrace") == []


@pytest.mark.parametrize("sql", ["", "   ", " ; ", "-- only a comment"])
def test_query_without_a_statement_exits_2_with_one_line(tmp_path, monkeypatch, capsys, sql):
    monkeypatch.chdir(tmp_path)  # no ./kvtrace-traces: the missing statement is reported first
    monkeypatch.delenv("KVTRACE_TRACES_DIR", raising=False)
    assert main(["query", sql]) == 2
    out, err = capsys.readouterr()
    assert (
        out == ""
        and err == 'kvtrace query: error: no SQL statement given (e.g. kvtrace query "SELECT * FROM sessions")\n'
    )


def test_a_reader_that_leaves_early_ends_the_command_without_a_traceback(tmp_path):
    """``kvtrace query ... | head``: stdout's reader is gone before the command writes."""
    sample_store(tmp_path, sessions=1, turns=1)
    read_end, write_end = os.pipe()
    os.close(read_end)  # before the child starts: its first write to stdout fails, every time
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kvtrace.cli", "query", "SELECT * FROM spans", "--traces", str(tmp_path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env={**os.environ, "KVTRACE_METRICS": "0"},
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, "")
