"""What a session id may be, whatever carries it: the one check every layer applies.

A session id is chosen by clients (the ``X-Session-ID`` header, W3C baggage ``session.id``, the
body's ``conversation_id`` / ``prompt_cache_key``, the agent API, spans sent to the collector)
and reaches SQL, file names, reports and Prometheus labels, so it must be printable text (no
control, format or separator characters: no NUL, newline or U+2028) of at most
:data:`MAX_ID_BYTES` UTF-8 bytes.  The proxy answers a bad one with a 400; the agent API and the
collector replace or drop it and count it; none stores it raw.
"""

from __future__ import annotations

MAX_ID_BYTES = 256
"""The longest id, in UTF-8 bytes (the proxy's ``max_id_bytes`` default)."""


def id_problem(value: object, max_bytes: int = MAX_ID_BYTES) -> str | None:
    """Why ``value`` is not a valid session (or conversation, request) id, or None: not a
    string, empty, longer than ``max_bytes`` UTF-8 bytes, not UTF-8 text (an unpaired surrogate),
    or holding a character that is not printable (named by code point, never shown)."""
    if not isinstance(value, str):
        return f"is {type(value).__name__}, not a string"
    if not value:
        return "is empty"
    if len(value) > max_bytes:  # a character is at least one byte
        return f"is longer than {max_bytes} bytes"
    if not value.isascii():
        try:
            n = len(value.encode())
        except UnicodeEncodeError:
            return "is not valid UTF-8 text"
        if n > max_bytes:
            return f"is longer than {max_bytes} bytes"
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        return f"holds a non-printable character (U+{ord(bad):04X})"
    return None
