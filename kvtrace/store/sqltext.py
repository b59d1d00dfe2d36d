"""SQL text for attribute lookups, shared by the store's view definitions.

Names come from :mod:`kvtrace.semconv` (module constants, never user input); each helper returns
the SQL expression reading one attribute of a span row of the ``spans`` view (or the raw table).
"""

from __future__ import annotations


def literal(value: str) -> str:
    """A semconv constant as a SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def str_attr(key: str) -> str:
    return f"SpanAttributes[{literal(key)}]"


def int_attr(key: str) -> str:
    return f"SpanAttributesInt[{literal(key)}]"


def float_attr(key: str) -> str:
    """A float attribute (an int one cast, when the emitter wrote a whole number)."""
    return f"COALESCE(SpanAttributesFloat[{literal(key)}], CAST(SpanAttributesInt[{literal(key)}] AS DOUBLE))"


def bool_attr(key: str) -> str:
    return f"(SpanAttributes[{literal(key)}] = 'true')"


def span_or_resource(key: str) -> str:
    """Span attribute, else resource attribute."""
    return f"COALESCE(SpanAttributes[{literal(key)}], ResourceAttributes[{literal(key)}])"
