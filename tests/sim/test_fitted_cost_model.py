"""The fitted cost model (kvtrace.sim.fitted) on hand-computed cases, the cluster running at it,
and ``kvtrace sim`` / ``kvtrace bench`` refusing --calibrate-from cleanly."""

from __future__ import annotations

import asyncio

import pytest

from kvtrace import semconv as sc
from kvtrace.cli import main
from kvtrace.sim.cluster import SimCluster
from kvtrace.sim.fitted import FittedCostModel

NUMBERS = {
    "prefill_fixed_s": 0.02,
    "prefill_per_token_s": 1e-4,
    "prefill_per_pair_s": 2e-8,
    "transfer_fixed_s": 0.001,
    "transfer_per_byte_s": 2e-9,
    "decode_fixed_s": 0.01,
    "decode_per_ctx_token_s": 1e-6,
    "bytes_per_token": 1024,
}


def test_fitted_formulas():
    m = FittedCostModel(NUMBERS, time_scale=4.0)
    pairs = 3000 * 1000 + 1000 * 1001 // 2  # 1000 new tokens after 3000 cached, causal
    assert m.prefill_s(1000, 4000) == pytest.approx(0.02 + 0.1 + pairs * 2e-8)
    assert m.prefill_s(0, 4000) == 0.0
    assert m.decode_step_s(8192) == pytest.approx(0.01 + 8192e-6)
    assert m.transfer_s(1_000_000) == pytest.approx(0.001 + 0.002)
    assert (m.bytes_per_token, m.wall(2.0), m.name) == (1024, 0.5, "calibrated")


def test_disabled_model_costs_nothing():
    m = FittedCostModel(NUMBERS, enabled=False)
    assert (m.prefill_s(1000, 4000), m.decode_step_s(10), m.transfer_s(10**9)) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"decode_fixed_s": -1.0}, "fitted cost model: negative or invalid decode_fixed_s"),
        ({"bytes_per_token": 0}, "fitted cost model: negative or invalid bytes_per_token"),
    ],
)
def test_bad_numbers_are_refused(change, message):
    with pytest.raises(ValueError) as exc:
        FittedCostModel({**NUMBERS, **change})
    assert str(exc.value) == message


def test_missing_numbers_are_named():
    with pytest.raises(ValueError, match="missing transfer_fixed_s, bytes_per_token"):
        FittedCostModel({k: v for k, v in NUMBERS.items() if k not in ("transfer_fixed_s", "bytes_per_token")})


def test_cluster_runs_every_worker_at_the_override():
    seen = {}

    def factory(service, attrs):
        from opentelemetry.sdk.trace import TracerProvider

        seen[attrs[sc.ENGINE_ROLE]] = attrs
        return TracerProvider()

    async def go():
        cost = FittedCostModel(NUMBERS, time_scale=3.0)
        async with SimCluster(cost_model=cost, tracer_provider_factory=factory, metrics=False, capacity_blocks=64) as c:
            return [e.cost for e in c.engines.values()], c.time_scale, c.preset

    costs, scale, preset = asyncio.run(go())
    assert len(costs) == 2 and all(
        isinstance(c, FittedCostModel) and c.numbers["decode_fixed_s"] == 0.01 for c in costs
    )
    assert (scale, preset) == (3.0, "calibrated")
    for role in (sc.ROLE_PREFILL, sc.ROLE_DECODE):
        attrs = seen[role]
        assert (attrs[sc.SIM_PRESET], attrs[sc.SIM_TIME_SCALE], attrs[sc.ENGINE_KV_POOL_BYTES]) == (
            "calibrated",
            3.0,
            64 * 16 * 1024,
        )


def test_sim_calibrate_from_a_directory_without_spans_is_a_clear_error(tmp_path, capsys):
    rc = main(["sim", "--calibrate-from", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert f"--calibrate-from {tmp_path}: " in err


def test_bench_calibrate_from_needs_arms(capsys):
    rc = main(["bench", "--scenario", "coding-agent", "--url", "http://127.0.0.1:1", "--calibrate-from", "x"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "error: --calibrate-from goes only with --arms" in err
