"""``streamlit`` with the pages' heavy imports done at server start (what ``kvtrace dashboard`` runs).

Every page imports pandas, Altair and kvtrace's analysis and store modules (through ``common``);
in a fresh ``streamlit run`` process the first page view pays for importing them (pandas and
Altair alone are a large share of the sessions page's first render: docs/benchmarks.md) and for
DuckDB's first connection.  This entry point does both before Streamlit's server starts, then is
``python -m streamlit`` (same arguments, same ``prog_name``).
"""

from __future__ import annotations

import sys

PRELOAD = ("pandas", "altair", "duckdb", "kvtrace.store", "kvtrace.analysis.sessions", "kvtrace.analysis.filters")
"""The modules every page imports that Streamlit itself does not load at start."""


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    import duckdb

    duckdb.connect().execute("SELECT 1").fetchall()  # the process's first database instance


def main() -> int:
    preload()
    from streamlit.web.cli import main as streamlit_main

    return streamlit_main(prog_name="streamlit")


if __name__ == "__main__":
    sys.exit(main())
