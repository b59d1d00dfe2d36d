"""Quoting for the SQL kvtrace writes: the one place literals and identifiers are built.

Every view (:mod:`kvtrace.store.views`), named query (:mod:`kvtrace.analysis`) and ClickHouse
statement (:mod:`kvtrace.store.clickhouse`) that puts a constant into SQL text goes through
:func:`literal` / :func:`ident`; values that come from users are always bound parameters, never
text.  The constants are :mod:`kvtrace.semconv` names and enum values, table names and file
paths.  Two dialects: DuckDB (standard SQL: a quote is doubled, backslashes are plain
characters) and ClickHouse (backslash is an escape character there, so it is doubled too).

The attribute accessors read the store's three attribute maps (:mod:`kvtrace.store.schema`):
strings from ``SpanAttributes``, integers from ``SpanAttributesInt``, floats from
``SpanAttributesFloat`` (falling back to the int map, since a float attribute that happened to be
integral may have been recorded as an int).
"""

from __future__ import annotations

from kvtrace import semconv as sc

DUCKDB, CLICKHOUSE = "duckdb", "clickhouse"


def glob_escape(path: str) -> str:
    """``path`` as a DuckDB glob that matches only itself (DuckDB expands ``*``, ``?`` and ``[``
    even inside a list of files)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def literal(value: str, dialect: str = DUCKDB) -> str:
    """``value`` as a single-quoted SQL string literal."""
    text = str(value)
    if dialect == CLICKHOUSE:
        text = text.replace("\\", "\\\\")
    elif dialect != DUCKDB:
        raise ValueError(f"unknown SQL dialect {dialect!r}")
    return "'" + text.replace("'", "''") + "'"


def literals(values, dialect: str = DUCKDB) -> str:
    """``'a', 'b', ...`` for an ``IN (...)`` list."""
    return ", ".join(literal(v, dialect) for v in values)


def ident(name: str) -> str:
    """A double-quoted identifier (both dialects); ``db.table`` is quoted part by part."""
    if not name or any(not part for part in name.split(".")):
        raise ValueError(f"not an identifier: {name!r}")
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split("."))


def str_attr(key: str) -> str:
    """A span attribute as VARCHAR (NULL when absent)."""
    return f"SpanAttributes[{literal(key)}]"


def int_attr(key: str) -> str:
    """An int span attribute as BIGINT."""
    return f"SpanAttributesInt[{literal(key)}]"


def float_attr(key: str) -> str:
    """A numeric span attribute as DOUBLE (float map, else the int map)."""
    return f"COALESCE(SpanAttributesFloat[{literal(key)}], CAST(SpanAttributesInt[{literal(key)}] AS DOUBLE))"


def bool_attr(key: str) -> str:
    """A bool span attribute (stored as ``'true'``/``'false'``) as BOOLEAN."""
    return f"({str_attr(key)} = 'true')"


def str_attr_or_resource(key: str) -> str:
    """A span attribute, else the same key among the resource attributes."""
    return f"COALESCE({str_attr(key)}, ResourceAttributes[{literal(key)}])"


def time_scale() -> str:
    """The span's simulator time scale (model time / wall time) from its resource, 1.0 when absent
    (real engines): a wall duration times this is model time."""
    return f"coalesce(TRY_CAST(ResourceAttributes[{literal(sc.SIM_TIME_SCALE)}] AS DOUBLE), 1.0)"
