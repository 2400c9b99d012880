"""The simulated service: latency as load rises, cold starts, and the metrics each autoscaler really sees.

Latency model (per replica, requests spread evenly over ready replicas by the load balancer). A replica is a
fixed pipeline delay `base_latency_s` (prefill + decode of a typical request) followed by an M/M/1 queue with
service rate mu (its saturation throughput). At arrival rate lam < mu per replica the sojourn is
base + Exp(mu - lam), so the fraction of requests within the SLO latency L is

    P(latency <= L) = 1 - exp(-(mu - lam) * (L - base))

`target_rps_per_replica` (C, the spec's capacity at the SLO) is the load at which a replica keeps
`slo_fraction_at_target` (99 %) of its requests within L, which fixes mu:

    mu = C + ln(1 / (1 - 0.99)) / (L - base)

E.g. C = 8 rps, L = 2 s, base = 0.8 s: mu = 8 + 4.605 / 1.2 = 11.8 rps. So the SLO capacity (8) and the
saturation point (11.8) are distinct: between them latency degrades, above mu the queue grows without bound.
Overload is a fleet backlog Q (requests): Q <- max(0, Q + arrivals - n * mu * dt); a request arriving with a
backlog waits Q / (n * mu) first. With no ready replica at all, requests wait (as behind Knative's activator or
a gateway) until the first replica is ready; a request waiting longer than `request_timeout_s` fails, which
counts against the SLO like any late answer.

In flight (what a gauge of requests in service and queued shows; infer-ctl's burst guard reads it): the fleet
backlog plus each ready replica's requests by Little's law at the rate it serves (`ServiceModel.in_flight`).

Cold starts: lognormal around `cold_start_s` (sigma `cold_start_sigma`, clipped to [0.6, 2] x the median),
`cached_factor` of that when the replica lands on a node that served the model within `cache_ttl_s` (weights
in the node's page cache or local disk). GPU-hours run from creation (loading counts) to deletion.

The warm tiers (sleepers on warm hosts, node caches) are modelled by the fleet simulator (`infer_ctl.sim.warm`,
`infer_ctl.sim.fleet`); what a sleeper holds in host memory and a wake copies back are the weights of the
service's InferenceService (`infer_ctl.engine.cycle.weight_bytes`, as the controller counts them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from infer_ctl.forecast.series import FloatArray


@dataclass(frozen=True, slots=True)
class ServiceModel:
    target_rps_per_replica: float = 8.0
    slo_latency_s: float = 2.0
    base_latency_s: float = 0.8
    slo_fraction_at_target: float = 0.99
    cold_start_s: float = 120.0  # median, model not cached on the node
    cold_start_sigma: float = 0.2
    cached_factor: float = 0.35
    cache_ttl_s: float = 3600.0
    gpus_per_replica: int = 1
    request_timeout_s: float = 600.0
    min_replicas: int = 1
    max_replicas: int = 200
    accelerator: str = "H100-80GB"  # the catalog product a replica runs on (its cold starts are measured per product)
    # 0: a replica takes `gpus_per_replica` GPUs whole (sharing Exclusive); more: a memory share of this many GiB
    # of one GPU (sharing Shared, the model's memory; the fleet simulator packs shares onto devices)
    memory_share_gib: float = 0.0

    def __post_init__(self) -> None:
        if self.memory_share_gib < 0 or (self.memory_share_gib > 0 and self.gpus_per_replica != 1):
            raise ValueError(f"memory_share_gib: {self.memory_share_gib} GiB; a memory share is of one GPU and not "
                             f"negative (gpus_per_replica {self.gpus_per_replica})")
        if not self.slo_latency_s > self.base_latency_s:
            raise ValueError(
                f"the SLO latency ({self.slo_latency_s} s) must exceed the base latency ({self.base_latency_s} s)"
            )

    @property
    def service_rate_rps(self) -> float:
        """mu: a replica's saturation throughput (see the module docstring)."""
        return self.target_rps_per_replica + math.log(1.0 / (1.0 - self.slo_fraction_at_target)) / (
            self.slo_latency_s - self.base_latency_s
        )

    def mean_latency_s(self, rps_per_replica: float) -> float:
        mu = self.service_rate_rps
        return self.base_latency_s + 1.0 / max(mu - rps_per_replica, 0.02 * mu)

    def sample_cold_start_s(self, rng: np.random.Generator, cached: bool) -> float:
        median = self.cold_start_s * (self.cached_factor if cached else 1.0)
        factor = math.exp(self.cold_start_sigma * float(rng.standard_normal()))
        return median * min(2.0, max(0.6, factor))

    def in_flight(self, ready: int, arriving_rps: float, backlog: float) -> float:
        """Requests in the system, in service and queued: the fleet backlog (`infer_ctl.sim.run`'s fluid queue,
        what the replicas could not take) plus what the ready replicas hold by the latency model, Little's law at
        the recent arrival rate (per replica lam, at most mu: lam x (base + 1 / max(mu - lam, 0.02 mu))). E.g. 10
        ready replicas at 80 req/s (mu 11.8/s, base 0.8 s): 80 x (0.8 + 1 / 3.8) = 85 in flight; with 2,000
        requests backlogged behind them, 2,085."""
        if ready <= 0:
            return backlog
        mu = self.service_rate_rps
        lam = min(max(arriving_rps, 0.0) / ready, mu)
        return backlog + ready * lam * (self.base_latency_s + 1.0 / max(mu - lam, 0.02 * mu))

    def cold_start_quantile_s(self, q: float) -> float:
        """Quantile of the uncached cold start (the lognormal's, within the clip)."""
        return self.cold_start_s * min(2.0, math.exp(self.cold_start_sigma * NormalDist().inv_cdf(q)))


# --- the metric pipelines: what an autoscaler sees of the arrivals -----------------------------------------------


def cumulative_at(cum: FloatArray, times_s: FloatArray, tick_s: float) -> FloatArray:
    """Requests arrived by each time (cum[i] = arrivals in ticks 0..i-1; times between ticks interpolate)."""
    pos = np.clip(times_s / tick_s, 0, cum.size - 1)
    return np.interp(pos, np.arange(cum.size), cum)


def prometheus_rate(arrivals: FloatArray, tick_s: float, scrape_s: float, window_s: float) -> FloatArray:
    """`rate(requests_total[window])` as Prometheus evaluates it at the end of each tick, from counter samples
    scraped every `scrape_s`: (last - first sample in the window) / their time distance; NaN with fewer than
    two samples in the window (Prometheus returns nothing). E.g. scrape 15 s, window 60 s: the rate seen at
    t = 100 s is (C(90) - C(45)) / 45, so it lags the arrivals by about half the window plus one scrape."""
    n = arrivals.size
    cum = np.concatenate([[0.0], np.cumsum(arrivals)])
    t_end = (np.arange(n) + 1) * tick_s
    last = np.floor(t_end / scrape_s) * scrape_s
    first = np.floor((t_end - window_s) / scrape_s + 1.0 - 1e-9) * scrape_s
    first = np.maximum(first, 0.0)
    span = last - first
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = (cumulative_at(cum, last, tick_s) - cumulative_at(cum, first, tick_s)) / span
    return np.where(span > 0, rate, np.nan)


def window_rate(arrivals: FloatArray, tick_s: float, window_s: float) -> FloatArray:
    """The average arrival rate over the last `window_s` at the end of each tick (a direct scrape of the
    replicas or proxies every second, averaged, as Knative's autoscaler does)."""
    k = max(1, round(window_s / tick_s))
    cum = np.concatenate([[0.0], np.cumsum(arrivals)])
    idx = np.arange(1, arrivals.size + 1)
    lo = np.maximum(idx - k, 0)
    return np.asarray((cum[idx] - cum[lo]) / (np.minimum(idx, k) * tick_s), dtype=np.float64)
