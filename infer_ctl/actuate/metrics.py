"""The controller's own Prometheus metrics (prometheus_client), in a registry of their own.

Names follow Prometheus conventions (`_seconds`, `_total`, base units); every per-service series is labelled
`namespace` and `service`, so a dashboard can put a service's traffic, forecast and replicas on one panel.
"""

from __future__ import annotations

from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from infer_ctl.version import BuildInfo, build_info

COLD_START_BUCKETS_S = (5, 10, 20, 30, 60, 90, 120, 180, 240, 300, 420, 600, 900, 1200, 1800)
# beyond the default 10 s control period, so that a cycle slower than the period is measured, not just counted
RECONCILE_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60)


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, build: BuildInfo | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        svc = ["namespace", "service"]
        r = self.registry
        # the "info" pattern (as kube's kubernetes_build_info): always 1, its labels say which build runs, so that a
        # dashboard or alert can join on it and a rollout shows as the commit label changing
        self.build_info = Gauge("infer_ctl_build_info",
                                "Always 1: the controller's version, the git commit it was built from ('unknown' "
                                "when not known; '-dirty' when built from uncommitted changes) and its Python "
                                "version.", ["version", "commit", "python"], registry=r)
        info = build or build_info()
        self.build_info.labels(info.version, info.commit, info.python).set(1)
        self.replicas = Gauge("infer_ctl_replicas", "Replicas by state (Loading, Serving, Standby, Draining, Pending).",
                              [*svc, "state"], registry=r)
        self.desired = Gauge("infer_ctl_desired_replicas", "Replicas the controller wants, by role.",
                             [*svc, "role"], registry=r)
        self.forecast_rps = Gauge("infer_ctl_forecast_requests_per_second",
                                  "Forecast request rate at the cold-start horizon (mean and upper quantile).",
                                  [*svc, "bound"], registry=r)
        self.observed_rps = Gauge("infer_ctl_observed_requests_per_second", "Request rate the controller observed.",
                                  svc, registry=r)
        self.slo_attainment = Gauge("infer_ctl_slo_attainment",
                                    "Share of requests answered within the latency objective over the trailing "
                                    "window (status.slo; absent when not measured).", svc, registry=r)
        self.slo_objective = Gauge("infer_ctl_slo_objective",
                                   "The share of requests that should be within the latency objective.", svc,
                                   registry=r)
        self.decisions = Counter("infer_ctl_scaling_decisions", "Scaling decisions, by reason code.",
                                 [*svc, "reason"], registry=r)
        self.cold_start = Histogram("infer_ctl_cold_start_seconds", "Replica creation to Ready.",
                                    ["accelerator", "cached"], buckets=COLD_START_BUCKETS_S, registry=r)
        self.placement_failures = Counter("infer_ctl_placement_failures",
                                          "Replicas that could not be placed, by reason.", [*svc, "reason"],
                                          registry=r)
        self.fragmentation = Gauge("infer_ctl_gpu_fragmentation_ratio",
                                   "Share of free GPU capacity that the cluster's workload mix cannot use (FGD).",
                                   registry=r)
        self.gang_demand = Gauge("infer_ctl_pending_gang_gpus", "GPUs held back for pending gangs, by source.",
                                 ["source"], registry=r)
        self.cycle_errors = Counter("infer_ctl_cycle_errors",
                                    "Control cycles that failed (and were retried), by what failed: APIServer<status>, "
                                    "APIServerUnreachable, or the exception's type.",
                                    ["namespace", "service", "kind"], registry=r)
        self.operator_restarts = Counter("infer_ctl_operator_restarts",
                                         "Times kopf's operator stopped on an error (e.g. a watch refused) and was "
                                         "started again in the same process.", registry=r)
        self.burst_cycles = Counter("infer_ctl_burst_cycles",
                                    "Control cycles run before the period ended because a check between cycles "
                                    "read a queue forming (policies' burstCheckSeconds).", svc, registry=r)
        self.reconcile = Histogram("infer_ctl_reconcile_seconds", "One control cycle of one service.",
                                   buckets=RECONCILE_BUCKETS_S, registry=r)

    def set_replicas(self, namespace: str, service: str, by_state: Mapping[str, int]) -> None:
        for state, count in by_state.items():
            self.replicas.labels(namespace, service, state).set(count)

    def forget(self, namespace: str, service: str) -> None:
        """Drop a deleted service's series so that they do not linger at their last values."""
        per_service: tuple[tuple[Gauge | Counter, tuple[str, ...]], ...] = (
            (self.replicas, ("state",)), (self.desired, ("role",)), (self.forecast_rps, ("bound",)),
            (self.observed_rps, ()), (self.slo_attainment, ()), (self.slo_objective, ()),
            (self.decisions, ("reason",)), (self.placement_failures, ("reason",)),
            (self.cycle_errors, ("kind",)),
        )
        for metric, extra in per_service:
            children = {tuple(sample.labels[n] for n in ("namespace", "service", *extra))
                        for family in metric.collect() for sample in family.samples}
            for labels in children:
                if labels[:2] == (namespace, service):
                    metric.remove(*labels)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serve /metrics on a background thread (the controller's metrics port) until `stop_serving`."""
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        self._server: WSGIServer | None = server

    def stop_serving(self) -> None:
        server: WSGIServer | None = getattr(self, "_server", None)
        self._server = None
        if server is not None:
            server.shutdown()
            server.server_close()
