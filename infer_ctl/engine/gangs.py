"""Where pending gangs will need whole GPUs, so that placement keeps them free (pure).

A gang's Pods are placed by the Kubernetes scheduler, not by infer-ctl; infer-ctl only keeps out of their way.
Each pending gang is assumed to land where it fits best: every Pod (`gpus_per_pod` whole GPUs on one node) goes
to the node with the most free GPUs (kube-scheduler's default, least-allocated scoring; ties by node name),
largest Pods first. The GPUs so
assigned are reserved for the cycle (`CycleInputs.gang_reserved_gpus`). Pods that find no node with enough
free GPUs are the shortfall: standby replicas on the nodes that come closest yield their GPUs first.

E.g. free {a: 8, b: 4, c: 2}, one gang of 2 Pods x 4 GPUs: Pod 1 -> a (8 -> 4), Pod 2 -> a (4 -> 0);
reserved {a: 8}, no shortfall.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GangReservation:
    reserved: Mapping[str, int]  # node -> whole GPUs held for gangs
    unplaced_pods: tuple[tuple[str, int], ...]  # (gang, GPUs per Pod) of Pods that fit nowhere now
    closest_nodes: tuple[str, ...]  # where freeing GPUs would let the unplaced Pods fit, best first

    @property
    def shortfall_gpus(self) -> int:
        return sum(g for _, g in self.unplaced_pods)


def reserve_for_gangs(gangs: Sequence[tuple[str, int, int]], free_gpus: Mapping[str, int]) -> GangReservation:
    """`gangs`: (name, GPUs per Pod, Pods to place); `free_gpus`: whole free GPUs per node."""
    free = dict(free_gpus)
    reserved: dict[str, int] = {}
    unplaced: list[tuple[str, int]] = []
    pods = sorted(((name, per_pod) for name, per_pod, count in gangs for _ in range(count) if per_pod > 0),
                  key=lambda p: -p[1])
    for name, per_pod in pods:
        node = min((n for n, f in free.items() if f >= per_pod), key=lambda n: (-free[n], n), default=None)
        if node is None:
            unplaced.append((name, per_pod))
            continue
        free[node] -= per_pod
        reserved[node] = reserved.get(node, 0) + per_pod
    closest = tuple(sorted(free, key=lambda n: (-free[n], n))) if unplaced else ()
    return GangReservation(reserved, tuple(unplaced), closest)
