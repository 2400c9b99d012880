"""The controller's metrics of a service after each cycle: replicas by state, desired counts, the decision, the
observed and forecast rate, the measured attainment and its objective; no series while a value is unknown (a
stale last value would hide the gap from alerts)."""

from __future__ import annotations

import contextlib
import math
from collections import Counter

from infer_ctl.actuate.metrics import ControllerMetrics
from infer_ctl.controller.observe import Observed
from infer_ctl.controller.snapshot import ClusterView
from infer_ctl.core import api
from infer_ctl.engine.cycle import CyclePlan


def export_metrics(metrics: ControllerMetrics, view: ClusterView, o: Observed, plan: CyclePlan) -> None:
    ns, name = o.svc.meta.namespace, o.svc.meta.name
    states = Counter(str(o.state(r)) for r in o.replicas)
    metrics.set_replicas(ns, name, {s.value: states.get(s.value, 0) for s in api.ReplicaState})
    metrics.desired.labels(ns, name, "serving").set(plan.serving)
    metrics.desired.labels(ns, name, "standby").set(plan.standby)
    metrics.decisions.labels(ns, name, plan.reason).inc()
    if (snapshot := view.latest) is not None:
        metrics.fragmentation.set(snapshot.fragmentation_ratio)
    by_source = Counter[str]()
    for gang in view.pending_gangs:
        by_source[gang.source] += gang.gpus
    for source in ("PodGroup", "Workload"):
        metrics.gang_demand.labels(source).set(by_source[source])
    if not o.rates.error and not math.isnan(plan.output.observed_rps):
        metrics.observed_rps.labels(ns, name).set(plan.output.observed_rps)
    else:  # no rate: no series (a stale last value would hide the gap from alerts)
        with contextlib.suppress(KeyError):
            metrics.observed_rps.remove(ns, name)
    # measured attainment and its objective: no series while unknown (an alert compares the two)
    slo = o.slo
    for gauge, value in ((metrics.slo_attainment, None if slo is None else slo.attainment),
                         (metrics.slo_objective, None if slo is None else slo.objective)):
        if value is not None:
            gauge.labels(ns, name).set(value)
        else:
            with contextlib.suppress(KeyError):
                gauge.remove(ns, name)
    fc = plan.output.forecast
    if fc is not None:
        horizon = plan.output.decision.horizon_s
        metrics.forecast_rps.labels(ns, name, "upper").set(fc.peak_upper_rps(horizon, o.now.timestamp()))
        metrics.forecast_rps.labels(ns, name, "mean").set(fc.mean_at(o.now.timestamp() + horizon))
