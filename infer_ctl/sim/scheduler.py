"""The fleet's Pods (`infer_ctl.sim.fleet`): created Pending, bound by kube-scheduler's rules (or where the
controller's placement pinned them), preempted, removed, and put to sleep on and woken from warm hosts."""

from __future__ import annotations

from collections.abc import Callable

from infer_ctl.core.api import ReplicaState
from infer_ctl.engine.cycle import (
    CyclePlan,
    awake_device_bytes,
)
from infer_ctl.engine.cycle import Observation as CycleObservation
from infer_ctl.sim.cluster import (
    GIB,
    PRIORITY_SERVING,
    PRIORITY_STANDBY,
    WARM_HOSTS,
    FleetCluster,
    catalog,
)
from infer_ctl.sim.fleet_state import ServiceRun, lends
from infer_ctl.sim.placing import FleetPlacement, Pin
from infer_ctl.sim.tick import SimConfig
from infer_ctl.sim.warm import DEFAULT_PHYSICS, GpuBook, TierPhysics, WarmHost, WarmHosts


class FleetScheduler:
    def __init__(self, runs: list[ServiceRun], cluster: FleetCluster, config: SimConfig,
                 physics: TierPhysics = DEFAULT_PHYSICS) -> None:
        self.runs, self.cluster, self.config = runs, cluster, config
        # kube-scheduler's queue: (-priority, created at, sequence, service index, replica)
        self.queue: list[tuple[int, float, int, int, str]] = []
        self.seq = 0
        self.dirty = False  # something the queue waits for changed: a new Pod, freed GPUs
        self.preempted = 0
        self.on_cycle: Callable[[str, CycleObservation, CyclePlan], None] | None = None
        # the controller's placement for infer-ctl's new replicas and removals (None: the scheduler's own rule)
        self.placement: FleetPlacement | None = None
        self._snapshot_of = -1  # the cluster version the placement's snapshot is of
        c = cluster
        book = GpuBook(free=c.free.__getitem__,
                       take=lambda host, node, gpus, now: c.bind((-1, WARM_HOSTS), host, node, gpus=gpus,
                                                                 priority=PRIORITY_SERVING, now=now),
                       give=lambda host, node, now: c.release(-1, host, node, now), nodes=c.spec.nodes)
        accelerator = catalog().get(c.spec.accelerator)
        if accelerator is None:
            raise ValueError(f"cluster.accelerator: {c.spec.accelerator!r} is not in the accelerator catalog")
        self.product = accelerator.name
        self.warm = WarmHosts(book, c.spec.host_memory_bytes, physics, c.device_bytes)
        self.warm.lenders = {run.index for run in runs if lends(run)}
        self.warm.service_names = {run.index: run.spec_name for run in runs}
        self.warm.max_yielded = {run.index: bound for run in runs
                                 if lends(run) and (bound := run.spec.scaling.prewarm.max_yielded) is not None}
        self.warm.ready = lambda key: (r := self.runs[key[0]].replicas.replicas.get(key[1])) is not None \
            and r.state in (ReplicaState.SERVING, ReplicaState.STANDBY)

    def record_shares(self, t: int) -> None:
        """Each `Shared` service's share of the shared devices' GPUs at tick `t`."""
        if not self.cluster.shared:
            return
        charges = self.cluster.share_charges()
        for run in self.runs:
            if run.share_bytes:
                run.shared_gpus_n[t] = charges.get(run.index, 0.0)

    def record_warm(self, t: int) -> int:
        """Each service's share of the warm hosts' GPUs and its host memory at tick `t`; the host memory held."""
        if not self.warm.hosts:
            return 0
        shares, held = self.warm.shares()
        for run in self.runs:
            run.warm_gpus_n[t] = shares.get(run.index, 0.0)
            run.host_bytes_n[t] = held.get(run.index, 0)
        return self.warm.host_bytes

    def create(self, run: ServiceRun, name: str | None, standby: bool, now: float, *, claim: str = "",
               device_bytes: int = 0, pin: Pin | None = None) -> None:
        """A new replica, Pending until the scheduler binds it; a lending service's on the existing warm host its
        plan names (`claim`), loading at once (the host holds the GPU)."""
        name = name or run.replicas.new_name()
        if claim:
            host = self.warm.join_awake((run.index, name), claim, run.weight, device_bytes)
            run.replicas.add_on_host(name, host.name, host.node, created_s=now,
                                     ready_s=now + self._cold_start(run, run.use.node_cache), standby=standby,
                                     cached=run.use.node_cache)
            return
        run.replicas.add_pending(name, now, standby)
        if pin is not None:  # bound at once where the controller's placement pinned its claim
            self._bind_pinned(run, name, pin, now)
            return
        self.queue.append((-run.priority(name), now, self.seq, run.index, name))
        self.seq += 1
        self.dirty = True

    def _bind_pinned(self, run: ServiceRun, name: str, pin: Pin, now: float) -> None:
        """A replica whose claim the controller pinned to devices of the snapshot it placed on: the scheduler
        binds it there (the devices were free on that snapshot, and nothing else bound since). It starts cached
        on a node holding the service's weights."""
        cached = run.use.node_cache or self._take_cached(run, pin.node, now)
        priority = run.priority(name)
        if run.share_bytes:
            self.cluster.bind_share(run.index, name, pin.node, pin.device, nbytes=run.share_bytes, priority=priority,
                                    now=now)
        else:
            self.cluster.bind((run.index, run.service.name), name, pin.node, gpus=run.model.gpus_per_replica,
                              priority=priority, now=now)
        run.replicas.bind(name, pin.node, now, self._cold_start(run, cached), cached=cached)

    def create_sleeper(self, run: ServiceRun, name: str | None, now: float, *, claim: str = "",
                       device_bytes: int = 0) -> bool:
        """A replica made to sleep goes to a warm host at once: infer-ctl's to the one its plan names (`claim`,
        taking `device_bytes` awake), a baseline pool's to one `WarmHosts.place` picks (an existing one with room,
        or a new one on free GPUs); False, and nothing made, when the cluster has no room for it."""
        name = name or run.replicas.new_name()
        key = (run.index, name)
        host: WarmHost | None
        if claim:
            host = self.warm.place_on(key, claim, run.weight, device_bytes, now, pinned=self.placement is not None)
        else:
            host = self.warm.place(key, run.model.gpus_per_replica, run.weight,
                                   awake_device_bytes(run.spec, self.warm.device_memory), now)
        if host is None:
            return False
        run.replicas.add_sleeper(name, now, host.name, host.node, self._cold_start(run, run.use.node_cache),
                                 cached=run.use.node_cache)
        return True

    def remove(self, run: ServiceRun, name: str, now: float) -> None:
        """A deletion: the GPUs go back to the node, which keeps the weights of a replica that was ready; a
        replica on a warm host leaves it (the host goes once no replica references it)."""
        if name in run.replicas.warm:
            run.replicas.remove(name)
            self.warm.remove((run.index, name), now)
            self.dirty = True
            return
        state, node = run.replicas.remove(name)
        if node is None:
            return
        self.cluster.release(run.index, name, node, now)
        self.dirty = True
        if state in (ReplicaState.SERVING, ReplicaState.STANDBY):
            run.cache.append((now, node))

    def displace(self, name: str, now: float) -> None:
        """A lending service's replica, asleep for another service's wake (`CyclePlan.displace`; the controller
        waits for its sleep before the wake): out of traffic, its weights to its node's host memory."""
        key = self.warm.lent_key(name)
        run = self.runs[key[0]]
        r = run.replicas.replicas.get(key[1])
        if r is None or r.state not in (ReplicaState.SERVING, ReplicaState.STANDBY) or not self.warm.sleep(key):
            raise ValueError(f"displace: {name} is not a ready replica whose sleep its node's host memory holds "
                             f"(the engine's ledger and the cluster model disagree)")
        self.warm.yielded[key] = now
        run.replicas.yielded(key[1], now)

    def wake(self, run: ServiceRun, name: str, now: float) -> bool:
        """An asleep replica onto its warm host's GPUs, ready after the wake time; False (and it stays asleep)
        when another replica is awake on them."""
        r = run.replicas.replicas[name]
        if name not in run.replicas.warm or r.state is not ReplicaState.SLEEPING:
            raise ValueError(f"wake: {run.service.name}/{name} is not asleep on a warm host ({r.state})")
        if not self.warm.wake((run.index, name)):
            run.wake_refused += 1
            run.refused[name] = f"its warm host {r.warm_host} has not the device memory free (other awake models)"
            return False
        wake_s = self.warm.physics.wake_s(run.weight / GIB)
        run.replicas.wake(name, now, wake_s)
        run.wakes.append(wake_s)
        return True

    def sleep(self, run: ServiceRun, name: str, now: float) -> None:
        """A ready replica on a warm host to sleep; removed instead when its node's host-memory budget cannot hold
        its weights (infer-ctl's ledger never asks for such a sleep; a baseline's pool may)."""
        r = run.replicas.replicas[name]
        if name not in run.replicas.warm or r.state not in (ReplicaState.SERVING, ReplicaState.STANDBY):
            raise ValueError(f"sleep: {run.service.name}/{name} is not a ready replica on a warm host ({r.state})")
        if not self.warm.sleep((run.index, name)):
            self.remove(run, name, now)
            return
        run.replicas.sleep(name)

    # -- the scheduler

    def schedule(self, now: float) -> None:
        """One pass over the Pending Pods in queue order; each is bound where it fits (or preempts)."""
        if not self.dirty or not self.queue:
            return
        self.dirty = False
        self.queue.sort()
        kept = []
        for entry in self.queue:
            run, name = self.runs[entry[3]], entry[4]
            r = run.replicas.replicas.get(name)
            if r is None or r.state is not ReplicaState.PENDING or entry[1] != r.created_s:
                continue  # deleted while Pending
            if not self._bind(run, name, -entry[0], now):
                kept.append(entry)
        self.queue = kept

    def _bind(self, run: ServiceRun, name: str, priority: int, now: float) -> bool:
        if run.share_bytes:
            return self._bind_share(run, name, priority, now)
        g = run.model.gpus_per_replica
        node, cached = self._node_for(run, g, now)
        if node is None and priority > PRIORITY_STANDBY:
            found = self.cluster.victims(g, priority)
            if found is not None:
                node, victims = found
                for service, victim in victims:
                    self.remove(self.runs[service], victim, now)
                self.preempted += len(victims)
                self.dirty = True  # the preemption changed what the other Pending Pods see
        if node is None:
            return False
        cold = self._cold_start(run, cached)
        if lends(run):  # a warm host made of the GPU it is given, the replica awake on it
            pending = run.replicas.replicas[name]
            run.replicas.add_on_host(name, self._lent_host(run, name, node, now), node,
                                     created_s=pending.created_s or now, ready_s=now + cold, standby=pending.standby,
                                     cached=cached)
            return True
        self.cluster.bind((run.index, run.service.name), name, node, gpus=g, priority=priority, now=now)
        run.replicas.bind(name, node, now, cold, cached=cached)
        return True

    def _bind_share(self, run: ServiceRun, name: str, priority: int, now: float) -> bool:
        """A `Shared` service's Pod: a memory share on a device (`FleetCluster.share_fit`), on a node that holds the
        service's weights first; else, at a serving priority, what preemption frees."""
        fit, cached = self._share_for(run, now)
        if fit is None and priority > PRIORITY_STANDBY:
            found = self.cluster.share_victims(run.share_bytes, priority)
            if found is not None:
                node, device, victims = found
                for service, victim in victims:
                    self.remove(self.runs[service], victim, now)
                self.preempted += len(victims)
                self.dirty = True
                # the device the victims left may be gone with the last of them: placed again
                fit = (node, device if (node, device) in self.cluster.shared else None)
        if fit is None:
            return False
        node, device = fit
        self.cluster.bind_share(run.index, name, node, device, nbytes=run.share_bytes, priority=priority, now=now)
        run.replicas.bind(name, node, now, self._cold_start(run, cached), cached=cached)
        return True

    def _share_for(self, run: ServiceRun, now: float) -> tuple[tuple[int, int | None] | None, bool]:
        """Where a share goes (`FleetCluster.share_fit`), and whether it starts cached: with a node cache on every
        node, always; else on a node a ready replica of the service left within `cache_ttl_s` (one cached start
        per replica that left, the newest first)."""
        if run.use.node_cache:
            return self.cluster.share_fit(run.share_bytes), True
        ttl = run.model.cache_ttl_s
        recent = [i for i in range(len(run.cache) - 1, -1, -1) if run.cache[i][0] >= now - ttl]
        fit = self.cluster.share_fit(run.share_bytes, [run.cache[i][1] for i in recent])
        if fit is None:
            return None, False
        return fit, self._take_cached(run, fit[0], now)

    @staticmethod
    def _take_cached(run: ServiceRun, node: int, now: float) -> bool:
        """Whether `node` holds the service's weights from a replica that left it within `cache_ttl_s`; the newest
        such entry is used up (one cached start per replica that left)."""
        ttl = run.model.cache_ttl_s
        hit = next((i for i in range(len(run.cache) - 1, -1, -1)
                    if run.cache[i][0] >= now - ttl and run.cache[i][1] == node), None)
        if hit is not None:
            del run.cache[hit]
        return hit is not None

    def _lent_host(self, run: ServiceRun, name: str, node: int, now: float) -> str:
        """A warm host made of a GPU of `node` for a lending service's replica, awake on it (as the controller makes
        one of the claim its placement pinned): its name."""
        need = awake_device_bytes(run.spec, self.warm.device_memory)
        return self.warm.host_for((run.index, name), node, run.weight, need, now).name

    def _cold_start(self, run: ServiceRun, cached: bool) -> float:
        cold = run.model.sample_cold_start_s(run.rng, cached)
        run.cold_samples.append(cold)
        run.p90_dirty = True
        return cold

    def _node_for(self, run: ServiceRun, gpus: int, now: float) -> tuple[int | None, bool]:
        """The node holding the service's weights (the most recent that fits) or the least allocated one; with a
        node cache on every node, the least allocated one, cached."""
        if run.use.node_cache:
            return self.cluster.least_allocated(gpus), True
        ttl = run.model.cache_ttl_s
        for i in range(len(run.cache) - 1, -1, -1):
            left_s, node = run.cache[i]
            if left_s < now - ttl:
                break
            if self.cluster.free[node] >= gpus:
                del run.cache[i]
                return node, True
        return self.cluster.least_allocated(gpus), False
