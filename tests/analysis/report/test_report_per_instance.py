"""A fleet's routing in spans, views and report: a 4P4D virtual arm and a served one (``kvtrace sim``
with two prefillers behind ``kvtrace proxy``) name, on every request, the policy, each turn's P and
D and why (``requests``), and ``kvtrace report`` breaks reuse down per instance; one P and one D
get no such section."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re

import pytest

from kvtrace import semconv as sc
from kvtrace.analysis.report import document
from kvtrace.bench.fleet import Fleet
from kvtrace.cli import main
from kvtrace.sim import virtual
from kvtrace.store import connect

pytest.importorskip("aiohttp")
pytest.importorskip("openai")

CFG = dict(input="mooncake-conversation", sessions=40, nonce="fleet")  # its 40 first sessions: 13 go on


def _report(run_dir: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", "--traces", run_dir]) == 0
    return out.getvalue()


def _section(report: str) -> list[list[str]]:
    if "## Reuse per instance" not in report:
        return []
    block = report.split("## Reuse per instance", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("| ") and not line.startswith("| role")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines if not set(line) <= set("|- ")]


def _requests(run_dir: str) -> list[tuple]:
    return (
        connect(run_dir)
        .execute(
            "SELECT routing, prefill_endpoint, prefill_route, decode_endpoint, decode_route, outcome FROM requests"
        )
        .fetchall()
    )


def _check(run_dir: str, policy: str, n_p: int, n_d: int, requests: int) -> str:
    """The checks every fleet's run passes; returns its report."""
    rows = _requests(run_dir)
    assert len(rows) == requests and {r[0] for r in rows} == {policy}
    assert len({r[1] for r in rows}) == n_p and len({r[3] for r in rows}) == n_d
    assert {r[2] for r in rows} <= set(sc.ROUTE_REASONS) and {r[4] for r in rows} <= set(sc.ROUTE_REASONS)
    report = _report(run_dir)
    section = _section(report)
    assert [r[0] for r in section] == [sc.ROLE_PREFILL] * n_p + [sc.ROLE_DECODE] * n_d
    assert sorted(r[1] for r in section[:n_p]) == sorted({r[1] for r in rows})
    for role in (0, 1):
        mine = section[:n_p] if role == 0 else section[n_p:]
        assert sum(int(r[2]) for r in mine) == requests
        for r in mine:  # "routed by": each reason's count, together the instance's requests
            counts = re.findall(r"([a-z_]+) (\d+)", r[3])
            assert {k for k, _ in counts} <= set(sc.ROUTE_REASONS) and sum(int(v) for _, v in counts) == int(r[2])
    pulls = sum(int(r[4]) for r in section[:n_p])
    assert pulls == sum(r[5] == sc.OUTCOME_PULLED for r in rows) and pulls > 0
    return report


def test_a_virtual_4p4d_arm_names_its_routing_in_spans_views_and_report(tmp_path):
    from kvtrace.bench import inproc

    run_dir = str(tmp_path / "v")
    fleet = Fleet(4, 4, sc.ROUTING_KV_AWARE)
    result = virtual.run(inproc.run_arm(run_dir, "qwen3-32b", True, True, "efa-3200", CFG, "A", 450.0, None, fleet))
    report = _check(run_dir, sc.ROUTING_KV_AWARE, 4, 4, len(result.requests))
    assert document.VIRTUAL_TIME_NOTE in report and document.TIME_NOTE not in report  # simulated times
    reasons = {(r[2], r[4]) for r in _requests(run_dir)}
    assert (sc.ROUTE_LAST_PREFILL, sc.ROUTE_HOLDER) in reasons  # later turns kept their P and D


def test_one_p_and_one_d_have_no_per_instance_section(tmp_path):
    from kvtrace.bench import inproc

    run_dir = str(tmp_path / "one")
    cfg = dict(CFG, sessions=6)
    virtual.run(inproc.run_arm(run_dir, "qwen3-32b", True, True, "efa-3200", cfg, "A", 450.0))
    assert "## Reuse per instance" not in _report(run_dir)


def test_the_served_proxy_over_two_prefillers_names_its_routing_the_same_way(tmp_path):
    from kvtrace.bench import arms, served

    run_dir = str(tmp_path / "w")
    fleet = Fleet(2, 2, sc.ROUTING_SESSION_AFFINE)
    cfg = dict(scenario="coding-agent", sessions=3, nonce="fleet", clients=3, time_scale=0.0)
    result = asyncio.run(
        served.run_arm(
            run_dir, "qwen3-32b", True, True, 20.0, arms.LINK, cfg, False, arms.CONVERSATION_TTL_S, None, fleet
        )
    )
    report = _check(run_dir, sc.ROUTING_SESSION_AFFINE, 2, 2, len(result.requests))
    assert document.TIME_NOTE in report and document.VIRTUAL_TIME_NOTE not in report  # served: wall times
    later = [r for r in _requests(run_dir) if r[4] == sc.ROUTE_HOLDER]
    assert later  # the sessions' later turns went to the D holding their KV
