"""Span and trace ids stay unique when the application seeds Python's ``random`` (vLLM seeds it
with 0 in every engine process) and across forked children."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

import kvtrace
from kvtrace.emit.deferred import DeferredSpans
from kvtrace.telemetry import ids

SCRIPT = """
import random, kvtrace
random.seed(0)
provider = kvtrace.configure("seeded", exporters=[])
tracer = provider.get_tracer("t")
with tracer.start_as_current_span("a") as a:
    with tracer.start_as_current_span("b") as b:
        print(a.get_span_context().trace_id, a.get_span_context().span_id, b.get_span_context().span_id)
"""


def _ids_of_a_seeded_process() -> tuple[int, ...]:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120)
    return tuple(int(x) for x in out.stdout.split())


def test_two_processes_that_seed_random_alike_get_different_ids():
    first, second = _ids_of_a_seeded_process(), _ids_of_a_seeded_process()
    assert len(set(first) | set(second)) == 6, (first, second)


def test_the_configured_provider_ignores_random_seed():
    provider = kvtrace.configure("seeded-here", exporters=[], otlp="off", handle_sigterm=False)
    tracer = provider.get_tracer("t")
    seen = []
    for _ in range(2):
        random.seed(0)
        with tracer.start_as_current_span("s") as span:
            seen.append((span.get_span_context().trace_id, span.get_span_context().span_id))
    assert seen[0][0] != seen[1][0] and seen[0][1] != seen[1][1]
    assert isinstance(provider.id_generator, ids.UnseededIdGenerator)
    provider.shutdown()


def test_deferred_spans_ignore_random_seed(tracer_provider):
    sink = DeferredSpans(tracer_provider.get_tracer("t"))
    random.seed(0)
    first = sink.start("a", None, {}, 1)
    random.seed(0)
    second = sink.start("b", None, {}, 2)
    assert (first.trace_id, first.span_id) != (second.trace_id, second.span_id)
    sink.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_draws_other_ids_than_its_parent():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then out without running pytest's teardown
        os.write(write, str(ids.random_id(64)).encode())
        os._exit(0)
    os.close(write)
    parent_id = ids.random_id(64)
    os.waitpid(pid, 0)
    child_id = int(os.read(read, 64))
    os.close(read)
    assert child_id != parent_id
    assert 0 < child_id < 2**64
