"""Fragmentation as FGD defines it (Weng et al., USENIX ATC'23), vectorised over many node states.

For a node n and a task class m: if m cannot run on n at all (wrong GPU product, too little CPU, not enough
GPUs with room for one of m's GPUs), all of n's unallocated GPU capacity is fragment; otherwise only the GPUs
whose free share is smaller than m's per-GPU demand (min(demand, 1 GPU)). A CPU-only class can use no GPU, so
for it every idle GPU share is fragment. The node's fragmentation for a workload is the popularity-weighted sum
over task classes. Worked example: a node with GPUs free [1000, 300] (thousandths) and a mix of 50% 1-GPU
tasks and 50% 500-milli tasks: the 1-GPU class can run (one GPU has 1000) and sees the 300 as fragment; the
500-milli class can run and sees 300 as fragment too: 0.5*300 + 0.5*300 = 300.

`WorkloadMix.typical(...)` builds the mix the way the reference simulator does: the most frequent task
classes covering 95% of the observed tasks, renormalised.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from infer_ctl.place.inventory import Device, Inventory

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True, order=True)
class TaskClass:
    """A kind of task: CPU, per-GPU share (0 = CPU only), GPU count, allowed products ('' = any)."""

    cpu_milli: int
    gpu_milli: int
    gpu_count: int
    products: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkloadMix:
    classes: tuple[TaskClass, ...]
    popularity: tuple[float, ...]

    @staticmethod
    def typical(observed: Iterable[TaskClass], coverage: float = 0.95) -> WorkloadMix:
        """The most frequent classes that together make `coverage` of `observed`, popularity renormalised.

        Ties in frequency are ordered by (cpu, gpu share, count, products) descending, as the reference does.
        """
        counts = Counter(observed)
        total = sum(counts.values())
        if total == 0:
            return WorkloadMix((), ())
        ordered = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
        chosen: list[tuple[TaskClass, int]] = []
        cumulative = 0
        for cls, n in ordered:
            if cumulative >= coverage * total:
                break
            chosen.append((cls, n))
            cumulative += n
        return WorkloadMix(tuple(c for c, _ in chosen), tuple(n / cumulative for _, n in chosen))


def allocation_share_milli(device: Device, consumed: Mapping[str, Fraction]) -> int:
    """The share of `device` an allocation holds, in thousandths: its consumed capacity over the device's
    capacity (the smallest such ratio when it consumes several), or all of it (1000) when nothing is recorded."""
    share = 1000
    for name, amount in consumed.items():
        cap = device.capacity.get(name)
        if cap is not None and cap.value > 0:
            share = min(share, max(1, math.ceil(amount / cap.value * 1000)))
    return share


def observed_mix(inventory: Inventory) -> WorkloadMix:
    """The mix the cluster runs now, from the allocated claims: per claim, its GPU count and the share of each
    device it holds (consumed capacity / device capacity, in thousandths; a whole device is 1000).
    CPU is not in ResourceClaims, so these classes ask for none; all products are allowed."""
    devices = {d.id: d for d in inventory.devices}
    by_claim: dict[str, list[int]] = {}
    for alloc in inventory.allocations:
        dev = devices.get(alloc.device)
        if dev is None:
            continue
        by_claim.setdefault(alloc.claim, []).append(allocation_share_milli(dev, alloc.consumed))
    classes = [TaskClass(0, max(shares), len(shares)) for shares in by_claim.values()]
    return WorkloadMix.typical(classes, coverage=1.0)


class FragmentationModel:
    """A WorkloadMix compiled against the product table of a ClusterState."""

    def __init__(self, mix: WorkloadMix, products: Sequence[str]) -> None:
        self.mix = mix
        n_classes = len(mix.classes)
        self.cpu = np.array([c.cpu_milli for c in mix.classes], dtype=np.int64)
        self.milli = np.array([c.gpu_milli for c in mix.classes], dtype=np.int64)
        self.count = np.array([c.gpu_count for c in mix.classes], dtype=np.int64)
        self.gpu_class = self.milli > 0
        self.popularity = np.array(mix.popularity, dtype=np.float64)
        # allowed[c, p]: class c may use product p; the extra last column is "no device" (product -1).
        allowed = np.zeros((n_classes, len(products) + 1), dtype=np.bool_)
        for i, cls in enumerate(mix.classes):
            for j, product in enumerate(products):
                allowed[i, j] = not cls.products or product in cls.products
        self.allowed = allowed

    def aggregates(self, free_milli: IntArray, product: IntArray) -> tuple[IntArray, IntArray, IntArray]:
        """Per node and class: GPUs that can host one GPU of the class, and the idle share on the others;
        per node: all idle share. From these, a change of one slot updates fragmentation in O(classes)."""
        g = free_milli[:, None, :]
        access = np.moveaxis(self.allowed[:, product], 0, 1)
        fits = access & (g >= self.milli[None, :, None])
        n_fit: IntArray = fits.sum(axis=2)
        rest: IntArray = np.where(fits, 0, g).sum(axis=2)
        total: IntArray = free_milli.sum(axis=1)
        return n_fit, rest, total

    def from_aggregates(self, n_fit: IntArray, rest: IntArray, total: IntArray, cpu_free: IntArray) -> FloatArray:
        """Fragmentation from `aggregates` (the same number `fragmentation` computes)."""
        runnable = (n_fit >= self.count[None, :]) & (cpu_free[:, None] >= self.cpu[None, :]) & self.gpu_class[None, :]
        result: FloatArray = np.where(runnable, rest, total[:, None]) @ self.popularity
        return result

    def after_slot_changes(self, n_fit: IntArray, rest: IntArray, total: IntArray, cpu_after: IntArray,
                           changes: Sequence[tuple[IntArray, IntArray, IntArray]]) -> FloatArray:
        """Fragmentation of S node states given their aggregates ([S, C], [S, C], [S]) after `changes`:
        each a (product [S], free before [S], free after [S]) of one slot. Exactly `fragmentation` of the
        changed states, computed without touching the other slots."""
        n_fit = n_fit.copy()
        rest = rest.copy()
        total = total.copy()
        m = self.milli[None, :]
        for product, before, after in changes:
            access = self.allowed[:, product].T  # [S, C]
            fit_before = access & (before[:, None] >= m)
            fit_after = access & (after[:, None] >= m)
            n_fit += fit_after.astype(np.int64) - fit_before
            rest += np.where(fit_after, 0, after[:, None]) - np.where(fit_before, 0, before[:, None])
            total += after - before
        runnable = (n_fit >= self.count[None, :]) & (cpu_after[:, None] >= self.cpu[None, :]) & self.gpu_class[None, :]
        frag = np.where(runnable, rest, total[:, None])
        result: FloatArray = frag @ self.popularity
        return result

    def fragmentation(self, free_milli: IntArray, cpu_free: IntArray, product: IntArray) -> FloatArray:
        """Fragmentation (in thousandths of a GPU) of S node states: free_milli [S, D], cpu_free [S],
        product [S, D] (-1 where there is no device)."""
        if free_milli.shape[0] == 0 or len(self.mix.classes) == 0:
            return np.zeros(free_milli.shape[0], dtype=np.float64)
        g = free_milli[:, None, :]
        access = np.moveaxis(self.allowed[:, product], 0, 1)  # [S, C, D]
        fits = access & (g >= self.milli[None, :, None])
        enough = fits.sum(axis=2) >= self.count[None, :]
        runnable = enough & (cpu_free[:, None] >= self.cpu[None, :]) & self.gpu_class[None, :]
        frag_if_runnable = np.where(fits, 0, g).sum(axis=2)
        total = free_milli.sum(axis=1)
        frag = np.where(runnable, frag_if_runnable, total[:, None])
        result: FloatArray = frag @ self.popularity
        return result
