"""kube-scheduler's structured DRA allocator, for the sandbox: first match in slice order, with backtracking.

The device model and the CEL evaluation are the placement engine's (`infer_ctl.place.inventory.Inventory`:
`devices_on`, `matches` with compiled-once programs, `free` accounting of existing allocations and shared
counters); this module adds what the scheduler does on top: requests in claim order, `ExactCount` and `All`,
`firstAvailable` sub-requests, `matchAttribute`/`distinctAttribute` constraints, counters and consumable
capacity of the devices taken so far in this cycle, and the result in `status.allocation` form.

Like kube-scheduler, it does not score devices: the first combination that satisfies everything wins, in the
order of slices (by name) and devices within them. Fragmentation-aware choice is the controller's job (it pins a
device through the claim's selectors).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from infer_ctl.core.quantity import QuantityError, parse_quantity
from infer_ctl.place.inventory import Device, DeviceId, Inventory, Toleration

MAX_STEPS = 20_000  # kube-scheduler also bounds its search; past this the claim is reported unsatisfiable


@dataclass(frozen=True, slots=True)
class Alternative:
    """One way to satisfy a request: the request itself, or one `firstAvailable` sub-request."""

    name: str  # "req" or "req/sub"
    device_class: str
    selectors: tuple[str, ...]
    mode: str  # ExactCount | All
    count: int
    capacity: Mapping[str, Fraction]
    tolerations: tuple[Toleration, ...]


@dataclass(frozen=True, slots=True)
class Constraint:
    requests: tuple[str, ...]  # empty: every request
    match_attribute: str | None
    distinct_attribute: str | None


@dataclass(frozen=True, slots=True)
class Pick:
    request: str
    device: Device
    consumed: Mapping[str, Fraction]


@dataclass
class _Ledger:
    """Devices and counters in use: the inventory's allocations plus what this cycle took so far."""

    inventory: Inventory
    exclusive: set[DeviceId] = field(default_factory=set)
    consumed: dict[DeviceId, dict[str, Fraction]] = field(default_factory=lambda: defaultdict(dict))
    counters: dict[tuple[str, str, str], dict[str, Fraction]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        by_id = {d.id: d for d in self.inventory.devices}
        for alloc in self.inventory.allocations:
            device = by_id.get(alloc.device)
            if device is None:
                continue
            self._add(device, alloc.consumed, +1)

    def _add(self, device: Device, consumed: Mapping[str, Fraction], sign: int) -> None:
        if not device.allow_multiple_allocations:
            if sign > 0:
                self.exclusive.add(device.id)
            else:
                self.exclusive.discard(device.id)
        else:
            used = self.consumed[device.id]
            for name, amount in consumed.items():
                used[name] = used.get(name, Fraction(0)) + sign * amount
        for cc in device.consumes_counters:
            key = (device.id.driver, device.id.pool, cc.counter_set)
            used_counters = self.counters.setdefault(key, {})
            for name, amount in cc.counters.items():
                used_counters[name] = used_counters.get(name, Fraction(0)) + sign * amount

    def take(self, pick: Pick) -> None:
        self._add(pick.device, pick.consumed, +1)

    def release(self, pick: Pick) -> None:
        self._add(pick.device, pick.consumed, -1)

    def shared_in_use(self, device: Device) -> bool:
        return any(v > 0 for v in self.consumed.get(device.id, {}).values())

    def fits(self, device: Device, alternative: Alternative) -> tuple[dict[str, Fraction] | None, str]:
        """What taking `device` would consume, or None with the reason it cannot be taken now."""
        if device.id in self.exclusive:
            return None, "already allocated"
        consumed: dict[str, Fraction] = {}
        if device.allow_multiple_allocations:
            for name, cap in device.capacity.items():
                short = name.rpartition("/")[2]
                asked = alternative.capacity.get(short, alternative.capacity.get(name))
                if cap.request_policy is not None:
                    amount = cap.request_policy.round_up(asked)
                else:
                    amount = asked if asked is not None else cap.value
                if amount is None:
                    return None, f"{short} request outside the device's request policy"
                used = self.consumed.get(device.id, {}).get(name, Fraction(0))
                if used + amount > cap.value:
                    return None, f"not enough {short} left ({cap.value - used} of {cap.value})"
                consumed[name] = amount
        else:
            for cap_name, asked in alternative.capacity.items():
                whole = device.capacity.get(cap_name) or device.capacity.get(f"{device.id.driver}/{cap_name}")
                if whole is None or whole.value < asked:
                    return None, f"capacity {cap_name} below the request"
            if self.shared_in_use(device):
                return None, "shared by other allocations"
        for cc in device.consumes_counters:
            key = (device.id.driver, device.id.pool, cc.counter_set)
            total = self.inventory.counter_sets.get(key, {})
            in_use = self.counters.get(key, {})
            for name, amount in cc.counters.items():
                if total.get(name, Fraction(0)) - in_use.get(name, Fraction(0)) < amount:
                    return None, f"counter {cc.counter_set}/{name} exhausted (an overlapping partition is in use)"
        return consumed, ""


class ClaimError(ValueError):
    """A claim the allocator cannot read (bad request shape); the message names the field."""


def parse_requests(claim: Mapping[str, Any]) -> tuple[list[list[Alternative]], list[Constraint]]:
    devices = ((claim.get("spec") or {}).get("devices") or {})
    requests: list[list[Alternative]] = []
    for i, request in enumerate(devices.get("requests") or []):
        name = str(request.get("name", f"request-{i}"))
        if request.get("firstAvailable"):
            requests.append([_alternative(f"{name}/{sub.get('name')}", sub, f"spec.devices.requests[{i}]."
                                          f"firstAvailable[{j}]") for j, sub in enumerate(request["firstAvailable"])])
        elif request.get("exactly"):
            requests.append([_alternative(name, request["exactly"], f"spec.devices.requests[{i}].exactly")])
        else:
            raise ClaimError(f"spec.devices.requests[{i}]: exactly one of exactly or firstAvailable is required")
    constraints = [Constraint(tuple(c.get("requests") or ()), c.get("matchAttribute"), c.get("distinctAttribute"))
                   for c in devices.get("constraints") or []]
    return requests, constraints


def _alternative(name: str, raw: Mapping[str, Any], path: str) -> Alternative:
    if not raw.get("deviceClassName"):
        raise ClaimError(f"{path}.deviceClassName: Required value")
    capacity: dict[str, Fraction] = {}
    for cname, q in ((raw.get("capacity") or {}).get("requests") or {}).items():
        try:
            capacity[str(cname)] = parse_quantity(str(q))
        except QuantityError as e:
            raise ClaimError(f"{path}.capacity.requests[{cname}]: {e}") from None
    return Alternative(
        name=name, device_class=str(raw["deviceClassName"]),
        selectors=tuple(str((s.get("cel") or {}).get("expression", "")) for s in raw.get("selectors") or []),
        mode=str(raw.get("allocationMode") or "ExactCount"), count=int(raw.get("count") or 1), capacity=capacity,
        tolerations=tuple(Toleration(str(t.get("key", "")), str(t.get("operator", "Equal")),
                                     str(t.get("value", "")), str(t.get("effect", "")))
                          for t in raw.get("tolerations") or []))


@dataclass
class _Search:
    inventory: Inventory
    ledger: _Ledger
    devices: Sequence[Device]
    constraints: Sequence[Constraint]
    steps: int = 0
    why: dict[str, str] = field(default_factory=dict)

    def candidates(self, alternative: Alternative) -> list[Device]:
        out = []
        for device in self.devices:
            match = self.inventory.matches(device, alternative.device_class, alternative.selectors)
            if not match.ok:
                self.why.setdefault(alternative.name, match.reason)
                continue
            untolerated = [t for t in device.taints if t.effect in ("NoSchedule", "NoExecute") and
                           not any(tol.tolerates(t) for tol in alternative.tolerations)]
            if untolerated:
                self.why.setdefault(alternative.name, f"device taint {untolerated[0].key} not tolerated")
                continue
            out.append(device)
        return out

    def constraints_ok(self, picks: Sequence[Pick]) -> bool:
        for constraint in self.constraints:
            scoped = [p for p in picks if not constraint.requests or p.request.split("/")[0] in constraint.requests
                      or p.request in constraint.requests]
            for attribute, distinct in ((constraint.match_attribute, False), (constraint.distinct_attribute, True)):
                if not attribute:
                    continue
                values = [p.device.attributes.get(attribute) for p in scoped]
                if any(v is None for v in values):
                    return False
                if distinct and len({repr(v) for v in values}) != len(values):
                    return False
                if not distinct and len({repr(v) for v in values}) > 1:
                    return False
        return True

    def solve(self, requests: Sequence[Sequence[Alternative]], picks: list[Pick]) -> list[Pick] | None:
        if not requests:
            return list(picks)
        for alternative in requests[0]:
            candidates = self.candidates(alternative)
            if alternative.mode == "All":
                result = self._take_all(alternative, candidates, requests[1:], picks)
            else:
                result = self._take_n(alternative, candidates, 0, alternative.count, rest=requests[1:], picks=picks)
            if result is not None:
                return result
        return None

    def _take_all(self, alternative: Alternative, candidates: list[Device], rest: Sequence[Sequence[Alternative]],
                  picks: list[Pick]) -> list[Pick] | None:
        if not candidates:
            self.why.setdefault(alternative.name, "no device matches (allocationMode All needs at least one)")
            return None
        taken: list[Pick] = []
        for device in candidates:
            consumed, reason = self.ledger.fits(device, alternative)
            if consumed is None:
                self.why[alternative.name] = f"allocationMode All: {device.id.name} is {reason}"
                for pick in taken:
                    self.ledger.release(pick)
                return None
            pick = Pick(alternative.name, device, consumed)
            self.ledger.take(pick)
            taken.append(pick)
        result = self.solve(rest, picks + taken) if self.constraints_ok(picks + taken) else None
        for pick in taken:
            self.ledger.release(pick)
        return result

    def _take_n(self, alternative: Alternative, candidates: list[Device], start: int, needed: int, *,
                rest: Sequence[Sequence[Alternative]], picks: list[Pick]) -> list[Pick] | None:
        if needed == 0:
            return self.solve(rest, picks)
        chosen = {p.device.id for p in picks if not p.device.allow_multiple_allocations}
        for index in range(start, len(candidates)):
            self.steps += 1
            if self.steps > MAX_STEPS:
                self.why[alternative.name] = "search limit reached"
                return None
            device = candidates[index]
            if device.id in chosen:
                continue
            consumed, reason = self.ledger.fits(device, alternative)
            if consumed is None:
                self.why[alternative.name] = f"{device.id.name}: {reason}"
                continue
            pick = Pick(alternative.name, device, consumed)
            if not self.constraints_ok([*picks, pick]):
                self.why[alternative.name] = "constraints not satisfied"
                continue
            self.ledger.take(pick)
            result = self._take_n(alternative, candidates, index + 1, needed - 1, rest=rest, picks=[*picks, pick])
            self.ledger.release(pick)
            if result is not None:
                return result
        if len(candidates) < needed:
            self.why.setdefault(alternative.name, f"{len(candidates)} matching device(s), {needed} requested")
        return None


@dataclass
class Allocator:
    """Allocates claims against one inventory; successive allocations in a cycle see each other."""

    inventory: Inventory

    def __post_init__(self) -> None:
        self.ledger = _Ledger(self.inventory)
        self._slice_order = {d.id: i for i, d in enumerate(self.inventory.devices)}

    def allocate(self, claims: Sequence[Mapping[str, Any]], node_name: str) -> tuple[list[dict[str, Any]] | None,
                                                                                      str]:
        """Allocate every claim on `node_name`: the `status.allocation` of each, or None and why not.

        Nothing is recorded unless all claims fit (a pod needs all its claims); call `commit` to keep it.
        """
        devices = self.inventory.devices_on(node_name)
        allocations: list[dict[str, Any]] = []
        taken: list[Pick] = []
        try:
            for claim in claims:
                requests, constraints = parse_requests(claim)
                search = _Search(self.inventory, self.ledger, devices, constraints)
                picks = search.solve(requests, [])
                if picks is None:
                    reasons = "; ".join(f"{req}: {why}" for req, why in search.why.items()) or "no devices"
                    return None, f"claim {claim['metadata']['name']} cannot be allocated ({reasons})"
                for pick in picks:
                    self.ledger.take(pick)
                    taken.append(pick)
                allocations.append(self._allocation(claim, picks, node_name))
        except ClaimError as e:
            return None, f"claim {claims[len(allocations)]['metadata']['name']}: {e}"
        finally:
            for pick in taken:
                self.ledger.release(pick)
        self._pending = taken
        return allocations, ""

    def commit(self) -> None:
        for pick in getattr(self, "_pending", []):
            self.ledger.take(pick)
        self._pending = []

    def _allocation(self, claim: Mapping[str, Any], picks: Sequence[Pick], node: str) -> dict[str, Any]:
        results = []
        for pick in picks:
            result: dict[str, Any] = {"request": pick.request, "driver": pick.device.id.driver,
                                      "pool": pick.device.id.pool, "device": pick.device.id.name}
            if pick.device.allow_multiple_allocations:
                result["shareID"] = str(uuid.uuid4())
                result["consumedCapacity"] = {name.rpartition("/")[2]: _quantity(v)
                                              for name, v in pick.consumed.items()}
            results.append(result)
        # The sandbox's DeviceClasses carry no driver config, so only the claim's own config is copied.
        config = []
        for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
            config.append({**entry, "source": "FromClaim"})
        allocation: dict[str, Any] = {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                                      "values": [node]}]}]},
        }
        if config:
            allocation["devices"]["config"] = config
        return allocation


def _quantity(value: Fraction) -> str:
    gi = 1024 ** 3
    if value % gi == 0:
        return f"{int(value // gi)}Gi"
    return str(int(value)) if value.denominator == 1 else str(float(value))
