"""What the controller runs with (`Settings`: the policy files and where it reads), and what every service's
cycle runs with (`cycle_policies`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_ctl.core import api
from infer_ctl.core.policy import Policies
from infer_ctl.core.runtime import ServiceRuntime, service_runtime
from infer_ctl.engine.cycle import CyclePolicies
from infer_ctl.engine.step import EngineConfig
from infer_ctl.kube.modelcache import DEFAULT_NAMESPACE
from infer_ctl.place.plugins import placement_engine


@dataclass
class Settings:
    policies: Policies
    prometheus_url: str | None = None
    # without Prometheus: a gateway's /metrics, read for a service at zero replicas (nothing else to scrape then)
    gateway_metrics_url: str | None = None
    engine_config: EngineConfig = field(default_factory=EngineConfig)
    seed: int = 0
    snapshot_max_age_s: float = 1.0  # how stale the shared cluster snapshot for placement may get
    # the controller's own namespace, where the node-side reporters record the nodes' model caches
    node_cache_namespace: str = DEFAULT_NAMESPACE

    @property
    def period_s(self) -> float:
        return self.policies.scaling.control_period_s


def cycle_policies(settings: Settings) -> CyclePolicies:
    """What every service's cycle runs with: the policy files, the placement profile they configure, the engine's
    settings, and where the rate comes from (the spec's Prometheus query, or the replicas' own counters)."""
    return CyclePolicies(settings.policies, placement_engine(settings.policies.placement), settings.engine_config,
                         metric_source="prometheus" if settings.prometheus_url else "scrape", seed=settings.seed)


def runtime_of(svc: api.InferenceService, settings: Settings) -> ServiceRuntime | None:
    """The service's engine (its runtime profile at its version); None when the policies have no profile for
    it (the spec check reports that before any cycle)."""
    return service_runtime(svc.spec.runtime, settings.policies.runtimes)
