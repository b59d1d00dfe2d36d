"""A cost model at rates fitted to recorded traces (``kvtrace sim --calibrate-from DIR``).

:func:`kvtrace.analysis.calibrate.calibrate` fits the numbers (the analysis layer, which the
simulator does not import); the command passes them here as a plain dict
(:meth:`~kvtrace.analysis.calibrate.Calibration.cost_numbers`).  The interface is the one the
engine uses of :class:`kvtrace.sim.costmodel.CostModel`, every result in *simulated* seconds::

    prefill_s(new, ctx)     = prefill_fixed_s + prefill_per_token_s * new + prefill_per_pair_s * pairs(new, ctx)
    decode_step_s(total)    = decode_fixed_s + decode_per_ctx_token_s * total   (total: the batch's context)
    transfer_s(nbytes)      = transfer_fixed_s + transfer_per_byte_s * nbytes

``pairs`` are causal attention's (query, key) pairs over the new tokens
(:func:`kvtrace.sim.costmodel.causal_pairs`, no window).  ``enabled=False`` makes every duration 0.
"""

from __future__ import annotations

from kvtrace.sim.costmodel import causal_pairs

NAME = "calibrated"  # the kvtrace.sim.preset resource attribute of a calibrated run
FIELDS = (
    "prefill_fixed_s",
    "prefill_per_token_s",
    "prefill_per_pair_s",
    "transfer_fixed_s",
    "transfer_per_byte_s",
    "decode_fixed_s",
    "decode_per_ctx_token_s",
)


class FittedCostModel:
    """Durations at fitted rates (``numbers``: :data:`FIELDS` in seconds, plus ``bytes_per_token``)."""

    def __init__(self, numbers: dict, *, enabled: bool = True, time_scale: float = 1.0, name: str = NAME) -> None:
        missing = [k for k in (*FIELDS, "bytes_per_token") if k not in numbers]
        if missing:
            raise ValueError(f"fitted cost model: missing {', '.join(missing)}")
        bad = [k for k in FIELDS if not float(numbers[k]) >= 0]
        if bad or int(numbers["bytes_per_token"]) <= 0:
            raise ValueError(f"fitted cost model: negative or invalid {', '.join(bad) or 'bytes_per_token'}")
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.numbers = {k: float(numbers[k]) for k in FIELDS}
        self._bytes_per_token = int(numbers["bytes_per_token"])
        self.enabled = enabled
        self.time_scale = float(time_scale)
        self.name = name

    @property
    def bytes_per_token(self) -> int:
        return self._bytes_per_token

    def prefill_s(self, new: int, ctx: int) -> float:
        if not self.enabled or new <= 0:
            return 0.0
        n = self.numbers
        return n["prefill_fixed_s"] + n["prefill_per_token_s"] * new + n["prefill_per_pair_s"] * causal_pairs(new, ctx)

    def decode_step_s(self, total_ctx: int) -> float:
        if not self.enabled:
            return 0.0
        return self.numbers["decode_fixed_s"] + self.numbers["decode_per_ctx_token_s"] * total_ctx

    def transfer_s(self, nbytes: int) -> float:
        if not self.enabled:
            return 0.0
        return self.numbers["transfer_fixed_s"] + self.numbers["transfer_per_byte_s"] * nbytes

    def wall(self, sim_s: float) -> float:
        """Wall seconds to sleep for ``sim_s`` simulated seconds."""
        return sim_s / self.time_scale
