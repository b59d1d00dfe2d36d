"""The top-level ``kvtrace`` command: help text, version, verb summaries."""

from __future__ import annotations

import argparse

import pytest

import kvtrace
from kvtrace.cli import COMMANDS, build_parser, main, summary


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


@pytest.mark.parametrize(("doc", "expected"), [
    ("Run it (e.g. the proxy).  More here.", "Run it (e.g. the proxy)."),
    ("Write a report: tables,\n    charts.\n\n    Options follow.", "Write a report: tables, charts."),
    ("One line only", "One line only"),
])
def test_summary_takes_the_first_sentence(doc, expected):
    assert summary(doc) == expected


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out
