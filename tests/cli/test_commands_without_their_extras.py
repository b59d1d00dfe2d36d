"""``kvtrace`` with only the core dependencies: every command is listed and its ``--help`` works;
running one whose extra is absent says which extra to install (exit 2, one line, no traceback).

The subprocesses hide every module the extras bring (their distributions' top-level import names)
behind an import hook, so the dev environment, which has them all, stands in for a core-only one.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions

import pytest

import kvtrace.cli as cli
from kvtrace.cli import COMMANDS, EXTRAS, build_parser, main, missing_extra

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

HOOK = """
import sys, importlib.abc
HIDDEN = set(sys.argv[1].split(","))
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
from kvtrace.cli import main
sys.exit(main(sys.argv[2:]))
"""


def _dist(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _hidden() -> str:
    """Top-level modules of the extras' distributions that no core distribution also provides."""
    by_dist: dict[str, set[str]] = {}
    for module, dists in packages_distributions().items():
        for d in dists:
            by_dist.setdefault(d.lower().replace("_", "-"), set()).add(module)
    core = set().union(*(by_dist.get(_dist(r), set()) for r in PROJECT["dependencies"]))
    extras = {
        m
        for reqs in PROJECT["optional-dependencies"].values()
        for r in reqs
        if not r.startswith("kvtrace[")
        for m in by_dist.get(_dist(r), set())
    }
    return ",".join(sorted(extras - core - {"kvtrace"}))


HIDDEN = _hidden()


def _kvtrace(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", HOOK, HIDDEN, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_the_extras_modules_are_hidden():
    assert {"aiohttp", "streamlit", "matplotlib", "grpc", "sqlglot", "openai"} <= set(HIDDEN.split(","))
    assert not {"duckdb", "pyarrow", "numpy", "opentelemetry"} & set(HIDDEN.split(","))


def test_top_level_help_lists_every_command_without_any_extra():
    done = _kvtrace("--help")
    assert (done.returncode, done.stderr) == (0, "")
    listed = re.findall(r"^    (\w+) ", done.stdout, re.M)
    assert listed == list(COMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_commands_help_works_without_its_extra(command):
    done = _kvtrace(command, "--help")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"usage: kvtrace {command} ")


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["proxy"], "proxy"),
        (["sim"], "sim"),
        (["collect"], "collect"),
        (["demo"], "demo"),
        (["dashboard", "--traces", "{tmp}"], "dashboard"),
    ],
)
def test_a_command_run_without_its_extra_names_the_extra_to_install(tmp_path, argv, extra):
    done = _kvtrace(*(a.format(tmp=tmp_path) for a in argv))
    assert done.returncode == 2
    assert done.stderr == f"kvtrace {argv[0]}: error: needs the {extra} extra: pip install 'kvtrace[{extra}]'\n"


def test_a_command_module_that_needs_an_absent_extra_to_import_is_listed_and_says_so(tmp_path, monkeypatch, capsys):
    (tmp_path / "kvtrace_h4_needs_missing.py").write_text("import kvtrace_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(COMMANDS, "needy", "kvtrace_h4_needs_missing")
    monkeypatch.setitem(EXTRAS, "needy", "proxy")
    listed = {a.dest: a.help for a in build_parser()._subparsers._group_actions[0]._choices_actions}
    assert listed["needy"] == "needs the proxy extra: pip install 'kvtrace[proxy]'"
    assert main(["needy", "--any", "option"]) == 2
    assert capsys.readouterr().err == "kvtrace needy: error: needs the proxy extra: pip install 'kvtrace[proxy]'\n"


def test_a_module_only_one_extra_brings_names_that_extra_whatever_the_command():
    assert missing_extra("query", ModuleNotFoundError(name="sqlglot.dialects")) == "clickhouse"
    assert missing_extra("proxy", ModuleNotFoundError(name="aiohttp")) == "proxy"


def test_a_missing_kvtrace_module_or_core_dependency_is_not_blamed_on_an_extra():
    assert missing_extra("proxy", ModuleNotFoundError(name="kvtrace.proxy.gone")) is None
    assert missing_extra("query", ModuleNotFoundError(name="aiohttp")) is None
    assert missing_extra("proxy", ModuleNotFoundError()) is None


def test_every_extra_a_command_names_is_declared():
    named = {e for e in EXTRAS.values() if e} | set(cli.MODULE_EXTRAS.values())
    assert named <= set(PROJECT["optional-dependencies"])
    assert set(EXTRAS) == set(COMMANDS)
