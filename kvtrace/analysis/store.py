"""Open a trace directory for analysis: the store's views plus the breakdown views.

Used by the dashboard (one cached connection per directory), ``kvtrace report`` and
``kvtrace demo``.  Page and report code pass the returned connection (or a ``cursor()`` of it,
one per thread) to the query functions of :mod:`kvtrace.analysis`.
"""

from __future__ import annotations

import os

from kvtrace import settings

DEFAULT_TRACES_DIR = "kvtrace-traces"


def traces_dir(value: str | os.PathLike | None = None) -> str:
    """``value``, else ``KVTRACE_TRACES_DIR``, else ``./kvtrace-traces``."""
    return os.fspath(settings.TRACES_DIR.get(value) or DEFAULT_TRACES_DIR)


def open_store(directory: str | os.PathLike, *, allow_empty: bool = False):
    """A DuckDB connection with the store's views and :mod:`.breakdown`'s views.

    Raises :class:`kvtrace.store.views.StoreError` for a missing/empty directory unless
    ``allow_empty`` (then every view exists with zero rows)."""
    from kvtrace.analysis.breakdown import install_views
    from kvtrace.store.views import connect

    con = connect(directory, allow_empty=allow_empty)
    install_views(con)
    return con
