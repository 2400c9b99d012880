"""The device inventory: DRA objects (resource.k8s.io/v1, Kubernetes 1.37) as the placement engine sees them.

Input are plain dicts exactly as the API server serves them: Nodes, ResourceSlices, DeviceClasses,
ResourceClaims (for existing allocations) and, optionally, the CPU/memory already requested on each node.
`Inventory.build(...)` reads them once per control cycle and never raises on bad input: a malformed slice,
device, claim or class is left out and recorded in `Inventory.problems` with the object, the field path and
what is wrong, so the status and `explain` can show it.

The public API the sandbox's first-match allocator reuses (documented, stable):

- `Inventory.build(nodes=..., slices=..., device_classes=..., claims=..., pods=...)`
- `inventory.devices` / `inventory.devices_on(node_name)`: every usable device (`Device`), with its node.
- `inventory.free(device)`: the device's free capacity and counters given the existing allocations (`FreeDevice`).
- `inventory.matches(device, class_name, selectors)`: whether the device satisfies a DeviceClass plus a request's
  CEL selectors (`MatchResult`, with the reason when it does not); CEL programs are compiled once and the
  result is cached per (expression, device).

Attribute and capacity names follow NVIDIA's DRA driver (`gpu.nvidia.com`): attributes `type` (gpu|mig),
`productName`, `architecture`, `cudaComputeCapability` (version), `uuid`, and for MIG devices `profile`,
`parentUUID`; capacity `memory`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from infer_ctl.core.cel import (
    CelCompileError,
    CelEvalError,
    Quantity,
    Semver,
    compile_expression,
    prepare_activation,
)
from infer_ctl.core.quantity import QuantityError, parse_quantity

NVIDIA_DRIVER = "gpu.nvidia.com"

# kube-scheduler's default for a Node without `allocatable.pods`.
DEFAULT_MAX_PODS = 110


@dataclass(frozen=True, slots=True)
class Problem:
    """Something in the input that the inventory had to leave out, and why."""

    kind: str
    name: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.path}: {self.message}"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    """A Pod toleration or a DRA DeviceToleration (same matching rules)."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """CapacityRequestPolicy of a consumable capacity: what a single allocation may consume."""

    default: Fraction | None = None
    valid_values: tuple[Fraction, ...] = ()
    range_min: Fraction | None = None
    range_max: Fraction | None = None
    range_step: Fraction | None = None

    def round_up(self, amount: Fraction | None) -> Fraction | None:
        """The amount actually consumed for a request of `amount` (None: not allowed). E.g. with validRange
        {min: 1Gi, step: 1Gi}, 1.5Gi consumes 2Gi; with no request the default is consumed."""
        if amount is None:
            amount = self.default if self.default is not None else (self.range_min or Fraction(0))
        if self.valid_values:
            fitting = sorted(v for v in self.valid_values if v >= amount)
            return fitting[0] if fitting else None
        if self.range_min is not None:
            amount = max(amount, self.range_min)
            if self.range_step:
                steps = -(-(amount - self.range_min) // self.range_step)
                amount = self.range_min + steps * self.range_step
            if self.range_max is not None and amount > self.range_max:
                return None
        return amount


@dataclass(frozen=True, slots=True)
class Capacity:
    value: Fraction
    request_policy: RequestPolicy | None = None


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    counter_set: str
    counters: Mapping[str, Fraction]


@dataclass(frozen=True, slots=True)
class DeviceId:
    driver: str
    pool: str
    name: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a ResourceSlice. `attributes` and `capacity` keys are fully qualified (`domain/name`)."""

    id: DeviceId
    node_name: str
    attributes: Mapping[str, object]
    capacity: Mapping[str, Capacity]
    taints: tuple[Taint, ...] = ()
    allow_multiple_allocations: bool = False
    consumes_counters: tuple[CounterConsumption, ...] = ()

    def attribute(self, name: str, domain: str = NVIDIA_DRIVER) -> object:
        return self.attributes.get(name if "/" in name else f"{domain}/{name}")

    def capacity_value(self, name: str, domain: str = NVIDIA_DRIVER) -> Fraction | None:
        cap = self.capacity.get(name if "/" in name else f"{domain}/{name}")
        return None if cap is None else cap.value

    @property
    def kind(self) -> str:
        """`gpu`, `mig` or another driver-specific type (NVIDIA's `type` attribute); `gpu` when absent."""
        value = self.attribute("type", self.id.driver)
        return str(value) if value is not None else "gpu"

    @property
    def memory_bytes(self) -> int:
        value = self.capacity_value("memory", self.id.driver)
        return int(value) if value is not None else 0

    def cel_value(self) -> dict[str, object]:
        """The `device` variable of DRA CEL selectors: driver, attributes/capacity by domain."""
        attributes: dict[str, dict[str, object]] = defaultdict(dict)
        for qualified, value in self.attributes.items():
            domain, _, name = qualified.rpartition("/")
            attributes[domain][name] = value
        capacity: dict[str, dict[str, object]] = defaultdict(dict)
        for qualified, cap in self.capacity.items():
            domain, _, name = qualified.rpartition("/")
            capacity[domain][name] = Quantity.of(cap.value)
        return {
            "driver": self.id.driver,
            "attributes": dict(attributes),
            "capacity": dict(capacity),
            "allowMultipleAllocations": self.allow_multiple_allocations,
        }


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu_milli: int
    memory_bytes: int
    max_pods: int = DEFAULT_MAX_PODS
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Allocation:
    """One allocated device result of a ResourceClaim."""

    claim: str
    device: DeviceId
    consumed: Mapping[str, Fraction]
    share_id: str = ""
    admin_access: bool = False


@dataclass(frozen=True, slots=True)
class FreeDevice:
    """What is left of a device. `exclusive_free`: nobody holds any part of it (so it can be taken whole)."""

    device: Device
    exclusive_free: bool
    allocatable: bool
    capacity_free: Mapping[str, Fraction]
    counters_blocked: bool


@dataclass(frozen=True, slots=True)
class MatchResult:
    ok: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """CPU/memory/pod count already requested on a node by running Pods (from the Pod list)."""

    cpu_milli: int = 0
    memory_bytes: int = 0
    pods: int = 0


class _Cache:
    """Memo of CEL match results per (class, selectors, device); not part of the value."""

    def __init__(self) -> None:
        self.results: dict[tuple[str, tuple[str, ...], DeviceId], MatchResult] = {}
        self.activations: dict[DeviceId, Any] = {}


@dataclass(frozen=True, slots=True)
class Inventory:
    nodes: tuple[Node, ...]
    devices: tuple[Device, ...]
    device_classes: Mapping[str, DeviceClass]
    counter_sets: Mapping[tuple[str, str, str], Mapping[str, Fraction]]
    allocations: tuple[Allocation, ...]
    node_usage: Mapping[str, NodeUsage]
    problems: tuple[Problem, ...]
    _cache: _Cache = field(default_factory=_Cache, compare=False, repr=False)

    # -- construction -------------------------------------------------------------------------------------

    @staticmethod
    def build(
        *,
        nodes: Iterable[Mapping[str, Any]] = (),
        slices: Iterable[Mapping[str, Any]] = (),
        device_classes: Iterable[Mapping[str, Any]] = (),
        claims: Iterable[Mapping[str, Any]] = (),
        pods: Iterable[Mapping[str, Any]] = (),
    ) -> Inventory:
        problems: list[Problem] = []
        parsed_nodes = [n for n in (_parse_node(obj, problems) for obj in nodes) if n is not None]
        node_names = {n.name for n in parsed_nodes}
        devices, counter_sets = _parse_slices(list(slices), node_names, problems)
        classes = {}
        for obj in device_classes:
            dc = _parse_device_class(obj, problems)
            if dc is not None:
                classes[dc.name] = dc
        known = {d.id for d in devices}
        allocations = [a for obj in claims for a in _parse_claim_allocations(obj, known, problems)]
        usage = _node_usage(pods, problems)
        return Inventory(
            nodes=tuple(sorted(parsed_nodes, key=lambda n: n.name)),
            devices=tuple(devices),
            device_classes=classes,
            counter_sets=counter_sets,
            allocations=tuple(allocations),
            node_usage=usage,
            problems=tuple(problems),
        )

    # -- queries ------------------------------------------------------------------------------------------

    def devices_on(self, node_name: str) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.node_name == node_name)

    def free(self, device: Device) -> FreeDevice:
        """Free capacity of `device` after existing allocations; counters shared with other devices count too
        (a MIG partition allocated from a GPU's counter set blocks the whole GPU, and the reverse)."""
        mine = [a for a in self.allocations if a.device == device.id]
        capacity_free = {name: cap.value for name, cap in device.capacity.items()}
        for alloc in mine:
            for name, cap in device.capacity.items():
                amount = alloc.consumed.get(name)
                if amount is None:
                    # Not recorded: DRA consumes the request policy's default, or all of it without a policy.
                    default = cap.request_policy.round_up(None) if cap.request_policy else None
                    amount = default if default is not None else cap.value
                capacity_free[name] -= amount
        counters_blocked = not self._counters_available(device, exclude=device.id)
        exclusive_free = not mine and not counters_blocked
        if device.allow_multiple_allocations:
            allocatable = not counters_blocked and all(v > 0 for v in capacity_free.values())
        else:
            allocatable = exclusive_free
        return FreeDevice(device, exclusive_free, allocatable, capacity_free, counters_blocked)

    def counters_used(self) -> dict[tuple[str, str, str], dict[str, Fraction]]:
        """Counters consumed by allocated devices, per (driver, pool, counter set)."""
        by_id = {d.id: d for d in self.devices}
        used: dict[tuple[str, str, str], dict[str, Fraction]] = defaultdict(lambda: defaultdict(Fraction))
        seen: set[DeviceId] = set()
        for alloc in self.allocations:
            dev = by_id.get(alloc.device)
            if dev is None or dev.id in seen:
                continue
            seen.add(dev.id)
            for cc in dev.consumes_counters:
                for name, amount in cc.counters.items():
                    used[(dev.id.driver, dev.id.pool, cc.counter_set)][name] += amount
        return {k: dict(v) for k, v in used.items()}

    def _counters_available(self, device: Device, exclude: DeviceId | None = None) -> bool:
        if not device.consumes_counters:
            return True
        used = self.counters_used()
        for cc in device.consumes_counters:
            key = (device.id.driver, device.id.pool, cc.counter_set)
            total = self.counter_sets.get(key, {})
            for name, amount in cc.counters.items():
                if total.get(name, Fraction(0)) - used.get(key, {}).get(name, Fraction(0)) < amount:
                    return False
        return True

    def matches(self, device: Device, class_name: str, selectors: Sequence[str] = ()) -> MatchResult:
        """Whether `device` satisfies DeviceClass `class_name` and every selector (ANDed, as DRA does).

        A selector that does not compile or fails at runtime does not match, with the CEL error as reason.
        """
        key = (class_name, tuple(selectors), device.id)
        cached = self._cache.results.get(key)
        if cached is not None:
            return cached
        result = self._match(device, class_name, selectors)
        self._cache.results[key] = result
        return result

    def _match(self, device: Device, class_name: str, selectors: Sequence[str]) -> MatchResult:
        device_class = self.device_classes.get(class_name)
        if device_class is None:
            return MatchResult(False, f"DeviceClass {class_name!r} not found")
        activation = self._cache.activations.get(device.id)
        if activation is None:
            activation = prepare_activation({"device": device.cel_value()})
            self._cache.activations[device.id] = activation
        for origin, expression in [("class", e) for e in device_class.selectors] + [
            ("request", e) for e in selectors
        ]:
            try:
                program = compile_expression(expression, variables=("device",))
                if not program.evaluate_bool(activation):
                    where = f"DeviceClass {class_name}" if origin == "class" else "request selector"
                    return MatchResult(False, f"{where} {expression!r} is false")
            except CelCompileError as exc:
                return MatchResult(False, f"selector does not compile: {exc.message} ({expression!r})")
            except CelEvalError as exc:
                return MatchResult(False, f"selector failed on this device: {exc.message} ({expression!r})")
        return MatchResult(True)


# -------------------------------------------------------------------------------------------------------------
# Parsing helpers. Each takes the object and the problems list; none raises on bad input.


def _name_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if isinstance(meta, Mapping):
        ns = meta.get("namespace")
        name = str(meta.get("name", "<unnamed>"))
        return f"{ns}/{name}" if ns else name
    return "<unnamed>"


def _quantity(value: Any, kind: str, name: str, path: str, problems: list[Problem]) -> Fraction | None:
    if isinstance(value, bool):
        problems.append(Problem(kind, name, path, f"expected a quantity, got {value!r}"))
        return None
    if isinstance(value, int | float):
        return Fraction(value)
    try:
        return parse_quantity(str(value))
    except QuantityError as exc:
        problems.append(Problem(kind, name, path, str(exc)))
        return None


def _taints(items: Any, kind: str, name: str, path: str, problems: list[Problem]) -> tuple[Taint, ...]:
    out = []
    for i, t in enumerate(items or []):
        if not isinstance(t, Mapping) or not t.get("key") or not t.get("effect"):
            problems.append(Problem(kind, name, f"{path}[{i}]", "a taint needs key and effect"))
            continue
        out.append(Taint(str(t["key"]), str(t.get("value", "")), str(t["effect"])))
    return tuple(out)


def _parse_node(obj: Mapping[str, Any], problems: list[Problem]) -> Node | None:
    name = _name_of(obj)
    if not isinstance(obj, Mapping) or name == "<unnamed>":
        problems.append(Problem("Node", name, "metadata.name", "required"))
        return None
    status = obj.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    cpu = _quantity(alloc.get("cpu", "0"), "Node", name, "status.allocatable.cpu", problems)
    mem = _quantity(alloc.get("memory", "0"), "Node", name, "status.allocatable.memory", problems)
    pods = _quantity(alloc.get("pods", DEFAULT_MAX_PODS), "Node", name, "status.allocatable.pods", problems)
    if cpu is None or mem is None or pods is None:
        return None
    spec = obj.get("spec") or {}
    labels = dict((obj.get("metadata") or {}).get("labels") or {})
    return Node(
        name=name,
        cpu_milli=int(cpu * 1000),
        memory_bytes=int(mem),
        max_pods=int(pods),
        labels=labels,
        taints=_taints(spec.get("taints"), "Node", name, "spec.taints", problems),
        unschedulable=bool(spec.get("unschedulable", False)),
    )


def _attribute_value(raw: Any) -> object | None:
    if not isinstance(raw, Mapping) or len(raw) != 1:
        return None
    (kind, value), = raw.items()
    if kind == "version":
        return Semver.parse(str(value))
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "string" and isinstance(value, str):
        return value
    if kind in ("strings", "ints", "bools", "versions") and isinstance(value, list):
        return [Semver.parse(str(v)) for v in value] if kind == "versions" else list(value)
    return None


def _qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _parse_request_policy(raw: Any, where: str, name: str, problems: list[Problem]) -> RequestPolicy | None:
    if not raw:
        return None
    default = None
    if "default" in raw:
        default = _quantity(raw["default"], "ResourceSlice", name, f"{where}.default", problems)
    values = tuple(
        q for i, v in enumerate(raw.get("validValues") or [])
        if (q := _quantity(v, "ResourceSlice", name, f"{where}.validValues[{i}]", problems)) is not None
    )
    rng = raw.get("validRange") or {}

    def opt(key: str) -> Fraction | None:
        return _quantity(rng[key], "ResourceSlice", name, f"{where}.validRange.{key}", problems) if key in rng else None

    return RequestPolicy(default, values, opt("min"), opt("max"), opt("step"))


def _parse_device(
    raw: Any, i: int, *, driver: str, pool: str, node_name: str, slice_name: str, problems: list[Problem]
) -> Device | None:
    path = f"spec.devices[{i}]"
    if not isinstance(raw, Mapping) or not raw.get("name"):
        problems.append(Problem("ResourceSlice", slice_name, f"{path}.name", "required"))
        return None
    dev_name = str(raw["name"])
    attributes: dict[str, object] = {}
    for attr_name, attr_raw in (raw.get("attributes") or {}).items():
        try:
            value = _attribute_value(attr_raw)
        except ValueError as exc:
            problems.append(Problem("ResourceSlice", slice_name, f"{path}.attributes[{attr_name}]", str(exc)))
            return None
        if value is None:
            problems.append(Problem("ResourceSlice", slice_name, f"{path}.attributes[{attr_name}]",
                                    "expected exactly one of int, bool, string, version"))
            return None
        attributes[_qualify(str(attr_name), driver)] = value
    capacity: dict[str, Capacity] = {}
    for cap_name, cap_raw in (raw.get("capacity") or {}).items():
        where = f"{path}.capacity[{cap_name}]"
        if not isinstance(cap_raw, Mapping) or "value" not in cap_raw:
            problems.append(Problem("ResourceSlice", slice_name, f"{where}.value", "required"))
            return None
        value = _quantity(cap_raw["value"], "ResourceSlice", slice_name, f"{where}.value", problems)
        if value is None:
            return None
        policy = _parse_request_policy(cap_raw.get("requestPolicy"), f"{where}.requestPolicy", slice_name, problems)
        capacity[_qualify(str(cap_name), driver)] = Capacity(value, policy)
    consumes = []
    for j, cc in enumerate(raw.get("consumesCounters") or []):
        where = f"{path}.consumesCounters[{j}]"
        if not isinstance(cc, Mapping) or not cc.get("counterSet"):
            problems.append(Problem("ResourceSlice", slice_name, f"{where}.counterSet", "required"))
            return None
        counters = {}
        for cname, craw in (cc.get("counters") or {}).items():
            q = _quantity((craw or {}).get("value"), "ResourceSlice", slice_name, f"{where}.counters[{cname}]",
                          problems)
            if q is None:
                return None
            counters[str(cname)] = q
        consumes.append(CounterConsumption(str(cc["counterSet"]), counters))
    return Device(
        id=DeviceId(driver, pool, dev_name),
        node_name=str(raw.get("nodeName") or node_name),
        attributes=attributes,
        capacity=capacity,
        taints=_taints(raw.get("taints"), "ResourceSlice", slice_name, f"{path}.taints", problems),
        allow_multiple_allocations=bool(raw.get("allowMultipleAllocations", False)),
        consumes_counters=tuple(consumes),
    )


def _parse_slices(
    slices: list[Mapping[str, Any]], node_names: set[str], problems: list[Problem]
) -> tuple[list[Device], dict[tuple[str, str, str], dict[str, Fraction]]]:
    # A consumer must use only the highest generation of a pool, and only when all its slices are present.
    pools: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for obj in slices:
        name = _name_of(obj)
        spec = obj.get("spec") if isinstance(obj, Mapping) else None
        if not isinstance(spec, Mapping):
            problems.append(Problem("ResourceSlice", name, "spec", "required"))
            continue
        pool = spec.get("pool")
        if not spec.get("driver") or not isinstance(pool, Mapping) or not pool.get("name"):
            problems.append(Problem("ResourceSlice", name, "spec.driver/spec.pool.name", "required"))
            continue
        pools[(str(spec["driver"]), str(pool["name"]))].append(obj)
    devices: list[Device] = []
    counter_sets: dict[tuple[str, str, str], dict[str, Fraction]] = {}
    for (driver, pool_name), objs in sorted(pools.items()):
        newest = max(int(o["spec"]["pool"].get("generation", 0)) for o in objs)
        current = [o for o in objs if int(o["spec"]["pool"].get("generation", 0)) == newest]
        expected = int(current[0]["spec"]["pool"].get("resourceSliceCount", 1))
        if len(current) < expected:
            problems.append(Problem("ResourceSlice", f"{driver}/{pool_name}", "spec.pool.resourceSliceCount",
                                    f"pool incomplete: {len(current)} of {expected} slices of generation {newest}"))
            continue
        seen: set[str] = set()
        for obj in current:
            spec, name = obj["spec"], _name_of(obj)
            node_name = str(spec.get("nodeName") or "")
            if node_name and node_name not in node_names:
                problems.append(Problem("ResourceSlice", name, "spec.nodeName", f"node {node_name!r} not found"))
                continue
            for cs in spec.get("sharedCounters") or []:
                counters = {}
                for cname, craw in (cs.get("counters") or {}).items():
                    q = _quantity((craw or {}).get("value"), "ResourceSlice", name,
                                  f"spec.sharedCounters[{cs.get('name')}].counters[{cname}]", problems)
                    if q is not None:
                        counters[str(cname)] = q
                counter_sets[(driver, pool_name, str(cs.get("name")))] = counters
            for i, raw in enumerate(spec.get("devices") or []):
                dev = _parse_device(raw, i, driver=driver, pool=pool_name, node_name=node_name, slice_name=name,
                                    problems=problems)
                if dev is None:
                    continue
                if dev.id.name in seen:
                    problems.append(Problem("ResourceSlice", name, f"spec.devices[{i}].name",
                                            f"duplicate device {dev.id.name!r} in pool {pool_name!r}"))
                    continue
                if not dev.node_name:
                    problems.append(Problem("ResourceSlice", name, f"spec.devices[{i}]",
                                            "network-attached devices (no nodeName) are not placed by infer-ctl"))
                    continue
                seen.add(dev.id.name)
                devices.append(dev)
    return devices, counter_sets


def _parse_device_class(obj: Mapping[str, Any], problems: list[Problem]) -> DeviceClass | None:
    name = _name_of(obj)
    if name == "<unnamed>":
        problems.append(Problem("DeviceClass", name, "metadata.name", "required"))
        return None
    selectors = []
    for i, sel in enumerate((obj.get("spec") or {}).get("selectors") or []):
        expr = ((sel or {}).get("cel") or {}).get("expression")
        if not isinstance(expr, str):
            problems.append(Problem("DeviceClass", name, f"spec.selectors[{i}].cel.expression", "required"))
            continue
        try:
            compile_expression(expr, variables=("device",))
        except CelCompileError as exc:
            # Kept: the class then matches nothing, and every match says why.
            problems.append(Problem("DeviceClass", name, f"spec.selectors[{i}].cel.expression", exc.message))
        selectors.append(expr)
    return DeviceClass(name, tuple(selectors))


def _parse_claim_allocations(
    obj: Mapping[str, Any], known: set[DeviceId], problems: list[Problem]
) -> list[Allocation]:
    name = _name_of(obj)
    alloc = ((obj.get("status") or {}).get("allocation") or {}) if isinstance(obj, Mapping) else {}
    out = []
    for i, res in enumerate((alloc.get("devices") or {}).get("results") or []):
        path = f"status.allocation.devices.results[{i}]"
        if not isinstance(res, Mapping) or not all(res.get(k) for k in ("driver", "pool", "device")):
            problems.append(Problem("ResourceClaim", name, path, "driver, pool and device are required"))
            continue
        dev = DeviceId(str(res["driver"]), str(res["pool"]), str(res["device"]))
        if dev not in known:
            problems.append(Problem("ResourceClaim", name, f"{path}.device",
                                    f"allocated device {dev} is not in any current ResourceSlice"))
        consumed = {}
        for cname, q in (res.get("consumedCapacity") or {}).items():
            value = _quantity(q, "ResourceClaim", name, f"{path}.consumedCapacity[{cname}]", problems)
            if value is not None:
                consumed[_qualify(str(cname), dev.driver)] = value
        out.append(Allocation(name, dev, consumed, str(res.get("shareID") or ""), bool(res.get("adminAccess"))))
    return out


def _node_usage(pods: Iterable[Mapping[str, Any]], problems: list[Problem]) -> dict[str, NodeUsage]:
    usage: dict[str, NodeUsage] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not node or phase in ("Succeeded", "Failed"):
            continue
        cpu = Fraction(0)
        mem = Fraction(0)
        for c in spec.get("containers") or []:
            req = (c.get("resources") or {}).get("requests") or {}
            cpu += _quantity(req.get("cpu", "0"), "Pod", _name_of(pod), "spec.containers.resources.requests.cpu",
                             problems) or 0
            mem += _quantity(req.get("memory", "0"), "Pod", _name_of(pod),
                             "spec.containers.resources.requests.memory", problems) or 0
        prev = usage.get(str(node), NodeUsage())
        usage[str(node)] = NodeUsage(prev.cpu_milli + int(cpu * 1000), prev.memory_bytes + int(mem), prev.pods + 1)
    return usage
