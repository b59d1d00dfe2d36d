"""Random distributions for workloads, with vLLM's multi-turn benchmark JSON shape.

The five kinds and their fields are those of vLLM's ``benchmarks/multi_turn/bench_dataset.py``
(``get_random_distribution``): ``constant`` (value), ``uniform`` (min, max; integers when both
are integers, inclusive), ``zipf`` (alpha, max), ``poisson`` (alpha, max), ``lognormal``
(average [+ median_ratio] or mean + sigma; max).  As there, a lognormal given by ``average`` is
rescaled so that each *batch* of samples has that mean.  Sampling uses a caller-supplied
``random.Random`` (seeded by the bench), not numpy's global state, so one seed gives one workload.

Used by :mod:`kvtrace.bench.scenarios` (tool waits, app work, token counts) and
:mod:`kvtrace.bench.vllm_inputs` (``generate_conversations`` configs).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


class DistributionError(ValueError):
    """A distribution spec that cannot be used (one-line message)."""


@dataclass(frozen=True)
class Dist:
    """Base: ``sample(rng, n)`` returns ``n`` values; ``one(rng)`` a single value."""

    def sample(self, rng: random.Random, n: int = 1) -> list:
        return [self._one(rng) for _ in range(n)]

    def one(self, rng: random.Random):
        return self.sample(rng, 1)[0]

    def _one(self, rng: random.Random):  # pragma: no cover - abstract
        raise NotImplementedError

    def to_dict(self) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class Constant(Dist):
    value: float

    def _one(self, rng):
        return self.value

    def to_dict(self) -> dict:
        return {"distribution": "constant", "value": self.value}


@dataclass(frozen=True)
class Uniform(Dist):
    min: float
    max: float

    @property
    def is_integer(self) -> bool:
        return isinstance(self.min, int) and isinstance(self.max, int)

    def _one(self, rng):
        if self.is_integer:
            return rng.randint(self.min, self.max)
        return rng.uniform(self.min, self.max)

    def to_dict(self) -> dict:
        return {"distribution": "uniform", "min": self.min, "max": self.max}


@dataclass(frozen=True)
class Zipf(Dist):
    alpha: float
    max: int | None = None

    def _one(self, rng):
        # numpy's rejection sampler (Devroye), valid for alpha > 1
        am1 = self.alpha - 1.0
        b = 2.0**am1
        while True:
            u = 1.0 - rng.random()
            v = rng.random()
            x = math.floor(u ** (-1.0 / am1))
            if x < 1 or x > 2**62:
                continue
            t = (1.0 + 1.0 / x) ** am1
            if v * x * (t - 1.0) / (b - 1.0) <= t / b:
                return min(int(x), self.max) if self.max else int(x)

    def to_dict(self) -> dict:
        return {"distribution": "zipf", "alpha": self.alpha, **({"max": self.max} if self.max else {})}


@dataclass(frozen=True)
class Poisson(Dist):
    alpha: float
    max: int | None = None

    def _one(self, rng):
        value = _poisson(rng, self.alpha)
        return min(value, self.max) if self.max else value

    def to_dict(self) -> dict:
        return {"distribution": "poisson", "alpha": self.alpha, **({"max": self.max} if self.max else {})}


@dataclass(frozen=True)
class Lognormal(Dist):
    """Either ``average`` (+ ``median_ratio``, default 0.85) or ``mean`` + ``sigma`` of the
    underlying normal.  Integer samples (rounded), as in vLLM."""

    mean: float | None = None
    sigma: float | None = None
    average: float | None = None
    median_ratio: float | None = None
    max: int | None = None

    def __post_init__(self) -> None:
        if self.average is not None:
            if self.average < 1:
                raise DistributionError("lognormal average must be >= 1")
            if self.mean or self.sigma:
                raise DistributionError("lognormal takes average or mean/sigma, not both")
            ratio = 0.85 if self.median_ratio is None else self.median_ratio
            if not 0 < ratio < 1:
                raise DistributionError("lognormal median_ratio must be in (0, 1)")
        elif self.mean is None or self.sigma is None:
            raise DistributionError("lognormal needs average, or both mean and sigma")
        elif self.mean <= 0 or self.sigma < 0:
            raise DistributionError("lognormal mean must be > 0 and sigma >= 0")

    def _params(self) -> tuple[float, float]:
        if self.average is None:
            return float(self.mean), float(self.sigma)
        ratio = 0.85 if self.median_ratio is None else self.median_ratio
        median = self.average * ratio
        return math.log(median), math.sqrt(2 * math.log(self.average / median))

    def sample(self, rng: random.Random, n: int = 1) -> list:
        mu, sigma = self._params()
        values = [rng.lognormvariate(mu, sigma) for _ in range(n)]
        if self.average is not None and values:
            scale = self.average / (sum(values) / len(values))
            values = [v * scale for v in values]
        if self.max:
            values = [min(v, self.max) for v in values]
        return [int(round(v)) for v in values]

    def to_dict(self) -> dict:
        out: dict = {"distribution": "lognormal"}
        if self.average is not None:
            out["average"] = self.average
            if self.median_ratio is not None:
                out["median_ratio"] = self.median_ratio
        else:
            out.update(mean=self.mean, sigma=self.sigma)
        if self.max:
            out["max"] = self.max
        return out


def _poisson(rng: random.Random, lam: float) -> int:
    """Knuth below 30, else Hormann's PTRS transformed rejection (what numpy uses)."""
    if lam <= 0:
        return 0
    if lam < 30:
        limit, k, p = math.exp(-lam), 0, rng.random()
        while p > limit:
            k += 1
            p *= rng.random()
        return k
    slam, loglam = math.sqrt(lam), math.log(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    vr = 0.9277 - 3.6224 / (b - 2)
    while True:
        u = rng.random() - 0.5
        v = rng.random()
        us = 0.5 - abs(u)
        k = math.floor((2 * a / us + b) * u + lam + 0.43)
        if us >= 0.07 and v <= vr:
            return int(k)
        if k < 0 or (us < 0.013 and v > us):
            continue
        if math.log(v) + math.log(inv_alpha) - math.log(a / (us * us) + b) <= -lam + k * loglam - math.lgamma(k + 1):
            return int(k)


def _need(conf: dict, field: str, where: str):
    if field not in conf:
        raise DistributionError(f"{where}: missing field '{field}'")
    value = conf[field]
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise DistributionError(f"{where}: '{field}' must be a number")
    return value


def from_dict(conf: object, where: str = "distribution") -> Dist:
    """Parse vLLM's ``{"distribution": ..., ...}`` object (a bare number means constant)."""
    if isinstance(conf, (int, float)) and not isinstance(conf, bool):
        return Constant(conf)
    if not isinstance(conf, dict):
        raise DistributionError(f"{where}: expected an object with a 'distribution' field")
    kind = conf.get("distribution")
    opt_max = conf.get("max")
    if kind == "constant":
        return Constant(_need(conf, "value", where))
    if kind == "uniform":
        lo, hi = _need(conf, "min", where), _need(conf, "max", where)
        if lo < 0 or lo > hi:
            raise DistributionError(f"{where}: uniform needs 0 <= min <= max")
        return Uniform(lo, hi)
    if kind == "zipf":
        alpha = _need(conf, "alpha", where)
        if alpha <= 1:
            raise DistributionError(f"{where}: zipf alpha must be > 1")
        return Zipf(alpha, opt_max)
    if kind == "poisson":
        return Poisson(_need(conf, "alpha", where), opt_max)
    if kind == "lognormal":
        if "average" in conf:
            if "mean" in conf or "sigma" in conf:
                raise DistributionError(f"{where}: lognormal takes average or mean/sigma, not both")
            return Lognormal(average=_need(conf, "average", where), median_ratio=conf.get("median_ratio"), max=opt_max)
        return Lognormal(mean=_need(conf, "mean", where), sigma=_need(conf, "sigma", where), max=opt_max)
    raise DistributionError(f"{where}: unknown distribution {kind!r} (constant, uniform, zipf, poisson, lognormal)")
