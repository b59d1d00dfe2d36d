"""kvtrace: does KV reuse happen on my agent traffic, what does it save, what does it hold, and
where does an agent's time go?

Each sub-command lives in its own module, which defines ``add_arguments(parser)`` and
``run(args) -> int``; the docstring of ``run`` is the command's ``--help``.  Modules are imported
only when their command runs, so ``kvtrace query`` never imports aiohttp or Streamlit.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys

from kvtrace.errors import CLIError  # noqa: F401  (re-exported: kvtrace.cli.CLIError)

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
}


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            return None  # command not part of this build
        raise


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
        module = _load(module_name)
        if module is None:
            continue
        doc = (module.run.__doc__ or "").strip()
        p = sub.add_parser(
            name,
            help=summary(doc) if doc else name,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
    except KeyboardInterrupt:
        print(f"kvtrace {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    # ``python -m kvtrace.cli``: go through the package module so CLIError is the same class
    from kvtrace.cli import main as _main

    sys.exit(_main())
