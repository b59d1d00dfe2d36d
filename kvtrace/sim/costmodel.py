"""How long simulated work takes.  All results are in *simulated* seconds.

The engine (:mod:`kvtrace.sim.engine`) asks this module for durations and sleeps
``simulated / time_scale`` wall seconds, so a ``time_scale`` of 10 replays a 10-minute session in
one minute; with ``enabled=False`` (``--no-cost``) every duration is 0 and the engine never
sleeps.  Span durations are wall time: multiply by the ``kvtrace.sim.time_scale`` resource
attribute to read them in simulated time (TTLs and lease durations are configured in simulated
seconds and compressed the same way).

Formulas (``new`` = tokens computed, ``ctx`` = prompt length, ``B`` = bytes):

- prefill:  ``t = prefill_overhead_s + new * prefill_s_per_token + attn_s * new * ctx``
  (linear GEMM work plus the quadratic attention term);
- decode step (continuous batching; every active decode on the worker shares one step):
  ``t = decode_base_s + sum(ctx_i) * bytes_per_token / hbm_bytes_per_s``
  (weights read once per step, every running request's KV read once);
- transfer: ``t = link.overhead_s + B / link.bytes_per_s``.

Queueing: prefills on one worker run one at a time (FIFO), decodes share steps.

Presets (illustrative, one H100/H200-class GPU per worker):

| preset | KV bytes/token | prefill s/token | attn s/(token*ctx) | decode base s | HBM B/s |
|---|---|---|---|---|---|
| qwen3-32b | 262,144 (64 layers x 8 KV heads x 128 x 2 x 2 B, bf16) | 1/8000 | 6e-12 | 0.020 | 3.35e12 |
| glm5-fp8 | 51,168 (MLA, 78 layers x 656 B fp8_ds_mla) | 1/6000 | 4e-12 | 0.025 | 4.8e12 |

Links: ``efa-3200`` (3200 Gb/s = 400e9 B/s, 1 ms per transfer), ``tcp-100`` (100 Gb/s =
12.5e9 B/s, 5 ms per transfer).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Preset:
    name: str
    bytes_per_token: int
    prefill_s_per_token: float
    attn_s: float
    prefill_overhead_s: float
    decode_base_s: float
    hbm_bytes_per_s: float


@dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float
    overhead_s: float


PRESETS: dict[str, Preset] = {
    "qwen3-32b": Preset("qwen3-32b", 262_144, 1 / 8000, 6e-12, 0.002, 0.020, 3.35e12),
    "glm5-fp8": Preset("glm5-fp8", 51_168, 1 / 6000, 4e-12, 0.003, 0.025, 4.8e12),
}
LINKS: dict[str, Link] = {
    "efa-3200": Link("efa-3200", 3200e9 / 8, 0.001),
    "tcp-100": Link("tcp-100", 100e9 / 8, 0.005),
}


class CostModel:
    """Durations for one worker under ``preset`` and ``link``; all 0 when disabled."""

    def __init__(self, preset: str | Preset = "qwen3-32b", link: str | Link = "efa-3200", *, enabled: bool = True,
                 time_scale: float = 1.0) -> None:
        if isinstance(preset, str):
            if preset not in PRESETS:
                raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
            preset = PRESETS[preset]
        if isinstance(link, str):
            if link not in LINKS:
                raise ValueError(f"unknown link {link!r}; choose from {', '.join(LINKS)}")
            link = LINKS[link]
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.preset = preset
        self.link = link
        self.enabled = enabled
        self.time_scale = float(time_scale)

    @property
    def bytes_per_token(self) -> int:
        return self.preset.bytes_per_token

    def prefill_s(self, new: int, ctx: int) -> float:
        if not self.enabled or new <= 0:
            return 0.0
        p = self.preset
        return p.prefill_overhead_s + new * p.prefill_s_per_token + p.attn_s * new * ctx

    def decode_step_s(self, total_ctx: int) -> float:
        """One decode step with ``total_ctx`` tokens of KV across the running batch."""
        if not self.enabled:
            return 0.0
        p = self.preset
        return p.decode_base_s + total_ctx * p.bytes_per_token / p.hbm_bytes_per_s

    def transfer_s(self, nbytes: int) -> float:
        if not self.enabled:
            return 0.0
        return self.link.overhead_s + nbytes / self.link.bytes_per_s

    def wall(self, sim_s: float) -> float:
        """Wall seconds to sleep for ``sim_s`` simulated seconds."""
        return sim_s / self.time_scale

    def with_preset(self, **changes) -> "CostModel":
        """A copy with preset fields overridden (tests, what-if runs)."""
        return CostModel(replace(self.preset, **changes), self.link, enabled=self.enabled, time_scale=self.time_scale)
