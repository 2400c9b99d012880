"""The openb benchmark: the reference protocol of the FGD paper, run through infer-ctl's placement engine.

Protocol (see ../shared/data/openb/REFERENCE.md): the pod list is shuffled (seeded), then pods drawn with
replacement are appended until their GPU request would exceed `tune` x the cluster's GPU capacity (the
reference's stopping rule compares the per-GPU share of the drawn pod, which we keep); pods arrive one by one
and never leave; a pod that fits nowhere fails and is skipped. Every node and pod goes through the same path
as live objects: Node + ResourceSlice dicts -> Inventory -> ClusterState; each pod's ResourceClaim-shaped dict
-> Request -> Engine.schedule.

Reported per run: GPU allocation (% of capacity) when the arrived GPU request reaches 100% and at the end
(130%), unallocated GPUs at the end, the fragmentation ratio (fragment / idle GPU capacity, against the typical
pods) when arrivals reach 90%, decision latency percentiles and wall time.
"""

from __future__ import annotations

import gc
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from infer_ctl.place.frag import WorkloadMix
from infer_ctl.place.framework import CycleInputs, Engine, Profile, apply
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.plugins import FragmentationCache, build_profile
from infer_ctl.place.request import Request, request_from_claim
from infer_ctl.place.state import MILLI, ClusterState
from infer_ctl.sim.openb.data import (
    OpenbNode,
    OpenbPod,
    claim_object,
    device_class_object,
    load_nodes,
    load_pods,
    node_object,
    slice_object,
)
from infer_ctl.sim.openb.policies import REFERENCE_POLICIES, AffinityTracker, reference_profile

POLICIES = (*REFERENCE_POLICIES, "infer-ctl")


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    seed: int
    alloc_pct_at_100: float
    alloc_pct_at_130: float
    unallocated_gpus_at_130: float
    frag_ratio_pct_at_90: float
    decision_ms_p50: float
    decision_ms_p99: float
    wall_s: float
    pods: int
    failed: int
    peak_rss_mb: float
    curve: tuple[tuple[float, float], ...] = field(default=(), repr=False)

    def row(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "seed": self.seed,
            "alloc_pct_at_100": round(self.alloc_pct_at_100, 3),
            "alloc_pct_at_130": round(self.alloc_pct_at_130, 3),
            "unallocated_gpus_at_130": round(self.unallocated_gpus_at_130, 1),
            "frag_ratio_pct_at_90": round(self.frag_ratio_pct_at_90, 2),
            "decision_ms_p50": round(self.decision_ms_p50, 3),
            "decision_ms_p99": round(self.decision_ms_p99, 3),
            "wall_s": round(self.wall_s, 2),
            "pods": self.pods,
            "failed": self.failed,
            "peak_rss_mb": round(self.peak_rss_mb, 1),
        }


def arrival_order(
    pods: Sequence[OpenbPod], capacity_milli: int, tune: float, rng: np.random.Generator
) -> list[OpenbPod]:
    """Shuffle, then append random draws while the total stays within tune x capacity (reference rule)."""
    order = [pods[i] for i in rng.permutation(len(pods))]
    total = sum(p.gpu_milli_total for p in order)
    target = tune * capacity_milli
    if total > target:
        while total > target and order:
            removed = order.pop(int(rng.integers(len(order))))
            total -= removed.gpu_milli_total
        return order
    while True:
        pod = pods[int(rng.integers(len(pods)))]
        if total + pod.gpu_milli > target:
            break
        total += pod.gpu_milli_total
        order.append(pod)
    return order


def build_state(nodes: Sequence[OpenbNode]) -> ClusterState:
    inventory = Inventory.build(
        nodes=[node_object(n) for n in nodes],
        slices=[slice_object(n) for n in nodes if n.gpus],
        device_classes=[device_class_object()],
    )
    if inventory.problems:
        raise ValueError("openb inventory problems: " + "; ".join(str(p) for p in inventory.problems[:5]))
    return ClusterState.from_inventory(inventory)


def make_profile(policy: str, tracker: AffinityTracker, placement_config: dict[str, object] | None) -> Profile:
    if policy == "infer-ctl":
        return build_profile(placement_config, name="infer-ctl")
    return reference_profile(policy, tracker)


def simulate(
    nodes: Sequence[OpenbNode],
    pods: Sequence[OpenbPod],
    policy: str,
    seed: int,
    *,
    tune: float = 1.3,
    placement_config: dict[str, object] | None = None,
    progress: Callable[[int, int], None] | None = None,
    mix_coverage: float = 1.0,
) -> RunResult:
    started = time.perf_counter()
    state = build_state(nodes)
    capacity = int(state.exists.sum()) * MILLI
    seeds = np.random.SeedSequence(seed).spawn(2)
    order = arrival_order(pods, capacity, tune, np.random.default_rng(seeds[0]))
    rng = np.random.default_rng(seeds[1])
    tracker = AffinityTracker(len(state.nodes))
    engine = Engine(make_profile(policy, tracker, placement_config))
    mix = WorkloadMix.typical(p.task_class for p in pods)
    # The reference policies score against the typical pods (95% of tasks, REFERENCE.md). infer-ctl scores
    # against every class of the trace by default (`mix_coverage` 1.0), as the live controller does with
    # `observed_mix` (all allocated claims): the rare classes (8-GPU pods: 0.5% of tasks, 6% of GPU demand)
    # are in its mix. The fragmentation ratio is always reported against the typical pods.
    policy_mix = mix if policy != "infer-ctl" else WorkloadMix.typical((p.task_class for p in pods), mix_coverage)
    # The reference names nodes "<random rank>-<name>" and breaks score ties by the smallest name: a fixed,
    # seeded priority order of nodes.
    priority = np.random.default_rng(seeds[1]).permutation(len(state.nodes))
    inputs = CycleInputs(workload=policy_mix, node_priority=priority)
    frag = FragmentationCache()
    frag.bind(state, mix)
    # The inventory is ~10^5 long-lived objects: keep the cyclic GC from re-walking them mid-run (a full
    # collection otherwise lands on some decision as a 50-150 ms pause).
    gc.collect()
    gc.freeze()

    requests: dict[OpenbPod, Request] = {}
    arrived = allocated = failed = 0
    alloc_at_100 = frag_at_90 = None
    latencies = np.zeros(len(order))
    curve: list[tuple[float, float]] = []
    for i, pod in enumerate(order):
        request = requests.get(pod)
        if request is None:
            request = request_from_claim(
                claim_object(pod), cpu_milli=pod.cpu_milli, memory_bytes=pod.memory_mib * 2**20, name=pod.name
            )
            requests[pod] = request
        t0 = time.perf_counter()
        decision = engine.schedule(request, state, inputs, rng)
        if decision.placement is not None:
            apply(state, request, decision)
        latencies[i] = time.perf_counter() - t0
        arrived += pod.gpu_milli_total
        if decision.placement is not None:
            allocated += pod.gpu_milli_total
            tracker.record(decision.node_index, request.sharing, request.count)
        else:
            failed += 1
        if frag_at_90 is None and arrived >= 0.9 * capacity:
            node_frag = frag.node_fragmentation(state)
            idle = float(np.where(state.exists, state.free_milli, 0).sum())
            frag_at_90 = 100.0 * float(node_frag.sum()) / idle if idle else 0.0
        if alloc_at_100 is None and arrived >= capacity:
            alloc_at_100 = 100.0 * allocated / capacity
        if i % 50 == 0 or i == len(order) - 1:
            curve.append((100.0 * arrived / capacity, 100.0 * allocated / capacity))
            if progress is not None:
                progress(i + 1, len(order))
    wall = time.perf_counter() - started
    gc.unfreeze()
    ms = latencies * 1000.0
    return RunResult(
        policy=policy,
        seed=seed,
        alloc_pct_at_100=alloc_at_100 if alloc_at_100 is not None else 100.0 * allocated / capacity,
        alloc_pct_at_130=100.0 * allocated / capacity,
        unallocated_gpus_at_130=(capacity - allocated) / MILLI,
        frag_ratio_pct_at_90=frag_at_90 if frag_at_90 is not None else float("nan"),
        decision_ms_p50=float(np.percentile(ms, 50)) if ms.size else 0.0,
        decision_ms_p99=float(np.percentile(ms, 99)) if ms.size else 0.0,
        wall_s=wall,
        pods=len(order),
        failed=failed,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        curve=tuple(curve),
    )


def run(
    nodes_csv: Path,
    pods_csv: Path,
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    tune: float = 1.3,
    placement_config: dict[str, object] | None = None,
    progress: Callable[[str, int, int, int], None] | None = None,
) -> list[RunResult]:
    nodes = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)
    results = []
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
        for seed in seeds:

            def tick(done: int, total: int, policy: str = policy, seed: int = seed) -> None:
                if progress is not None:
                    progress(policy, seed, done, total)

            results.append(
                simulate(nodes, pods, policy, seed, tune=tune, placement_config=placement_config, progress=tick)
            )
    return results
