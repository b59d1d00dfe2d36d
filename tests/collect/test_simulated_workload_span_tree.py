"""The shared simulated workload (:mod:`support.sim_workload`) writes the whole span tree: every
turn's proxy and engine spans, parent links inside the trace, one service per component."""

from __future__ import annotations

from kvtrace import semconv as sc

from support.sim_workload import PROXY_SERVICE, read_rows, run_workload


def test_workload_produces_the_full_span_tree(tmp_path):
    answers = run_workload(traces_dir=tmp_path, sessions=1, turns=2)
    rows = read_rows(tmp_path)
    names = sorted(r["SpanName"] for r in rows)
    per_turn = [
        sc.SPAN_PROXY_REQUEST,
        sc.SPAN_PROXY_PREFILL,
        sc.SPAN_PROXY_DECODE,
        sc.SPAN_ENGINE_PREFILL,
        sc.SPAN_ENGINE_DECODE,
    ]
    for name in per_turn:
        assert names.count(name) == 2, name
    assert len(answers) == 2
    ids = {r["SpanId"] for r in rows}
    assert all(r["ParentSpanId"] in ids for r in rows if r["SpanName"] != sc.SPAN_PROXY_REQUEST)
    from kvtrace.sim.cluster import SERVICE

    assert {r["ResourceAttributes"][sc.SERVICE_NAME] for r in rows} == {PROXY_SERVICE, *SERVICE.values()}
