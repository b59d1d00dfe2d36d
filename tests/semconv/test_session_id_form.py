"""One rule for what a session id may be: printable UTF-8 text, no control characters, at most
``MAX_ID_BYTES`` bytes (kvtrace.semconv.ids.id_problem)."""

from __future__ import annotations

import pytest

from kvtrace.semconv.ids import MAX_ID_BYTES, id_problem


@pytest.mark.parametrize("value", ["s1", "conv-ÄÖ-会話", "a b|<c>", "x" * MAX_ID_BYTES, "é" * (MAX_ID_BYTES // 2)])
def test_printable_bounded_ids_pass(value):
    assert id_problem(value) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("\x00\n\ufffd", "holds a non-printable character (U+0000)"),  # baggage session.id=%00%0a%ff
        ("a\nb", "holds a non-printable character (U+000A)"),
        ("tab\there", "holds a non-printable character (U+0009)"),
        ("del\x7f", "holds a non-printable character (U+007F)"),
        ("line\u2028sep", "holds a non-printable character (U+2028)"),
        ("bidi\u202eoverride", "holds a non-printable character (U+202E)"),
        ("a\ud800b", "is not valid UTF-8 text"),
        ("x" * (MAX_ID_BYTES + 1), f"is longer than {MAX_ID_BYTES} bytes"),
        ("é" * (MAX_ID_BYTES // 2 + 1), f"is longer than {MAX_ID_BYTES} bytes"),
        ("", "is empty"),
        (42, "is int, not a string"),
    ],
)
def test_each_bad_id_is_named_without_showing_it(value, problem):
    assert id_problem(value) == problem
