"""The check between two control cycles (pure): whether a service's requests in flight, read every
`burstCheckSeconds` between its cycles, call for its cycle now rather than at the period's end, as Knative's
autoscaler evaluates its panic window every 2 s rather than once a minute.

One definition for the controller (`infer_ctl.controller.operator`'s burst-check timer, reading the requests in
flight through Prometheus or a scrape) and the simulators (`infer_ctl.sim.run`, `infer_ctl.sim.fleet`, reading
the simulated gauges as Prometheus last scraped them): after each cycle `burst_basis` says what the checks until
the next one compare with (None: no check for this service), and `burst_due` says whether a reading calls for a
cycle now. What that cycle then does is the burst guard's (`infer_ctl.decide.decision`); this only says when to
look.
"""

from __future__ import annotations

from dataclasses import dataclass

from infer_ctl.core import api
from infer_ctl.core.runtime import in_flight_query
from infer_ctl.decide.decision import burst_between_cycles, concurrency_target
from infer_ctl.engine.cycle import CyclePolicies


@dataclass(frozen=True, slots=True)
class BurstBasis:
    """What the checks between a cycle and the next compare the requests in flight with: that cycle's view."""

    target: float  # requests in flight one replica holds at the SLO (at the spec's targetRequestsPerReplica)
    wanted: int  # serving replicas the cycle wanted
    in_flight: float  # what the cycle read (NaN: nothing)
    max_replicas: int


def burst_basis(spec: api.InferenceServiceSpec, policies: CyclePolicies, *, wanted: int,
                in_flight: float) -> BurstBasis | None:
    """The basis a cycle leaves for the checks until the next one (`wanted`: the serving replicas it planned,
    `in_flight`: what it read); None where the checks read nothing: no check configured (`burstCheckSeconds` 0),
    no latency objective (no concurrency target), paused (`spec.replicas`), or, through Prometheus, no query of
    the requests in flight (`concurrencyQuery` "", or no engine profile to make one from)."""
    scaling = policies.policies.scaling
    latency_ms = spec.slo.latency_p95_ms
    if not scaling.burst_check_s or latency_ms is None or spec.replicas is not None:
        return None
    if policies.metric_source == "prometheus" and not in_flight_query(spec, policies.policies.runtimes,
                                                                       scaling.concurrency_query):
        return None
    target = concurrency_target(spec.scaling.target_rps_per_replica, latency_ms / 1000)
    assert target is not None  # a latency objective always gives one
    return BurstBasis(target, wanted, in_flight, spec.scaling.max_replicas)


def burst_due(basis: BurstBasis | None, *, in_flight: float, serving: int) -> str:
    """Why the reading `in_flight` (with `serving` replicas serving now) calls for a cycle now
    (`infer_ctl.decide.decision.burst_between_cycles`: a queue beyond what the replicas the last cycle wanted
    hold at the SLO, grown since its reading, below maxReplicas), or "" (no basis, or not)."""
    if basis is None:
        return ""
    return burst_between_cycles(in_flight, target=basis.target, serving=serving, wanted=basis.wanted,
                                max_replicas=basis.max_replicas, last_in_flight=basis.in_flight)
