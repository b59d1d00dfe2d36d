"""kvtrace.cli: the ``kvtrace`` command and its sub-commands (does KV reuse happen on my agent
traffic, what does it save, what does it hold, and where does an agent's time go?).

Each sub-command lives in its own module here, ``kvtrace/cli/<command>.py``, thin: it parses,
calls its package and prints.  Each defines ``add_arguments(parser)`` and ``run(args) -> int``;
the docstring of ``run`` is the command's ``--help``.  A command module imports its third-party
dependencies inside ``run``, so ``kvtrace --help`` and ``kvtrace X --help`` work whatever extras
are installed, and ``kvtrace query`` never imports aiohttp or Streamlit.  A command run without
its extra says which one to install (exit 2, no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys

from kvtrace.errors import CLIError  # (also re-exported: kvtrace.cli.CLIError)

# command -> module implementing it (order = order in --help)
COMMANDS: dict[str, str] = {
    "demo": "kvtrace.cli.demo",
    "sim": "kvtrace.cli.sim",
    "proxy": "kvtrace.cli.proxy",
    "bench": "kvtrace.cli.bench",
    "query": "kvtrace.cli.query",
    "compact": "kvtrace.cli.compact",
    "report": "kvtrace.cli.report",
    "doctor": "kvtrace.cli.doctor",
    "whatif": "kvtrace.cli.whatif",
    "dashboard": "kvtrace.cli.dashboard",
    "collect": "kvtrace.cli.collect",
    "clickhouse": "kvtrace.cli.clickhouse",
}


# command -> the extra its dependencies come with (None: the core dependencies)
EXTRAS: dict[str, str | None] = {
    "demo": "demo",
    "sim": "sim",
    "proxy": "proxy",
    "bench": "bench",
    "query": None,
    "compact": None,
    "report": "report",
    "whatif": None,
    "dashboard": "dashboard",
    "collect": "collect",
    "doctor": None,
    "clickhouse": "clickhouse",
}
# a missing module that only one extra brings names that extra whichever command needs it
# (``kvtrace query --traces chdb:...`` needs the clickhouse extra, not a ``query`` one)
MODULE_EXTRAS: dict[str, str] = {
    "sqlglot": "clickhouse",
    "chdb": "clickhouse",
    "clickhouse_connect": "clickhouse",
    "streamlit": "dashboard",
    "altair": "dashboard",
    "pandas": "dashboard",
    "matplotlib": "report",
    "openai": "agent",
    "grpc": "collect",
    "uvloop": "proxy-fast",
    "vllm": "vllm",
}


def missing_extra(command: str, exc: ModuleNotFoundError) -> str | None:
    """The extra that would have brought the third-party module ``exc`` did not find, else None
    (a kvtrace module, or a core dependency: a broken install, not a missing extra)."""
    top = (exc.name or "").split(".")[0]
    if not top or top == "kvtrace":
        return None
    return MODULE_EXTRAS.get(top) or EXTRAS.get(command)


def needs_extra(extra: str) -> str:
    return f"needs the {extra} extra: pip install 'kvtrace[{extra}]'"


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None  # command not part of this build
        raise


class _Unavailable:
    """Stands in for a command module that needs an absent extra: the command is still listed,
    and running it says what to install."""

    def __init__(self, extra: str) -> None:
        self.message = needs_extra(extra)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass  # whatever follows the command is ignored (main): the message is the same

    def run(self, args) -> int:
        raise CLIError(self.message)


def _unavailable(command: str, exc: ModuleNotFoundError) -> _Unavailable:
    extra = missing_extra(command, exc)
    if extra is None:
        raise exc
    return _Unavailable(extra)


def _add_command(sub, name: str, module_name: str) -> None:
    try:
        module = _load(module_name)
    except ModuleNotFoundError as exc:
        module = _unavailable(name, exc)
    if module is None:
        return
    doc = module.message if isinstance(module, _Unavailable) else (module.run.__doc__ or "").strip()
    p = sub.add_parser(
        name, help=summary(doc) if doc else name, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    try:
        module.add_arguments(p)
    except ModuleNotFoundError as exc:  # its options come from a module of the absent extra
        module = _unavailable(name, exc)
        p.description = module.message
        module.add_arguments(p)
    p.set_defaults(_run=module.run, _unavailable=isinstance(module, _Unavailable))


DESCRIPTION = """Observability for multi-turn LLM agents on vLLM prefill/decode disaggregation with
bidirectional KV transfer: does KV reuse happen on my agent traffic, what does it save, what
memory does it hold, and where does an agent's time go?

Start with `kvtrace demo`; `kvtrace COMMAND --help` tells each command's options."""


_SENTENCE_END = re.compile(r"(?<=\.)(?<!e\.g\.)(?<!i\.e\.)\s+(?=[A-Z(`])")


def summary(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line (a verb's help line)."""
    para = " ".join(doc.strip().split("\n\n", 1)[0].split())
    return _SENTENCE_END.split(para, 1)[0]


def build_parser() -> argparse.ArgumentParser:
    from kvtrace import __version__

    parser = argparse.ArgumentParser(
        prog="kvtrace", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-V", "--version", action="version", version=f"kvtrace {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        _add_command(sub, name, module_name)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "_unavailable", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")  # as parse_args does
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except CLIError as exc:
        print(f"kvtrace {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        extra = missing_extra(args.command, exc)
        if extra is None:
            raise
        print(f"kvtrace {args.command}: error: {needs_extra(extra)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kvtrace {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kvtrace query ... | head`: the reader left, which is no error of ours
        # stdout's buffer still holds what could not be written; flushing it again at exit would
        # print "Exception ignored" (Python's docs on SIGPIPE), so point stdout at /dev/null
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process that SIGPIPE ended (128 + 13)
