"""Trace and span ids that stay unique when the application seeds Python's ``random``.

The SDK's ``RandomIdGenerator`` draws from the module-level ``random`` generator.  vLLM seeds it
(``random.seed(0)`` in every engine process, for reproducible sampling), so two engines — or a P
and a D inside one trace — produce the same span ids, and requests that arrive without trace
context get the same trace ids: parent links become ambiguous.  These ids come from a private
generator seeded from ``os.urandom``, reseeded in every forked child, so no ``random.seed`` call
and no fork repeats them; drawing stays as cheap as the SDK's.
"""

from __future__ import annotations

import os
import random

from opentelemetry.sdk.trace.id_generator import IdGenerator

_rng = random.Random(os.urandom(32))


def _reseed() -> None:
    _rng.seed(os.urandom(32))


os.register_at_fork(after_in_child=_reseed)


getrandbits = _rng.getrandbits  # reseeding keeps the object: hot paths may bind this once


def random_id(bits: int) -> int:
    """A non-zero id of ``bits`` bits (0 is OTel's invalid id)."""
    value = _rng.getrandbits(bits)
    while not value:
        value = _rng.getrandbits(bits)
    return value


class UnseededIdGenerator(IdGenerator):
    """:class:`IdGenerator` over :func:`random_id`: what :func:`kvtrace.configure` installs."""

    def generate_span_id(self) -> int:
        return random_id(64)

    def generate_trace_id(self) -> int:
        return random_id(128)
