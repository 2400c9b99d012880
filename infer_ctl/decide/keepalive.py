"""The scale-to-zero keep-alive, learned from the service's own idle-time histogram.

An idle period is the time from the observed rate dropping to zero until traffic comes back. After the rate
drops to zero, keeping one replica alive for K seconds costs min(gap, K) GPU-seconds; if the gap outlasts K, the
service pays a wake-up: the cold start's GPU-seconds plus the requests that wait for it, priced as
`wake_penalty_factor` cold starts. The keep-alive is the K that minimises the expected cost over the observed
gaps (a ski-rental choice made with the histogram instead of the worst case):

    cost(K) = sum over gaps g of  min(g, K) + [g > K] * cold_start_s * (1 + wake_penalty_factor)

E.g. gaps of 40 s (bursty traffic pausing) and a 120 s cold start with factor 4: K = 40 s costs 40 per gap,
K = 0 costs 600 per gap, so the keep-alive covers them. Nightly gaps of 10 h: K = 0 costs 600 a night, any K
that covers them costs 36,000, so the service scales to zero at once (and the forecast wakes it before the
morning). Before `min_samples` gaps have been seen, the default keep-alive applies.

The histogram has fixed log-spaced bins (30 s to 8 days, each 25% wider than the last), so it stays a small
tuple of counts however long the service runs; each gap counts at its bin's upper edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_FIRST_EDGE_S = 30.0
_GROWTH = 1.25
_N_BINS = 57  # 30 s * 1.25**56 = 8.5 days

EDGES_S: tuple[float, ...] = tuple(_FIRST_EDGE_S * _GROWTH**i for i in range(_N_BINS))


def bin_of(gap_s: float) -> int:
    """Index of the first edge >= gap_s (the last bin takes everything longer)."""
    if gap_s <= _FIRST_EDGE_S:
        return 0
    return min(_N_BINS - 1, math.ceil(math.log(gap_s / _FIRST_EDGE_S) / math.log(_GROWTH) - 1e-12))


@dataclass(frozen=True, slots=True)
class IdleHistogram:
    counts: tuple[int, ...] = (0,) * _N_BINS

    @property
    def samples(self) -> int:
        return sum(self.counts)

    def add(self, gap_s: float) -> IdleHistogram:
        counts = list(self.counts)
        counts[bin_of(gap_s)] += 1
        return IdleHistogram(tuple(counts))

    def keep_alive_s(
        self,
        cold_start_s: float,
        default_s: float,
        wake_penalty_factor: float = 4.0,
        min_samples: int = 5,
        max_s: float = 4 * 3600.0,
    ) -> float:
        """The cost-minimising keep-alive (see the module docstring), at most `max_s`."""
        if self.samples < min_samples:
            return default_s
        edges = np.asarray(EDGES_S)
        counts = np.asarray(self.counts, dtype=np.float64)
        candidates = np.concatenate([[0.0], edges[edges <= max_s]])
        wake_cost_s = cold_start_s * (1.0 + wake_penalty_factor)
        # cost[k] = sum_g counts[g] * (min(edge_g, K_k) + [edge_g > K_k] * wake_cost)
        held = np.minimum(edges[None, :], candidates[:, None])
        woken = (edges[None, :] > candidates[:, None]) * wake_cost_s
        cost = ((held + woken) * counts[None, :]).sum(axis=1)
        return float(candidates[int(np.argmin(cost))])
