"""The placement framework, in kube-scheduler's shape: filter and score plugins over one snapshot.

A cycle places one `Request` against a `ClusterState`:

1. every filter plugin returns a mask over all nodes (vectorised) and, for nodes it rejects, a structured reason
   (requested vs free, which attribute failed); a node passes when every filter passes;
2. every score plugin scores the feasible nodes in [0, 100]; the weighted sum decides, ties are broken uniformly
   at random with the generator passed in (as kube-scheduler's selectHost does);
3. the device selector of the highest-weight score plugin picks the exact devices on the chosen node (as the
   reference FGD simulator picks the GPU with its main score plugin), else a best-fit default.

The engine returns a `Decision` (a `Placement`, or the aggregated `UnfitReason`s) and writes nothing; the caller
applies a placement with `state.assume(...)`. Plugins keep per-cycle data under their own name in
`CycleContext.data`, and may keep caches keyed by `state.version` (a per-node change counter).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

import numpy as np
import numpy.typing as npt

from infer_ctl.place.frag import WorkloadMix
from infer_ctl.place.inventory import DeviceId
from infer_ctl.place.request import Request, Sharing
from infer_ctl.place.state import MILLI, ClusterState, EligibleDevices

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class Code(enum.StrEnum):
    SUCCESS = "Success"
    UNSCHEDULABLE = "Unschedulable"
    ERROR = "Error"


@dataclass(frozen=True, slots=True)
class UnfitReason:
    """Why some nodes cannot take the request: the plugin, a stable code, how many nodes, and one example
    with numbers (e.g. `node-7: free 1200m CPU < requested 4000m`)."""

    plugin: str
    code: str
    nodes: int
    example: str

    def __str__(self) -> str:
        return f"{self.nodes} node(s): {self.code} ({self.plugin}), e.g. {self.example}"


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    reasons: tuple[UnfitReason, ...] = ()
    message: str = ""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a replica goes: node, devices (whole GPUs, one shared GPU, or one MIG partition)."""

    request: str
    node: str
    devices: tuple[DeviceId, ...]
    sharing: Sharing
    share_milli: int = 0
    consumed_capacity: Mapping[str, Fraction] = field(default_factory=dict)
    score: float = 0.0
    scores: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    request: str
    placement: Placement | None
    status: Status
    node_index: int = -1
    slots: tuple[int, ...] = ()
    partition: int = -1


@dataclass(frozen=True, slots=True)
class CycleInputs:
    """What the cycle knows besides the snapshot.

    - `workload`: the task mix the cluster runs (for fragmentation);
    - `gang_reserved_gpus`: whole GPUs per node held for pending gangs (PodGroups / Kueue Workloads);
    - `service_replicas`: replicas of the request's service per node (for spreading);
    - `cached_nodes`: nodes that hold the model in their local cache;
    - `node_priority`: a rank per node (lower first) that breaks score ties deterministically, which keeps
      filling the same nodes instead of scattering equal-score replicas; without it ties are broken
      uniformly at random with the cycle's generator (kube-scheduler's reservoir sampling).
    """

    workload: WorkloadMix | None = None
    node_priority: IntArray | None = None
    gang_reserved_gpus: Mapping[str, int] = field(default_factory=dict)
    service_replicas: Mapping[str, int] = field(default_factory=dict)
    cached_nodes: frozenset[str] = frozenset()


@dataclass(slots=True)
class CycleContext:
    """Per-cycle data shared by the plugins (read-only state; `data` for plugin scratch under its name)."""

    request: Request
    state: ClusterState
    inputs: CycleInputs
    eligible: EligibleDevices
    share_needed: IntArray
    rng: np.random.Generator
    data: dict[str, object] = field(default_factory=dict)

    def slot_fits(self) -> BoolArray:
        """[N, D]: slots that can take (one GPU of) the request now."""
        cached = self.data.get("_slot_fits")
        if cached is None:
            st = self.state
            usable = self.eligible.slots
            if self.request.device_memory_bytes:
                usable = usable & (st.device_memory >= self.request.device_memory_bytes)
            if self.request.sharing is Sharing.SHARED:
                cached = usable & (st.free_milli >= self.share_needed) & ~st.partitioned
            else:
                cached = usable & (st.free_milli == MILLI)
            self.data["_slot_fits"] = cached
        assert isinstance(cached, np.ndarray)
        return cached


@dataclass(frozen=True, slots=True)
class FilterResult:
    """`passed[n]` for every node; `explain(n)` describes a rejected node with numbers."""

    passed: BoolArray
    code: str
    explain: Callable[[int], str]


class FilterPlugin(Protocol):
    name: str

    def filter(self, ctx: CycleContext) -> FilterResult: ...


class ScorePlugin(Protocol):
    name: str

    def score(self, ctx: CycleContext, nodes: IntArray) -> FloatArray:
        """Scores in [0, 100] for the feasible `nodes` (indices into the state)."""
        ...

    def select(self, ctx: CycleContext, node: int) -> tuple[tuple[int, ...], int] | None:
        """(slots, partition) this plugin would use on `node`, or None to leave it to the default."""
        ...


@dataclass(frozen=True, slots=True)
class Profile:
    """Filters to run and weighted score plugins: one scheduling policy."""

    name: str
    filters: tuple[FilterPlugin, ...]
    scores: tuple[tuple[ScorePlugin, float], ...]


class Engine:
    """Runs one Profile. Stateless between calls except for plugin caches keyed by node versions."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    def schedule(self, request: Request, state: ClusterState, inputs: CycleInputs,
                 rng: np.random.Generator) -> Decision:
        """Place one request. Never raises for a plugin defect: that is a Decision with an Error status
        (kept apart from Unschedulable), so one bad replica cannot stop the cycle."""
        try:
            return self._schedule(request, state, inputs, rng)
        except Exception as exc:  # a plugin defect must not crash a long-running loop
            return Decision(request.name, None, Status(Code.ERROR, (), f"{type(exc).__name__}: {exc}"))

    def _schedule(self, request: Request, state: ClusterState, inputs: CycleInputs,
                  rng: np.random.Generator) -> Decision:
        eligible = state.eligible(request) if request.wants_devices else _NO_DEVICES_CACHE.get(state)
        share = state.share_needed(request) if request.sharing is Sharing.SHARED else _EMPTY
        ctx = CycleContext(request, state, inputs, eligible, share, rng)
        n_nodes = len(state.nodes)
        feasible = np.ones(n_nodes, dtype=np.bool_)
        reasons: list[UnfitReason] = []
        for plugin in self.profile.filters:
            result = plugin.filter(ctx)
            newly = feasible & ~result.passed
            count = int(newly.sum())
            if count:
                example = int(np.argmax(newly))
                reasons.append(UnfitReason(plugin.name, result.code, count,
                                           f"{state.nodes[example].name}: {result.explain(example)}"))
            feasible &= result.passed
        nodes = np.flatnonzero(feasible)
        if nodes.size == 0:
            if n_nodes == 0:
                reasons.append(UnfitReason("Engine", "NoNodes", 0, "the cluster has no nodes"))
            return Decision(request.name, None, Status(Code.UNSCHEDULABLE, tuple(reasons)))
        total = np.zeros(nodes.size, dtype=np.float64)
        per_plugin: dict[str, FloatArray] = {}
        for scorer, weight in self.profile.scores:
            if weight == 0:
                continue
            s = scorer.score(ctx, nodes)
            per_plugin[scorer.name] = s
            total += weight * s
        best = total.max()
        ties = np.flatnonzero(total == best)
        if ties.size == 1:
            pick = int(ties[0])
        elif inputs.node_priority is not None:
            pick = int(ties[np.argmin(inputs.node_priority[nodes[ties]])])
        else:
            pick = int(ties[rng.integers(ties.size)])
        node = int(nodes[pick])
        choice = None
        primary = max(self.profile.scores, key=lambda pw: pw[1], default=None)
        if primary is not None and primary[1] > 0:
            choice = primary[0].select(ctx, node)
        if choice is None:
            choice = default_select(ctx, node)
        slots, partition = choice
        placement = _placement(ctx, node, slots, partition, score=float(best),
                               scores={k: float(v[pick]) for k, v in per_plugin.items()})
        return Decision(request.name, placement, Status(Code.SUCCESS), node, slots, partition)


def apply(state: ClusterState, request: Request, decision: Decision) -> None:
    """Apply a successful decision to the snapshot (what-if evaluation of the next replica)."""
    if decision.placement is None:
        raise ValueError(f"{decision.request}: cannot apply an unschedulable decision")
    state.assume(request, decision.node_index, decision.slots, decision.partition,
                 decision.placement.share_milli)


def default_select(ctx: CycleContext, node: int) -> tuple[tuple[int, ...], int]:
    """Best fit: the fitting slot with the least free share; for whole GPUs the first `count` free slots of
    one product; for MIG the smallest available partition whose memory fits."""
    req = ctx.request
    if req.sharing is Sharing.NONE:
        return (), -1
    if req.sharing is Sharing.MIG:
        return (), smallest_partition(ctx, node)
    fits = ctx.slot_fits()[node]
    if req.sharing is Sharing.SHARED:
        free = np.where(fits, ctx.state.free_milli[node], np.iinfo(np.int64).max)
        return (int(np.argmin(free)),), -1
    return exclusive_slots(ctx, node), -1


def exclusive_slots(ctx: CycleContext, node: int) -> tuple[int, ...]:
    """The first `count` free slots of one product on `node` (products in slot order)."""
    fits = ctx.slot_fits()[node]
    products = ctx.state.product[node]
    for product in dict.fromkeys(int(p) for p in products[fits]):
        chosen = np.flatnonzero(fits & (products == product))[: ctx.request.count]
        if chosen.size == ctx.request.count:
            return tuple(int(s) for s in chosen)
    return ()


def smallest_partition(ctx: CycleContext, node: int) -> int:
    best, best_mem = -1, None
    for i, part in enumerate(ctx.state.partitions):
        if part.node != node or not ctx.eligible.partitions[i] or not ctx.state.partition_available(i):
            continue
        if part.memory_bytes < ctx.request.device_memory_bytes:
            continue
        if best_mem is None or part.memory_bytes < best_mem:
            best, best_mem = i, part.memory_bytes
    return best


def _placement(ctx: CycleContext, node: int, slots: Sequence[int], partition: int, *, score: float,
               scores: Mapping[str, float]) -> Placement:
    st, req = ctx.state, ctx.request
    devices: list[DeviceId] = []
    for slot in slots:
        dev = st.slot_device[node][slot]
        assert dev is not None
        devices.append(dev.id)
    if partition >= 0:
        devices.append(st.partitions[partition].device.id)
    share = int(ctx.share_needed[node, slots[0]]) if req.sharing is Sharing.SHARED and slots else 0
    consumed: dict[str, Fraction] = {}
    if req.sharing is Sharing.SHARED and slots:
        dev = st.slot_device[node][slots[0]]
        assert dev is not None
        for name, amount in req.shared_capacity.items():
            cap = dev.capacity.get(name)
            rounded = cap.request_policy.round_up(amount) if cap and cap.request_policy else amount
            consumed[name] = rounded if rounded is not None else amount
    return Placement(req.name, st.nodes[node].name, tuple(devices), req.sharing, share, consumed, score,
                     dict(scores))


class _NoDevices:
    """Eligibility for requests without devices: nothing is needed, nothing is eligible."""

    def __init__(self) -> None:
        self._by_state: dict[int, EligibleDevices] = {}

    def get(self, state: ClusterState) -> EligibleDevices:
        key = id(state)
        cached = self._by_state.get(key)
        if cached is None or cached.slots.shape != state.exists.shape:
            cached = EligibleDevices(np.zeros(state.exists.shape, dtype=np.bool_),
                                     tuple(False for _ in state.partitions), {}, {})
            self._by_state = {key: cached}
        return cached


_NO_DEVICES_CACHE = _NoDevices()
_EMPTY: IntArray = np.zeros((0, 0), dtype=np.int64)


def summarize(reasons: Sequence[UnfitReason]) -> str:
    """One line for a status condition: the most common reasons first."""
    counts = Counter({(r.plugin, r.code): r.nodes for r in reasons})
    return "; ".join(f"{n} node(s) {code} ({plugin})" for (plugin, code), n in counts.most_common())
