"""The reference simulator's placement policies, as score plugins of infer-ctl's framework.

Faithful to hkust-adsl/kubernetes-scheduler-simulator (the FGD paper's artifact) as configured by its published
run scripts: each policy is the only score plugin; node ties are broken uniformly at random (kube-scheduler's
selectHost); scores are truncated to integers where the reference does so (which creates the ties); the GPU on
the chosen node is picked by the policy's GPU selection (`random` for Random, the FGD score for FGD, best fit
otherwise). Constants: MaxSpecCpu 128000 milli-CPU, MaxSpecGpu 8000 milli-GPU.

- Random: a uniformly random feasible node; a random fitting GPU.
- DotProd (Tetris, merged GPU dimension, normalised by the max spec): 100 * (1 - (node_free . pod) / 2).
- GpuClustering: prefer nodes already running pods of the same GPU "affinity" (share, 1-GPU, 2-GPU, ...).
- GpuPacking: shared GPUs first, then free GPUs on used nodes, then empty nodes.
- BestFit: 100 * (1 - (0.5 cpu_left/MaxSpecCpu + 0.5 gpu_left/MaxSpecGpu)), min-max normalised to 0..100.
- FGD: sigmoid of the decrease of fragmentation (against the typical pods), on the best GPU of the node.
"""

from __future__ import annotations

import numpy as np

from infer_ctl.place.framework import (
    CycleContext,
    FloatArray,
    IntArray,
    Profile,
    exclusive_slots,
)
from infer_ctl.place.plugins import DEFAULT_FILTERS, FILTERS, FragmentationCache
from infer_ctl.place.request import Sharing
from infer_ctl.place.state import MILLI

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000
MAX_NODE_SCORE = 100


def _node_gpu_left(ctx: CycleContext, nodes: IntArray) -> IntArray:
    st = ctx.state
    left: IntArray = np.where(st.exists[nodes], st.free_milli[nodes], 0).sum(axis=1)
    return left


def _pod_gpu_total(ctx: CycleContext) -> int:
    req = ctx.request
    if req.sharing is Sharing.SHARED:
        return _share_of(ctx)
    if req.sharing is Sharing.EXCLUSIVE:
        return req.count * MILLI
    return 0


def _share_of(ctx: CycleContext) -> int:
    fits = ctx.eligible.slots & ctx.state.exists
    needs = ctx.share_needed[fits]
    return int(needs.min()) if needs.size else 0


def _best_fit_gpu(ctx: CycleContext, node: int) -> tuple[tuple[int, ...], int]:
    req = ctx.request
    if req.sharing is Sharing.SHARED:
        fits = ctx.slot_fits()[node]
        free = np.where(fits, ctx.state.free_milli[node], np.iinfo(np.int64).max)
        return (int(np.argmin(free)),), -1
    if req.sharing is Sharing.EXCLUSIVE:
        return exclusive_slots(ctx, node), -1
    return (), -1


class RandomScore:
    name = "Random"

    def score(self, ctx: CycleContext, nodes: IntArray) -> FloatArray:
        scores = np.zeros(nodes.size)
        scores[ctx.rng.integers(nodes.size)] = MAX_NODE_SCORE
        return scores

    def select(self, ctx: CycleContext, node: int) -> tuple[tuple[int, ...], int] | None:
        if ctx.request.sharing is Sharing.SHARED:
            candidates = np.flatnonzero(ctx.slot_fits()[node])
            return (int(candidates[ctx.rng.integers(candidates.size)]),), -1
        return _best_fit_gpu(ctx, node)


class DotProductScore:
    name = "DotProd"

    def score(self, ctx: CycleContext, nodes: IntArray) -> FloatArray:
        st = ctx.state
        node_cpu = st.cpu_free[nodes] / MAX_SPEC_CPU
        node_gpu = _node_gpu_left(ctx, nodes) / MAX_SPEC_GPU
        pod_cpu = ctx.request.cpu_milli / MAX_SPEC_CPU
        pod_gpu = _pod_gpu_total(ctx) / MAX_SPEC_GPU
        dot = (node_cpu * pod_cpu + node_gpu * pod_gpu) / 2
        scores: FloatArray = np.trunc(MAX_NODE_SCORE * (1 - dot))
        return scores

    def select(self, ctx: CycleContext, node: int) -> tuple[tuple[int, ...], int] | None:
        return _best_fit_gpu(ctx, node)


class AffinityTracker:
    """Which GPU "affinities" run on each node (share-gpu, 1-gpu, 2-gpu, ...): GpuClustering's input."""

    def __init__(self, n_nodes: int) -> None:
        self.counts = np.zeros((n_nodes, 9), dtype=np.int64)

    @staticmethod
    def tag(sharing: Sharing, count: int) -> int:
        if sharing is Sharing.SHARED:
            return 0
        if sharing is Sharing.EXCLUSIVE:
            return min(count, 8)
        return -1

    def record(self, node: int, sharing: Sharing, count: int) -> None:
        t = self.tag(sharing, count)
        if t >= 0:
            self.counts[node, t] += 1


class GpuClusteringScore:
    name = "GpuClustering"

    def __init__(self, tracker: AffinityTracker) -> None:
        self.tracker = tracker

    def score(self, ctx: CycleContext, nodes: IntArray) -> FloatArray:
        req = ctx.request
        tag = AffinityTracker.tag(req.sharing, req.count)
        if tag < 0:
            return np.zeros(nodes.size)
        counts = self.tracker.counts[nodes]
        distinct = (counts > 0).sum(axis=1)
        # Integer arithmetic as in the reference: 25 * (8000 - left) / 8000, then a band offset.
        base = (MAX_NODE_SCORE // 4) * (MAX_SPEC_GPU - _node_gpu_left(ctx, nodes)) // MAX_SPEC_GPU
        same = counts[:, tag] > 0
        offset = np.where(same, np.where(distinct == 1, 75, 50), np.where(distinct == 0, 25, 0))
        scores: FloatArray = (base + offset).astype(np.float64)
        return scores

    def select(self, ctx: CycleContext, node: int) -> tuple[tuple[int, ...], int] | None:
        return _best_fit_gpu(ctx, node)


class GpuPackingScore:
    name = "GpuPacking"

    def score(self, ctx: CycleContext, nodes: IntArray) -> FloatArray:
        req, st = ctx.request, ctx.state
        if not req.wants_devices:
            return np.zeros(nodes.size)
        free = st.free_milli[nodes]
        exists = st.exists[nodes]
        n_gpus = exists.sum(axis=1)
        fully_free = (exists & (free == MILLI)).sum(axis=1)
        scores = np.zeros(nodes.size)
        empty = fully_free == n_gpus
        # case 3: an empty node: 33 - free GPUs, but at least the number of free GPUs (sic).
        scores[empty] = np.maximum(MAX_NODE_SCORE // 3 - fully_free[empty], fully_free[empty])
        fits = ctx.slot_fits()[nodes]
        need = 1 if req.sharing is Sharing.SHARED else req.count
        for i in np.flatnonzero(~empty):
            # GPUs the pod would use: fitting ones, least free first (stable), as many as it needs.
            order = np.argsort(np.where(exists[i], free[i], MILLI + 1), kind="stable")
            chosen = [int(s) for s in order if fits[i, s]][:need]
            full = sum(1 for s in chosen if free[i, s] == MILLI)
            if full > 0:
                scores[i] = max(MAX_NODE_SCORE // 2 - full, MAX_NODE_SCORE // 3)
            else:
                used_ratio = sum(int(free[i, s]) * 100 // MILLI for s in chosen)
                scores[i] = max(MAX_NODE_SCORE - used_ratio // 10, MAX_NODE_SCORE // 2)
        return scores

    def select(self, ctx: CycleContext, node: int) -> tuple[tuple[int, ...], int] | None:
        return _best_fit_gpu(ctx, node)


class BestFitScore:
    name = "BestFit"

    def score(self, ctx: CycleContext, nodes: IntArray) -> FloatArray:
        st = ctx.state
        cpu_left = st.cpu_free[nodes] - ctx.request.cpu_milli
        gpu_left = _node_gpu_left(ctx, nodes) - _pod_gpu_total(ctx)
        raw = (cpu_left / MAX_SPEC_CPU * 0.5) + (gpu_left / MAX_SPEC_GPU * 0.5)
        scores = np.trunc((1.0 - raw) * MAX_NODE_SCORE).astype(np.int64)
        # NormalizeScore: min-max to 0..100 in integer arithmetic; all equal -> all 0.
        lo, hi = int(scores.min()), int(scores.max())
        if hi == lo:
            return np.zeros(nodes.size)
        normalised: FloatArray = ((scores - lo) * MAX_NODE_SCORE // (hi - lo)).astype(np.float64)
        return normalised

    def select(self, ctx: CycleContext, node: int) -> tuple[tuple[int, ...], int] | None:
        return _best_fit_gpu(ctx, node)


class FGDScore:
    """FGD: score = int(100 * sigmoid((frag_before - frag_after) / 1000)); GPU = the first with the best score."""

    name = "FGD"

    def __init__(self) -> None:
        self.cache = FragmentationCache(reference=True)

    def score(self, ctx: CycleContext, nodes: IntArray) -> FloatArray:
        assert ctx.inputs.workload is not None, "FGD needs the typical pods as the cycle's workload mix"
        self.cache.bind(ctx.state, ctx.inputs.workload)
        delta, _ = self.cache.deltas(ctx, nodes)
        scores: FloatArray = np.trunc(MAX_NODE_SCORE / (1.0 + np.exp(-delta / 1000.0)))
        return scores

    def select(self, ctx: CycleContext, node: int) -> tuple[tuple[int, ...], int] | None:
        req = ctx.request
        if req.sharing is Sharing.SHARED:
            assert ctx.inputs.workload is not None
            self.cache.bind(ctx.state, ctx.inputs.workload)
            _, choice = self.cache.deltas(ctx, np.array([node]))
            return (int(choice[0]),), -1
        return _best_fit_gpu(ctx, node)


REFERENCE_POLICIES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")


def reference_profile(policy: str, tracker: AffinityTracker) -> Profile:
    """The Profile of one reference policy: the standard filters, and that policy as the only score."""
    scorers = {
        "random": RandomScore,
        "dotprod": DotProductScore,
        "packing": GpuPackingScore,
        "bestfit": BestFitScore,
        "fgd": FGDScore,
    }
    if policy == "clustering":
        plugin: object = GpuClusteringScore(tracker)
    elif policy in scorers:
        plugin = scorers[policy]()
    else:
        raise ValueError(f"unknown reference policy {policy!r} (known: {', '.join(REFERENCE_POLICIES)})")
    filters = tuple(FILTERS[name]() for name in DEFAULT_FILTERS)
    return Profile(policy, filters, ((plugin, 1.0),))  # type: ignore[arg-type]
