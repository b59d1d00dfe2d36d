"""What a reading command reads: a trace directory (DuckDB over Parquet) or an ``otel_traces``
table (ClickHouse), chosen by the same three options everywhere.

``kvtrace query``, ``report``, ``dashboard`` and ``whatif`` take ``--traces DIR`` or
``--clickhouse URL [--table NAME]`` (:func:`kvtrace.cli.options.add_source_arguments`); the
functions here take any object with those three attributes (``traces``, ``clickhouse``, ``table``,
each possibly missing).  :func:`open_store` returns what the
views and :mod:`kvtrace.analysis` run on: a DuckDB connection (:func:`kvtrace.store.connect`) or a
:class:`~kvtrace.store.clickhouse.store.ClickHouseStore`.  ``--clickhouse`` (or
``KVTRACE_CLICKHOUSE``) wins over ``--traces``; ``URL`` is ``http(s)://...`` (a server, through
clickhouse-connect) or ``chdb:PATH`` (chDB in this process).  Every failure to open is a
:class:`~kvtrace.store.reader.StoreError` with one line.
"""

from __future__ import annotations

from kvtrace import settings
from kvtrace.store.runs import traces_dir


def clickhouse_url(args) -> str | None:
    """The ClickHouse URL the options (or the environment) name, else None."""
    return settings.CLICKHOUSE.get(getattr(args, "clickhouse", None)) or None


def clickhouse_table(args) -> str:
    return settings.CLICKHOUSE_TABLE.get(getattr(args, "table", None))


def describe(args) -> str:
    """What the options read, for messages and report headers (passwords hidden)."""
    url = clickhouse_url(args)
    if url:
        from kvtrace.store.clickhouse.backend import redact

        return f"{redact(url)} table {clickhouse_table(args)}"
    return traces_dir(getattr(args, "traces", None))


def open_store(args, *, allow_empty: bool = False, read_only: bool = False):
    """A DuckDB connection on ``--traces`` or a ClickHouse store on ``--clickhouse`` (module doc).
    ``read_only``: the DuckDB connection reads nothing outside the trace directory
    (:func:`kvtrace.store.reader.lock_down`); ClickHouse is refused (its server's user rights
    govern what SQL may do there, and chDB runs with this process's file access)."""
    from kvtrace.store.reader import StoreError, connect

    url = clickhouse_url(args)
    if not url:
        return connect(traces_dir(getattr(args, "traces", None)), allow_empty=allow_empty, read_only=read_only)
    if read_only:
        raise StoreError(
            "--read-only confines DuckDB to a trace directory (--traces); on ClickHouse use a user with "
            "readonly = 1 instead"
        )
    try:
        from kvtrace.store.clickhouse.store import connect as ch_connect
    except ImportError as exc:
        raise StoreError(
            f"--clickhouse needs the clickhouse extra ({exc.name} is missing): pip install 'kvtrace[clickhouse]'"
        ) from None
    from kvtrace.store.clickhouse.backend import BackendError

    try:
        return ch_connect(url, clickhouse_table(args))
    except BackendError as exc:
        raise StoreError(str(exc)) from None
