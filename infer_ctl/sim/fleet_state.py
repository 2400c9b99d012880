"""One service's state in a fleet run (`infer_ctl.sim.fleet`): its arrivals and settings (`FleetService`), its
replicas on the cluster and its per-tick figures (`ServiceRun`)."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from infer_ctl.core import api
from infer_ctl.core.api import ReplicaState
from infer_ctl.engine.burst import BurstBasis
from infer_ctl.engine.cycle import (
    ObservedReplica,
    weight_bytes,
)
from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.autoscaler import SimPolicy
from infer_ctl.sim.cluster import GIB, PRIORITY_DEFAULT, PRIORITY_SERVING, PRIORITY_STANDBY
from infer_ctl.sim.policies import InferCtl, forecast_probe, tier_use
from infer_ctl.sim.service import ScenarioSettings, scenario_service
from infer_ctl.sim.tick import (
    MeasuredSlo,
    Replicas,
    SimConfig,
    SimResult,
    burst_cycle_due,
    latency_stats,
    pipeline_values,
    queue_step,
)


@dataclass(frozen=True, slots=True)
class FleetService:
    """One service of a fleet as the simulator runs it: its arrivals per tick, its settings and its seed (its
    cold-start samples in every run)."""

    name: str
    arrivals: FloatArray = field(repr=False)
    settings: ScenarioSettings
    seed: int


# ----------------------------------------------------------------------------------------------- one service


class FleetReplicas(Replicas):
    """One service's replicas (`infer_ctl.sim.tick.Replicas`) on the cluster: Pending (no GPU yet), Loading (bound,
    ready at a time; or waking), ready serving or standby, asleep on a warm host. Kept in creation order, as
    `infer_ctl.sim.run` keeps them (the observation lists them in that order). `node`: the node whose GPUs a
    replica holds itself; a replica on a warm host holds none of its own (the host's are charged)."""

    def __init__(self, product: str) -> None:
        super().__init__(product)
        self.node: dict[str, int] = {}
        self.pending: dict[str, None] = {}  # names, in creation order
        self.warm: set[str] = set()  # replicas on warm hosts (asleep, loading to sleep, waking or awake)

    def add_ready(self, name: str, node: int, host: str = "") -> None:
        """A replica serving at t = 0: on GPUs of its own on `node`, or (a lending service's) awake on warm host
        `host` there."""
        self.replicas[name] = ObservedReplica(name, ReplicaState.SERVING, False, created_s=0.0,
                                              node=f"node-{node}", accelerator=self.product, warm_host=host)
        if host:
            self.warm.add(name)
        else:
            self.node[name] = node
        self.serving += 1

    def add_asleep(self, name: str, host: str, node: int) -> None:
        """A replica asleep on a warm host at t = 0 (a pool made before the trace starts)."""
        self.replicas[name] = ObservedReplica(name, ReplicaState.SLEEPING, True, created_s=0.0, node=f"node-{node}",
                                              accelerator=self.product, warm_host=host)
        self.warm.add(name)

    def add_pending(self, name: str, now: float, standby: bool) -> None:
        # a replica started as standby runs at the standby's PriorityClass for its whole life
        self.replicas[name] = ObservedReplica(name, ReplicaState.PENDING, standby, created_s=now,
                                              low_priority=standby, accelerator=self.product)
        self.pending[name] = None

    def bind(self, name: str, node: int, now: float, cold_start_s: float, *, cached: bool) -> None:
        """Its GPUs bound on `node`: its load starts."""
        del self.pending[name]
        self.replicas[name] = replace(self.replicas[name], state=ReplicaState.LOADING, node=f"node-{node}",
                                      cached=cached)
        self.node[name] = node
        self._load(name, now + cold_start_s)

    def add_sleeper(self, name: str, now: float, host: str, node: int, cold_start_s: float, *, cached: bool) -> None:
        """A replica made to sleep, placed on warm host `host` at once (as the controller places it): it loads,
        out of traffic, then sleeps."""
        self.replicas[name] = ObservedReplica(name, ReplicaState.LOADING, True, created_s=now, node=f"node-{node}",
                                              accelerator=self.product, cached=cached, warm_host=host)
        self.warm.add(name)
        self.to_sleep.add(name)
        self._load(name, now + cold_start_s)

    def add_on_host(self, name: str, host: str, node: int, *, created_s: float, ready_s: float, standby: bool,
                    cached: bool) -> None:
        """A lending service's replica, awake on warm host `host` (an existing one, or one made of the GPU it was
        bound to): it loads until `ready_s`, then serves."""
        self.pending.pop(name, None)
        self.replicas[name] = ObservedReplica(name, ReplicaState.LOADING, standby, created_s=created_s,
                                              node=f"node-{node}", accelerator=self.product, cached=cached,
                                              warm_host=host)
        self.warm.add(name)
        self._load(name, ready_s)

    def yielded(self, name: str, now: float) -> None:
        """A lending service's replica, put to sleep for another service's wake: asleep, and since when."""
        self.sleep(name)
        self.replicas[name] = replace(self.replicas[name], yielded_s=now)

    def _load(self, name: str, ready_s: float) -> None:
        bisect.insort(self.loading, (ready_s, name))
        self.cold_starts += 1

    def wake(self, name: str, now: float, wake_s: float) -> None:
        """An asleep replica, woken: in traffic once the weights are back on its host's GPUs."""
        self.replicas[name] = replace(self.replicas[name], state=ReplicaState.LOADING, standby=False, yielded_s=None)
        self.waking.add(name)
        bisect.insort(self.loading, (now + wake_s, name))

    def sleep(self, name: str) -> None:
        """A ready replica on a warm host, put to sleep: out of traffic at once."""
        r = self.replicas[name]
        self.serving -= r.state is ReplicaState.SERVING
        self.replicas[name] = replace(r, state=ReplicaState.SLEEPING, standby=True)

    def remove(self, name: str) -> tuple[ReplicaState, int | None]:
        """Remove one replica: its state before, and the node it held GPUs on itself (None: it was Pending, or on
        a warm host)."""
        r = self.forget(name)
        self.pending.pop(name, None)
        self.warm.discard(name)
        return r.state, self.node.pop(name, None)

    @property
    def asleep(self) -> list[str]:
        return [k for k in self.warm if self.replicas[k].state is ReplicaState.SLEEPING]

    @property
    def awake_count(self) -> int:
        """Replicas not asleep nor loading to sleep: what a scale event compares the desired count with."""
        return len(self.replicas) - sum(1 for k in self.warm if k in self.to_sleep
                                        or self.replicas[k].state is ReplicaState.SLEEPING)

    @property
    def own_gpus(self) -> int:
        """Replicas holding GPUs of their own (bound, not on a warm host)."""
        return len(self.node)

    def shrink_order(self, n: int, among: set[str] | None = None, cost: Mapping[str, float] | None = None
                     ) -> list[str]:
        """A count policy's scale-down in the ReplicaSet controller's order: unscheduled Pods first, then loading
        ones, then ready ones, newest first (`among`: only those); with `cost`, the ready ones the cheapest to
        remove first (the newest among equals)."""
        keep = among if among is not None else set(self.replicas)
        pending = sorted((k for k in self.pending if k in keep), key=lambda k: self.replicas[k].created_s or 0.0,
                         reverse=True)
        loading = [name for _, name in reversed(self.loading) if name in keep]
        out = (pending + loading)[:n]
        gone = set(out)
        rest = [k for k in self.replicas if k in keep and k not in gone]
        costs = cost or {}
        out += sorted(rest, key=lambda k: (costs.get(k, 0.0), -(self.replicas[k].created_s or 0.0)))[:n - len(out)]
        return out


class ServiceRun:
    """One service's per-tick state in a fleet run (the loop of `infer_ctl.sim.run.simulate`, less the GPUs)."""

    def __init__(self, index: int, service: FleetService, policy: SimPolicy | InferCtl, *, initial: int,
                 config: SimConfig, n_ticks: int) -> None:
        self.index, self.service, self.policy = index, service, policy
        self.model = service.settings.model
        dt = config.tick_s
        self.arrivals = service.arrivals
        metrics = [pipeline_values(p, self.arrivals, dt) for p in policy.pipelines]
        self.metric_a = metrics[0] if metrics else np.full(n_ticks, np.nan)
        self.metric_b = metrics[1] if len(metrics) > 1 else np.full(n_ticks, np.nan)
        self.period_ticks = max(1, round(policy.period_s / dt))
        self.ongoing_k = max(1, round(config.ongoing_window_s / dt))
        self.ongoing_ring = [0.0] * self.ongoing_k
        self.ongoing_sum = 0.0
        self.rng = np.random.default_rng(service.seed)
        self.replicas = FleetReplicas(self.model.accelerator)
        self.cache: deque[tuple[float, int]] = deque()  # (left at, node) of ready replicas that left a node
        self.cold_samples: deque[float] = deque(maxlen=50)
        self.p90, self.p90_dirty = math.nan, False
        self.state = policy.initial_state()
        self.q = 0.0
        self.ready = 0
        self.desired = initial
        self.scale_events = 0
        self.ready_n = np.zeros(n_ticks, dtype=np.int64)
        self.held_n = np.zeros(n_ticks, dtype=np.int64)  # replicas holding GPUs (bound)
        self.pending_n = np.zeros(n_ticks, dtype=np.int64)
        self.desired_n = np.zeros(n_ticks, dtype=np.int64)
        self.backlog = np.zeros(n_ticks)
        self.fc_upper = np.full(n_ticks, np.nan)
        self.probe = forecast_probe if isinstance(policy, InferCtl) else None
        self.measured = MeasuredSlo.of(policy)  # the attainment infer-ctl's aim moves on
        self.use = tier_use(policy)
        # the service's InferenceService (infer-ctl's own; for the others, the one infer-ctl would run): what its
        # replicas hold asleep and take awake on a warm host are the engine's (`weight_bytes`,
        # `awake_device_bytes`), so that the cluster model and infer-ctl's ledger count the same bytes
        service_doc = policy.service if isinstance(policy, InferCtl) else scenario_service(service.settings)
        self.service_doc = service_doc
        self.spec = service_doc.spec
        self.spec_name = service_doc.meta.name
        self.weight = weight_bytes(self.spec.model)
        self.warm_gpus_n = np.zeros(n_ticks)  # the warm hosts' GPUs charged to this service
        # a `Shared` service's replica takes this much of one device (0: its GPUs whole); the shared devices' GPUs
        # charged to it per tick
        self.share_bytes = self.spec.model.memory_bytes if self.spec.accelerator.sharing is api.Sharing.SHARED else 0
        self.shared_gpus_n = np.zeros(n_ticks)
        self.host_bytes_n = np.zeros(n_ticks)  # host memory its replicas on warm hosts hold
        self.wake_refused = 0
        self.refused: dict[str, str] = {}  # sleepers whose wake was refused, until their host's GPU is free
        self.wakes: list[float] = []  # wake durations since the last cycle
        # infer-ctl's checks between two cycles (`infer_ctl.engine.burst`): what they compare with, their cadence
        # in ticks, and the cycles they ran
        self.basis: BurstBasis | None = None
        self.check_ticks = policy.burst_check_ticks(dt) if isinstance(policy, InferCtl) else 1
        self.burst_cycles = 0

    def cycle_due(self, t: int, config: SimConfig) -> bool:
        """A period's cycle at tick `t`, or (infer-ctl) one its check between two periods calls for
        (`infer_ctl.sim.tick.burst_cycle_due`), as the controller's two timers run them."""
        if t % self.period_ticks == 0:
            return True
        if not isinstance(self.policy, InferCtl):
            return False
        due = burst_cycle_due(self.policy, self.basis, self.model, t, config.tick_s, period_ticks=self.period_ticks,
                              check_ticks=self.check_ticks, arrivals=self.arrivals, ready_n=self.ready_n,
                              backlog=self.backlog, window_s=config.ongoing_window_s, serving=self.ready)
        self.burst_cycles += due
        return due

    @property
    def priority_serving(self) -> int:
        return PRIORITY_SERVING if isinstance(self.policy, InferCtl) else PRIORITY_DEFAULT

    def priority(self, name: str) -> int:
        if not isinstance(self.policy, InferCtl):
            return PRIORITY_DEFAULT
        return PRIORITY_STANDBY if self.replicas.replicas[name].low_priority else PRIORITY_SERVING

    def serve(self, t: int, now: float, dt: float) -> list[str]:
        """Replicas whose cold start is over become ready (new sleepers asleep: returned, their devices' memory to
        free); the tick's arrivals meet the ready replicas."""
        loading = set(self.replicas.to_sleep)
        self.replicas.advance(now)
        slept = sorted(loading - self.replicas.to_sleep)
        self.ready = self.replicas.serving
        self.backlog[t] = self.q
        self.ready_n[t] = self.ready
        self.q, ongoing_now = queue_step(self.q, float(self.arrivals[t]), self.ready, dt, self.model)
        slot = t % self.ongoing_k
        self.ongoing_sum += ongoing_now - self.ongoing_ring[slot]
        self.ongoing_ring[slot] = ongoing_now
        return slept

    def record(self, t: int) -> None:
        self.desired_n[t] = self.desired
        self.pending_n[t] = len(self.replicas.pending)
        self.held_n[t] = self.replicas.own_gpus

    def result(self, config: SimConfig, wall_s: float) -> SimResult:
        dt, n_ticks = config.tick_s, self.arrivals.size
        w = min(n_ticks, max(0, math.ceil(config.score_from_s / dt)))
        scored = np.concatenate([np.zeros(w), self.arrivals[w:]])
        attainment, p95, p99 = latency_stats(scored, self.ready_n, self.backlog, self.model, dt)
        return SimResult(
            policy=self.policy.name, slo_attainment=attainment,
            gpu_hours=((float(self.shared_gpus_n[w:].sum()) if self.share_bytes else
                        float(self.held_n[w:].sum()) * self.model.gpus_per_replica)
                       + float(self.warm_gpus_n[w:].sum())) * dt / 3600.0,
            cold_starts=self.replicas.cold_starts, p95_latency_ms=p95 * 1000.0, p99_latency_ms=p99 * 1000.0,
            scale_events=self.scale_events, wall_s=wall_s, requests=float(scored.sum()),
            times_s=np.arange(n_ticks, dtype=np.float64) * dt, arrivals_rps=self.arrivals / dt,
            desired=self.desired_n.astype(np.float64), ready=self.ready_n.astype(np.float64),
            alive=self.held_n.astype(np.float64), forecast_upper_rps=self.fc_upper,
            host_memory_gib_hours=float(self.host_bytes_n[w:].sum()) * dt / 3600.0 / GIB,
            wake_refused=self.wake_refused, burst_cycles=self.burst_cycles)


def lends(run: ServiceRun) -> bool:
    """Whether infer-ctl runs the service and it yields to sleepers (`spec.scaling.prewarm.yieldToSleepers`)."""
    return isinstance(run.policy, InferCtl) and run.spec.scaling.prewarm.yield_to_sleepers
