"""What every simulated autoscaler is given and returns: its metric `Pipeline`, its `Observation` and the
`SimPolicy` protocol (`decide(obs, state) -> (desired_replicas, state)`).

Every policy is `decide(obs, state) -> (desired_replicas, state)` over a frozen state, called every
`period_s` of simulated time (rounded up to the simulator's tick), and declares the metric pipeline it reads
(`Pipeline`): a Prometheus `rate()` over scraped counters, or a direct scrape of the replicas averaged over a
window. Each policy is given the same notion of per-replica capacity, set the way its users are told to set it:
the target is the service's capacity at the SLO (`target_rps_per_replica`, C), or for Ray Serve the equivalent
number of ongoing requests (Little's law at load C). No baseline parameter is tuned: where a peer documents a
default, that default is used, and the docstrings say where it comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
class Pipeline:
    """How a policy sees the request rate: `prometheus` (rate over counters scraped every `scrape_s`) or
    `direct` (a per-second scrape averaged over `window_s`)."""

    kind: str
    window_s: float
    scrape_s: float = 15.0


@dataclass(frozen=True, slots=True)
class Observation:
    now_s: float
    ready: int
    loading: int
    metric_rps: float  # the policy's pipeline value (total requests/s); NaN when missing
    panic_rps: float = math.nan  # a second, shorter window where the policy has one (Knative)
    ongoing: float = 0.0  # ongoing requests (queued + running) over all replicas, averaged over `ongoing_window_s`
    waiting: float = 0.0  # requests held with no ready replica (activator / gateway / handle queue)
    cold_start_p90_s: float = math.nan  # measured over this policy's own cold starts

    @property
    def total(self) -> int:
        return self.ready + self.loading


class SimPolicy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def period_s(self) -> float: ...

    @property
    def pipelines(self) -> tuple[Pipeline, ...]: ...

    def initial_state(self) -> Any: ...

    def decide(self, obs: Observation, state: Any) -> tuple[int, Any]: ...
