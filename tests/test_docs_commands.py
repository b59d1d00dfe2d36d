"""Every command shown in README.md and docs/ works as printed after ``kvtrace demo``.

Commands are read from fenced and indented code blocks and from inline code.  Against the demo's
trace directory (the shared ``demo_run`` fixture; the commands run in its parent, so
``kvtrace-traces/bidir`` is the demo's) this test runs every ``kvtrace query``, ``report``,
``dashboard`` (up to the launch of Streamlit) and ``compact`` command, every ``python -c`` /
``python -m kvtrace...`` command, every Python block that only reads traces, and every SQL block
(DuckDB ones through ``kvtrace.store.connect``, ClickHouse ones in chDB over a plain glob of the
demo's files).  Commands that start servers or need other machines (``kvtrace sim``, ``proxy``,
``bench``, ``collect``, ``demo``) are parsed by kvtrace's own argument parser, so an option that
does not exist fails; synopses (``[--opt]``, ``...``) only need their subcommand to exist.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvtrace.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "collectors" / "README.md"]
RUN = {"query", "report", "dashboard", "compact"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of fenced blocks, and ("bash", code) of 4-space indented blocks outside them."""
    out = [(m.group(1) or "text", m.group(2)) for m in FENCE.finditer(text)]
    rest = FENCE.sub("", text)
    for m in re.finditer(r"(?:^\n)((?:^    \S.*\n(?:^     .*\n)*)+)", rest, re.M):
        out.append(("bash", "\n".join(line[4:] for line in m.group(1).splitlines())))
    return out


def _shell_commands(code: str) -> list[str]:
    """Logical command lines of a shell block: continuation lines and multi-line quotes joined,
    comments dropped."""
    out, buf = [], ""
    for line in code.splitlines():
        buf = f"{buf}\n{line}" if buf else line
        if buf.rstrip().endswith("\\"):
            buf = buf.rstrip()[:-1]
            continue
        try:
            shlex.split(buf, comments=True)
        except ValueError:  # a quote spans lines
            continue
        if buf.strip():
            out.append(buf.strip())
        buf = ""
    return out


def _commands() -> list[tuple[str, str, str]]:
    """(doc, kind, text) for everything this test runs or checks."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        name = str(doc.relative_to(ROOT))
        for lang, code in _blocks(text):
            if lang == "python":
                found.append((name, "python", code))
            elif lang == "sql":
                found.append((name, "sql", code))
            elif lang in ("bash", "sh", "text"):
                found += [(name, "shell", c) for c in _shell_commands(code)]
        for inline in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", FENCE.sub("", text)):
            if re.match(r"kvtrace [a-z]+\b(?!:)", inline):  # not an error message: "kvtrace collect: error: ..."
                found.append((name, "inline", inline))
            elif re.match(r"python -[cm] ", inline):
                found.append((name, "shell", inline))
    return found


def _argv(command: str) -> list[str] | None:
    """The kvtrace argv of a shell command (env assignments stripped), else None."""
    words = shlex.split(command, comments=True)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)
    if words and words[-1] == "&":  # started in the background
        words.pop()
    if len(words) > 1 and words[0] == "kvtrace":
        return words[1:]
    return None


def _synopsis(command: str) -> bool:
    return "..." in command or re.search(r"\[-", command) is not None or "|" in command.split("#")[0]


@pytest.fixture(scope="module")
def workdir(demo_run):
    rc, out, traces = demo_run
    assert rc == 0, out
    return traces.parent


def test_the_readme_commands_are_found():
    shell = {c for _, kind, c in _commands() if kind == "shell"}
    for expected in (
        'kvtrace query "SELECT * FROM session_breakdown" --traces kvtrace-traces/bidir',
        "kvtrace report --traces kvtrace-traces/bidir --format html --output report.html",
    ):
        assert expected in shell
    assert any(c.startswith("kvtrace dashboard --traces kvtrace-traces/bidir --compare") for c in shell)
    assert {kind for _, kind, _ in _commands()} == {"shell", "inline", "python", "sql"}


@pytest.mark.timeout(600)
def test_every_documented_command_works_on_the_demo_traces(workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    monkeypatch.delenv("KVTRACE_TRACES_DIR", raising=False)
    launched = []
    monkeypatch.setattr("kvtrace.dashboards.launch.launch", lambda directory, **kw: launched.append(directory) or 0)
    parser = build_parser()
    subcommands = _subparsers(parser)
    ran, failures = [], []
    for doc, kind, text in _commands():
        try:
            what = _check(kind, text, parser, subcommands, workdir)
        except BaseException as exc:  # noqa: BLE001 (report every failing command at once)
            failures.append(f"{doc}: {text!r}: {type(exc).__name__}: {exc}")
            continue
        if what:
            ran.append(what)
    capsys.readouterr()
    assert failures == []
    assert sum(w == "ran" for w in ran) >= 8 and launched == ["kvtrace-traces/bidir"]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _check(kind: str, text: str, parser, subcommands: dict, workdir: Path) -> str | None:
    if kind == "python":
        tree = ast.parse(text)  # every block at least parses
        imports = {
            n.module if isinstance(n, ast.ImportFrom) else a.name
            for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names
        }
        if imports and all(m.startswith(("kvtrace.store", "kvtrace.analysis")) for m in imports):
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(tree, "<doc>", "exec"), {})
            return "ran"
        return "parsed"
    if kind == "sql":
        return _sql(text, workdir)
    argv = _argv(text)
    if argv is None:
        return _python_command(text)
    assert argv[0] in subcommands, f"no such command: kvtrace {argv[0]}"
    if kind == "inline" or _synopsis(text):  # a mention or a synopsis: its options must exist
        known = subcommands[argv[0]]._option_string_actions
        unknown = [w.split("=")[0] for w in argv[1:] if w.startswith("-") and w.split("=")[0] not in known]
        assert unknown == [], f"kvtrace {argv[0]} has no option {unknown}"
        return "parsed"
    if argv[0] not in RUN:
        parser.parse_args(argv)  # exits (SystemExit) on an unknown option or a bad value
        return "parsed"
    rc = main(argv)
    assert rc == 0, f"exit status {rc}"
    return "ran"


def _python_command(text: str) -> str | None:
    words = shlex.split(text, comments=True)
    if words[:2] == ["python", "-c"] and "kvtrace" in words[2]:
        cmd = [sys.executable, "-c", words[2]]
    elif words[:2] == ["python", "-m"] and words[2].startswith("kvtrace"):
        cmd = [sys.executable, "-m", words[2]]  # its output redirection is not run
    else:
        return None  # not ours to run (pip, bash scripts/test.sh, vLLM, ClickHouse, ...)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return "ran"


def _sql(text: str, workdir: Path) -> str:
    bidir = workdir / "kvtrace-traces" / "bidir"
    if "otel.otel_traces" in text:  # ClickHouse: the demo's files through a plain glob, in chDB
        pytest.importorskip("chdb")
        from clickhouse_check import chdb_backend

        from kvtrace.store.sql import CLICKHOUSE, literal

        source = f"file({literal(str(bidir / '**' / '*.parquet'), CLICKHOUSE)}, Parquet)"
        # through kvtrace's backend: chDB opens one database directory per process, and a
        # documented example may have opened one
        chdb_backend().query(text.replace("otel.otel_traces", source).rstrip().rstrip(";"))
        return "ran"
    from kvtrace.store import connect

    connect(bidir).sql(text.rstrip().rstrip(";")).fetchall()
    return "ran"
