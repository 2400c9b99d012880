"""Measured cold starts per (accelerator, model cached on the node), as the forecast horizon needs them.

A bounded window of recent samples per key (the newest `window` of them) gives p50 and p90 by linear
interpolation between order statistics (numpy's default, type 7). Until a key has `min_samples` samples the
p90 falls back: first to the same accelerator with the other cache state, then to the spec's hint, then to a
conservative default, and the result says which it used.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

DEFAULT_COLD_START_S = 300.0


@dataclass(frozen=True, slots=True)
class ColdStartEstimate:
    p50_s: float
    p90_s: float
    samples: int
    source: str  # "measured", "measured (other cache state)", "hint", "default"


@dataclass(frozen=True, slots=True)
class ColdStarts:
    window: int = 50
    min_samples: int = 3
    samples: tuple[tuple[tuple[str, bool], tuple[float, ...]], ...] = field(default=())

    def add(self, accelerator: str, cached: bool, seconds: float) -> ColdStarts:
        if not np.isfinite(seconds) or seconds < 0:
            return self
        key = (accelerator, cached)
        table = dict(self.samples)
        table[key] = (*table.get(key, ()), float(seconds))[-self.window:]
        return ColdStarts(self.window, self.min_samples, tuple(sorted(table.items())))

    def add_all(self, samples: Iterable[tuple[str, bool, float]]) -> ColdStarts:
        out = self
        for accelerator, cached, seconds in samples:
            out = out.add(accelerator, cached, seconds)
        return out

    def measured_keys(self) -> tuple[tuple[str, bool], ...]:
        return tuple(k for k, _ in self.samples)

    def estimate(self, accelerator: str, cached: bool, hint_s: float | None = None) -> ColdStartEstimate:
        table = dict(self.samples)
        for key, source in (((accelerator, cached), "measured"), ((accelerator, not cached),
                                                                   "measured (other cache state)")):
            values = table.get(key, ())
            if len(values) >= self.min_samples:
                p50, p90 = _p50_p90(values)
                return ColdStartEstimate(p50, p90, len(values), source)
        if hint_s is not None:
            return ColdStartEstimate(hint_s, hint_s, 0, "hint")
        return ColdStartEstimate(DEFAULT_COLD_START_S, DEFAULT_COLD_START_S, 0, "default")

    def worst_p90_s(self, accelerators: Iterable[str], hint_s: float | None = None) -> float:
        """The horizon to plan with when a new replica may land on any of `accelerators`, cached or not."""
        values = [self.estimate(a, c, hint_s).p90_s for a in accelerators for c in (False, True)]
        return max(values, default=self.estimate("", False, hint_s).p90_s)

    def uncached_p90_s(self, accelerators: Iterable[str], hint_s: float | None = None) -> float:
        """A start that loads the weights from the network, on any of `accelerators`: the measured uncached starts,
        else the hint (else the default), never the cached ones (a cluster whose every start hit a node cache has
        not measured one). E.g. cached starts of 150 s measured, none uncached, a hint of 360 s: 360 s."""
        values = [e.p90_s for a in accelerators if (e := self.estimate(a, False)).source == "measured"]
        if values:
            return max(values)
        return hint_s if hint_s is not None else DEFAULT_COLD_START_S


@lru_cache(maxsize=4096)
def _p50_p90(values: tuple[float, ...]) -> tuple[float, float]:
    """p50 and p90 of a window of samples. Cached: every control cycle asks for the same few windows, which change
    only when a cold start is measured."""
    p50, p90 = np.percentile(np.asarray(values), [50, 90])
    return float(p50), float(p90)
