"""The sandbox's kube-scheduler (plus the resourceclaim controller's part that DRA needs).

Each cycle follows Kueue's and kube-scheduler's shape: one snapshot of the store (nodes, pods, claims, slices,
classes), decisions for every pending pod in priority order against tentative state, then the writes:
claim allocations with `reservedFor`, bindings, `PodScheduled=False` conditions with a kube-scheduler-like
message and a `FailedScheduling` Event. It runs in-process on the API server's loop and reads the store
directly (an informer without the HTTP hop); its writes go through the same store operations clients use.

Filters (what the project uses): nodeName, nodeSelector, required node affinity, taints and tolerations,
CPU/memory/pod-count requests, DRA claims (from `resourceClaimTemplates` too). Gangs: pods naming a
`scheduling.k8s.io/v1beta1` PodGroup in `spec.schedulingGroup` are placed all-or-nothing once `minCount` of
them can be. Preemption: a pod that fits nowhere may evict lower-priority pods on one node (fewest victims,
lowest priority first), as kube-scheduler's DefaultPreemption does.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from infer_ctl.core.quantity import QuantityError, parse_quantity
from infer_ctl.place.inventory import Inventory
from infer_ctl.sandbox.allocator import Allocator
from infer_ctl.sandbox.loops import run_on_changes
from infer_ctl.sandbox.store import ApiError, Event, Obj, Store, rfc3339

log = logging.getLogger(__name__)

_CLAIM_MISSING = "resourceclaim "
# ResourceClaimReservedForMaxSize: how many consumers one claim may have (a shared claim: several Pods, one device)
RESERVED_FOR_MAX = 256
# the finalizer kube-scheduler puts on a claim it allocates (k8s.io/api/resource/v1 `resourceapi.Finalizer`)
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"

_WATCHED = {("", "pods"), ("", "nodes"), ("resource.k8s.io", "resourceclaims"),
            ("resource.k8s.io", "resourceslices"), ("resource.k8s.io", "deviceclasses"),
            ("scheduling.k8s.io", "podgroups")}
_VOLUMES = {("", "persistentvolumes"), ("", "persistentvolumeclaims")}


def _q(value: Any) -> Fraction:
    try:
        return parse_quantity(str(value))
    except QuantityError:
        return Fraction(0)


def pod_requests(pod: Mapping[str, Any]) -> tuple[Fraction, Fraction]:
    """(cpu cores, memory bytes) as kube-scheduler counts them: sum of containers, max with init containers."""
    spec = pod.get("spec") or {}

    def of(containers: Sequence[Mapping[str, Any]]) -> list[tuple[Fraction, Fraction]]:
        out = []
        for c in containers:
            req = (c.get("resources") or {}).get("requests") or {}
            out.append((_q(req.get("cpu", 0)), _q(req.get("memory", 0))))
        return out

    main = of(spec.get("containers") or [])
    init = of(spec.get("initContainers") or [])
    cpu = sum((c for c, _ in main), Fraction(0))
    mem = sum((m for _, m in main), Fraction(0))
    for c, m in init:
        cpu, mem = max(cpu, c), max(mem, m)
    return cpu, mem


def _same_but_annotations(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether two versions of an object differ at most in their annotations (and resourceVersion)."""
    if old is None:
        return False

    def rest(obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in (obj.get("metadata") or {}).items()
                if k not in ("annotations", "resourceVersion", "managedFields")}
        return {**obj, "metadata": meta}

    return rest(old) == rest(new)


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _expression_ok(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    present = key in labels
    value = labels.get(str(key))
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            return int(str(value)) > int(values[0]) if op == "Gt" else int(str(value)) < int(values[0])
        except ValueError:
            return False
    return False


def _affinity_ok(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    required = ((((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in required.get("nodeSelectorTerms") or []:
        if all(_expression_ok(e, labels) for e in term.get("matchExpressions") or []) and \
                all(_expression_ok(e, fields) for e in term.get("matchFields") or []):
            return True
    return False


def _term_ok(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether `node` matches one NodeSelectorTerm (a claim's allocation's, a volume's node affinity's)."""
    return _affinity_ok({"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}}}, node)


@dataclass
class _NodeState:
    obj: Obj
    cpu: Fraction
    memory: Fraction
    pods: int
    used_cpu: Fraction = Fraction(0)
    used_memory: Fraction = Fraction(0)
    used_pods: int = 0

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


@dataclass
class _Decision:
    pod: Obj
    node: str
    claims: list[tuple[Obj, dict[str, Any] | None]]  # (claim, new allocation or None when already allocated)


@dataclass
class Scheduler:
    store: Store
    scheduler_name: str = "default-scheduler"
    cycles: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _last_message: dict[str, str] = field(default_factory=dict)
    _inventory: Inventory | None = None  # devices plus current allocations
    _devices: Inventory | None = None  # devices and classes only

    def __post_init__(self) -> None:
        self.store.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.key in _VOLUMES:
            self._wake.set()  # a claim bound (or a volume changed): a pod that waited for it may fit now
            return
        if event.key not in _WATCHED:
            return
        if event.key == ("", "pods"):
            if event.type == "DELETED":
                self._release_claims(event.obj)
            elif event.type == "MODIFIED" and not self._is_pending(event.obj) and \
                    not event.obj["metadata"].get("deletionTimestamp") and \
                    (event.obj.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                return  # a running pod's status report frees nothing and needs no scheduling
        else:
            if event.key == ("", "nodes") and event.type == "MODIFIED" and _same_but_annotations(event.old, event.obj):
                return  # what a node agent publishes there (model cache, host memory) changes no device
            self._inventory = None
            if event.key != ("resource.k8s.io", "resourceclaims"):
                self._devices = None  # devices, nodes or classes changed
        self._wake.set()

    async def run(self) -> None:
        # a burst of creations gathered into one cycle, as the scheduling queue does
        await run_on_changes(self._wake, self.cycle, "scheduling cycle", gather_s=0.005)

    # ------------------------------------------------------------------------------------------ cycle

    def cycle(self) -> int:
        """One pass over every pending pod; returns how many were bound."""
        self.cycles += 1
        store = self.store
        pods_rt = store.type("", "v1", "pods")
        pods = store.list_objects(pods_rt)
        pending = [p for p in pods if self._is_pending(p)]
        if not pending:
            return 0
        for pod in pending:
            self._ensure_template_claims(pod)
        claims_rt = store.type("resource.k8s.io", "v1", "resourceclaims")
        claims = store.list_objects(claims_rt)
        nodes = self._node_states(pods)
        if self._inventory is None:
            if self._devices is None:
                # Devices and classes change rarely; parsing 1,600 devices and compiling CEL is the expensive
                # part, and the inventory's CEL match memo stays valid as long as they do not change.
                self._devices = Inventory.build(
                    nodes=[n.obj for n in nodes.values()],
                    slices=store.list_objects(store.type("resource.k8s.io", "v1", "resourceslices")),
                    device_classes=store.list_objects(store.type("resource.k8s.io", "v1", "deviceclasses")))
            # Allocations change with every binding: parse only the claims, onto the same devices (and memo).
            allocated = Inventory.build(claims=[c for c in claims if (c.get("status") or {}).get("allocation")])
            self._inventory = dataclasses.replace(self._devices, allocations=allocated.allocations)
        inventory = self._inventory
        allocator = Allocator(inventory)
        by_claim = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in claims}
        pending = [p for p in store.list_objects(pods_rt) if self._is_pending(p)]
        pending.sort(key=lambda p: (-int((p.get("spec") or {}).get("priority") or 0),
                                    p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
        bound = 0
        done_groups: set[tuple[str, str]] = set()
        for pod in pending:
            group = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
            if group:
                key = (pod["metadata"]["namespace"], str(group))
                if key not in done_groups:
                    done_groups.add(key)
                    bound += self._schedule_gang(key, pending, pods, nodes=nodes, allocator=allocator,
                                                 by_claim=by_claim)
                continue
            decision, message = self._place(pod, nodes, allocator, by_claim)
            if decision is None and not message:
                continue
            if decision is None:
                decision, message = self._preempt(pod, pods, nodes, by_claim, message)
            if decision is None:
                self._mark_unschedulable(pod, message)
                continue
            self._write(decision)
            bound += 1
        return bound

    def _is_pending(self, pod: Mapping[str, Any]) -> bool:
        spec = pod.get("spec") or {}
        return (not spec.get("nodeName") and spec.get("schedulerName", "default-scheduler") == self.scheduler_name
                and not pod["metadata"].get("deletionTimestamp") and not spec.get("schedulingGates")
                and (pod.get("status") or {}).get("phase", "Pending") == "Pending")

    def _node_states(self, pods: Sequence[Obj]) -> dict[str, _NodeState]:
        nodes = {}
        for node in self.store.list_objects(self.store.type("", "v1", "nodes")):
            alloc = (node.get("status") or {}).get("allocatable") or {}
            nodes[node["metadata"]["name"]] = _NodeState(node, _q(alloc.get("cpu", 0)), _q(alloc.get("memory", 0)),
                                                         int(alloc.get("pods", 110)))
        for pod in pods:
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name in nodes and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                cpu, mem = pod_requests(pod)
                state = nodes[node_name]
                state.used_cpu += cpu
                state.used_memory += mem
                state.used_pods += 1
        return nodes

    # ------------------------------------------------------------------------------------------ claims

    def _ensure_template_claims(self, pod: Obj) -> None:
        """The resourceclaim controller: one claim per template reference, owned by the pod."""
        spec = pod.get("spec") or {}
        refs = [r for r in spec.get("resourceClaims") or [] if r.get("resourceClaimTemplateName")]
        if not refs:
            return
        statuses = {s.get("name"): s.get("resourceClaimName") for s in
                    (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        claims_rt = self.store.type("resource.k8s.io", "v1", "resourceclaims")
        templates_rt = self.store.type("resource.k8s.io", "v1", "resourceclaimtemplates")
        changed = False
        for ref in refs:
            if statuses.get(ref["name"]) and self.store.find(claims_rt, namespace, statuses[ref["name"]]):
                continue
            template = self.store.find(templates_rt, namespace, ref["resourceClaimTemplateName"])
            if template is None:
                continue
            body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                    "metadata": {"generateName": f"{name}-{ref['name']}-", "namespace": namespace,
                                 "labels": dict((template.get("spec") or {}).get("metadata", {}).get("labels") or {}),
                                 "annotations": {"resource.kubernetes.io/pod-claim-name": ref["name"]},
                                 "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name,
                                                      "uid": pod["metadata"]["uid"], "controller": True,
                                                      "blockOwnerDeletion": True}]},
                    "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {})}
            claim, _ = self.store.create(claims_rt, namespace, body)
            statuses[ref["name"]] = claim["metadata"]["name"]
            changed = True
        if changed:
            new = copy.deepcopy(self.store.get(self.store.type("", "v1", "pods"), namespace, name))
            new.setdefault("status", {})["resourceClaimStatuses"] = [
                {"name": k, "resourceClaimName": v} for k, v in statuses.items() if v]
            self.store.update(self.store.type("", "v1", "pods"), namespace, name, new, subresource="status",
                              check_rv=False)

    def _pod_claims(self, pod: Obj, by_claim: Mapping[tuple[str, str], Obj]) -> tuple[list[Obj] | None, str]:
        namespace = pod["metadata"]["namespace"]
        current = self.store.find(self.store.type("", "v1", "pods"), namespace, pod["metadata"]["name"]) or pod
        statuses = {s.get("name"): s.get("resourceClaimName") for s in
                    (current.get("status") or {}).get("resourceClaimStatuses") or []}
        claims = []
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            claim_name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
            if not claim_name:
                return None, (f'waiting for resource claim template "{ref.get("resourceClaimTemplateName")}" '
                              f'of pod claim "{ref.get("name")}"')
            claim = self.store.find(self.store.type("resource.k8s.io", "v1", "resourceclaims"), namespace,
                                    claim_name) or by_claim.get((namespace, claim_name))
            if claim is None:
                return None, f'{_CLAIM_MISSING}"{claim_name}" not found'
            if claim["metadata"].get("deletionTimestamp"):
                return None, f'resourceclaim "{claim_name}" is being deleted'
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if (claim.get("status") or {}).get("allocation") and len(reserved) >= RESERVED_FOR_MAX and \
                    not any(r.get("uid") == pod["metadata"]["uid"] for r in reserved):
                return None, "resourceclaim in use"  # kube-scheduler's words: the pod waits for a consumer to go
            claims.append(claim)
        return claims, ""

    def _missing_device_class(self, claims: Sequence[Obj]) -> str:
        """kube-scheduler's DynamicResources PreFilter: a request naming a DeviceClass that does not exist."""
        classes_rt = self.store.type("resource.k8s.io", "v1", "deviceclasses")
        for claim in claims:
            if (claim.get("status") or {}).get("allocation"):
                continue
            for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
                variants = [request.get("exactly") or {}, *(request.get("firstAvailable") or [])]
                for variant in variants:
                    name = variant.get("deviceClassName")
                    if name and self.store.find(classes_rt, None, str(name)) is None:
                        return f"request {request.get('name')}: device class {name} does not exist"
        return ""

    def _release_claims(self, pod: Obj) -> None:
        """The resourceclaim controller: drop a gone pod from `reservedFor`; deallocate unused claims, lifting
        their delete protection (a claim deleted while reserved goes now)."""
        uid = pod["metadata"]["uid"]
        claims_rt = self.store.type("resource.k8s.io", "v1", "resourceclaims")
        for claim in self.store.list_objects(claims_rt, pod["metadata"].get("namespace")):
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if not any(r.get("uid") == uid for r in reserved):
                continue
            new = copy.deepcopy(claim)
            rest = [r for r in reserved if r.get("uid") != uid]
            if rest:
                new["status"]["reservedFor"] = rest
            else:
                new["status"].pop("reservedFor", None)
                new["status"].pop("allocation", None)
            updated, _ = self.store.update(claims_rt, claim["metadata"]["namespace"], claim["metadata"]["name"],
                                           new, subresource="status", check_rv=False)
            finalizers = updated["metadata"].get("finalizers") or []
            if not rest and DELETE_PROTECTION in finalizers:
                unprotected = copy.deepcopy(updated)
                unprotected["metadata"]["finalizers"] = [f for f in finalizers if f != DELETE_PROTECTION] or None
                self.store.update(claims_rt, claim["metadata"]["namespace"], claim["metadata"]["name"],
                                  unprotected, check_rv=False)

    # ------------------------------------------------------------------------------------------ filters

    def _place(self, pod: Obj, nodes: Mapping[str, _NodeState], allocator: Allocator,
               by_claim: Mapping[tuple[str, str], Obj]) -> tuple[_Decision | None, str]:
        claims, why = self._pod_claims(pod, by_claim)
        if claims is None:
            if why.startswith(_CLAIM_MISSING) and why.endswith(" not found"):
                return None, ""  # kube-scheduler's PreEnqueue holds the pod back silently until its claim exists
            return None, f"0/{len(nodes)} nodes are available: {why}."
        missing_class = self._missing_device_class(claims)
        if missing_class:
            return None, f"0/{len(nodes)} nodes are available: {missing_class}."
        volume_terms, unbound = self._volume_node_terms(pod)
        if unbound:
            return None, f"0/{len(nodes)} nodes are available: {unbound}."
        reasons: Counter[str] = Counter()
        feasible: list[tuple[Fraction, str, list[tuple[Obj, dict[str, Any] | None]]]] = []
        cpu, mem = pod_requests(pod)
        for state in nodes.values():
            reason = self._node_filter(pod, state, cpu, mem, volume_terms)
            if reason:
                reasons[reason] += 1
                continue
            plan: list[tuple[Obj, dict[str, Any] | None]] = []
            to_allocate = []
            for claim in claims:
                allocation = (claim.get("status") or {}).get("allocation")
                if allocation:
                    terms = ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or [])
                    if terms and not any(_term_ok(t, state.obj) for t in terms):
                        reason = "node(s) didn't match the allocated resource claim's node selector"
                        break
                    plan.append((claim, None))
                else:
                    to_allocate.append(claim)
            if reason:
                reasons[reason] += 1
                continue
            if to_allocate:
                allocations, why = allocator.allocate(to_allocate, state.name)
                if allocations is None:
                    reasons[f"cannot allocate all claims ({why})"] += 1
                    continue
                plan.extend(zip(to_allocate, allocations, strict=True))
            # LeastAllocated-style score: prefer the node with the most free CPU and memory (share).
            free = ((state.cpu - state.used_cpu - cpu) / state.cpu if state.cpu else Fraction(0)) + \
                   ((state.memory - state.used_memory - mem) / state.memory if state.memory else Fraction(0))
            feasible.append((-free, state.name, plan))
        if not feasible:
            summary = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda rn: (-rn[1], rn[0])))
            return None, f"0/{len(nodes)} nodes are available: {summary}."
        _, node_name, plan = min(feasible, key=lambda f: (f[0], f[1]))
        # Re-run the winner's allocation so the allocator's ledger holds exactly these devices.
        fresh = [c for c, a in plan if a is not None]
        if fresh:
            allocations, _ = allocator.allocate(fresh, node_name)
            assert allocations is not None
            allocator.commit()
            mapping = {id(c): a for c, a in zip(fresh, allocations, strict=True)}
            plan = [(c, mapping.get(id(c)) if a is not None else None) for c, a in plan]
        state = nodes[node_name]
        state.used_cpu += cpu
        state.used_memory += mem
        state.used_pods += 1
        return _Decision(pod, node_name, plan), ""

    def _volume_node_terms(self, pod: Obj) -> tuple[list[list[Mapping[str, Any]]], str]:
        """kube-scheduler's VolumeBinding for claims bound ahead: the node selector terms of the volume of each of
        the pod's PersistentVolumeClaims (a node must match one term of each), or why the pod cannot be placed
        on any node (a claim missing, being deleted or not bound: the sandbox provisions nothing)."""
        claims_rt = self.store.type("", "v1", "persistentvolumeclaims")
        volumes_rt = self.store.type("", "v1", "persistentvolumes")
        namespace = pod["metadata"]["namespace"]
        out: list[list[Mapping[str, Any]]] = []
        for volume in (pod.get("spec") or {}).get("volumes") or ():
            ref = volume.get("persistentVolumeClaim")
            if not ref:
                continue
            name = str(ref.get("claimName") or "")
            claim = self.store.find(claims_rt, namespace, name)
            if claim is None:
                return [], f'persistentvolumeclaim "{name}" not found'
            if claim["metadata"].get("deletionTimestamp"):
                return [], f'persistentvolumeclaim "{name}" is being deleted'
            if (claim.get("status") or {}).get("phase") != "Bound":
                return [], "pod has unbound immediate PersistentVolumeClaims"
            bound = self.store.find(volumes_rt, None, str((claim.get("spec") or {}).get("volumeName") or ""))
            if bound is None:
                return [], f'persistentvolume "{(claim.get("spec") or {}).get("volumeName")}" not found'
            terms = ((((bound.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {})
                     .get("nodeSelectorTerms") or [])
            if terms:
                out.append(list(terms))
        return out, ""

    def _node_filter(self, pod: Obj, state: _NodeState, cpu: Fraction, mem: Fraction,
                     volume_terms: Sequence[Sequence[Mapping[str, Any]]] = ()) -> str:
        spec = pod.get("spec") or {}
        node = state.obj
        labels = node["metadata"].get("labels") or {}
        tolerations = spec.get("tolerations") or []
        # kube-scheduler's filter order: NodeUnschedulable, TaintToleration, NodeAffinity, NodeResourcesFit.
        if (node.get("spec") or {}).get("unschedulable") and not _tolerates(
                tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}):
            return "node(s) were unschedulable"
        for taint in (node.get("spec") or {}).get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(tolerations, taint):
                return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()) or \
                not _affinity_ok(pod, node):
            return "node(s) didn't match Pod's node affinity/selector"
        if not all(any(_term_ok(t, node) for t in terms) for terms in volume_terms):
            return "node(s) had volume node affinity conflict"
        if state.used_pods + 1 > state.pods:
            return "Too many pods"
        if state.used_cpu + cpu > state.cpu:
            return "Insufficient cpu"
        if state.used_memory + mem > state.memory:
            return "Insufficient memory"
        return ""

    # ------------------------------------------------------------------------------------------ gangs

    def _schedule_gang(self, key: tuple[str, str], pending: Sequence[Obj], pods: Sequence[Obj], *,
                       nodes: dict[str, _NodeState], allocator: Allocator,
                       by_claim: Mapping[tuple[str, str], Obj]) -> int:
        namespace, group_name = key
        group = self.store.find(self.store.type("scheduling.k8s.io", "v1beta1", "podgroups"), namespace, group_name)
        members = [p for p in pending if p["metadata"]["namespace"] == namespace and
                   ((p.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName") == group_name]
        if group is None:
            for pod in members:
                self._mark_unschedulable(pod, f'podgroup "{group_name}" not found')
            return 0
        policy = (group.get("spec") or {}).get("schedulingPolicy") or {}
        min_count = int((policy.get("gang") or {}).get("minCount") or 1)
        already = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName") and p["metadata"]["namespace"] ==
                      namespace and ((p.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
                      == group_name)
        if already + len(members) < min_count:
            for pod in members:
                self._mark_unschedulable(pod, f'waiting for the gang of podgroup "{group_name}": '
                                              f'{already + len(members)} of minCount {min_count} pods exist')
            return 0
        saved_nodes = {name: copy.copy(state) for name, state in nodes.items()}
        saved_ledger = copy.deepcopy(allocator.ledger.__dict__ | {"inventory": None})
        decisions: list[_Decision] = []
        failures: list[tuple[Obj, str]] = []
        for pod in members:
            decision, message = self._place(pod, nodes, allocator, by_claim)
            if decision is None and not message:
                continue
            if decision is None:
                failures.append((pod, message))
            else:
                decisions.append(decision)
        if already + len(decisions) < min_count:
            nodes.update(saved_nodes)
            for name, value in saved_ledger.items():
                if name != "inventory":
                    setattr(allocator.ledger, name, value)
            why = failures[0][1] if failures else ""
            for pod in members:
                self._mark_unschedulable(pod, f'gang of podgroup "{group_name}" does not fit: '
                                              f'{already + len(decisions)} of minCount {min_count} pods can be '
                                              f'placed. {why}')
            return 0
        for decision in decisions:
            self._write(decision)
        for pod, message in failures:
            self._mark_unschedulable(pod, message)
        self._set_group_scheduled(group)
        return len(decisions)

    def _set_group_scheduled(self, group: Obj) -> None:
        conditions = (group.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "PodGroupInitiallyScheduled" and c.get("status") == "True" for c in conditions):
            return
        new = copy.deepcopy(group)
        new.setdefault("status", {})["conditions"] = [c for c in conditions if
                                                      c.get("type") != "PodGroupInitiallyScheduled"] + [{
            "type": "PodGroupInitiallyScheduled", "status": "True", "reason": "Scheduled",
            "message": "minCount pods of the gang were scheduled together",
            "lastTransitionTime": rfc3339(self.store.clock()), "observedGeneration": group["metadata"]["generation"]}]
        rt = self.store.type("scheduling.k8s.io", "v1beta1", "podgroups")
        self.store.update(rt, group["metadata"]["namespace"], group["metadata"]["name"], new, subresource="status",
                          check_rv=False)

    # ------------------------------------------------------------------------------------------ preemption

    def _preempt(self, pod: Obj, pods: Sequence[Obj], nodes: dict[str, _NodeState],
                 by_claim: Mapping[tuple[str, str], Obj], message: str) -> tuple[_Decision | None, str]:
        """DefaultPreemption, simplified: the node where evicting the fewest lower-priority pods lets `pod` fit.

        The victims are deleted (gracefully, so their node agent drains them); `pod` is nominated to the
        node and bound on a later cycle once the victims are gone, as kube-scheduler does.
        """
        spec = pod.get("spec") or {}
        priority = int(spec.get("priority") or 0)
        if spec.get("preemptionPolicy") == "Never":
            return None, message + " preemption: not eligible due to preemptionPolicy=Never."
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if nominated and any((p.get("spec") or {}).get("nodeName") == nominated and
                             p["metadata"].get("deletionTimestamp") for p in pods):
            return None, f"{message} preemption: waiting for the victims on node {nominated} to terminate."
        best: tuple[int, int, str, list[Obj]] | None = None
        for state in nodes.values():
            victims_all = sorted([p for p in pods if (p.get("spec") or {}).get("nodeName") == state.name and
                                  int((p.get("spec") or {}).get("priority") or 0) < priority and
                                  not p["metadata"].get("deletionTimestamp")],
                                 key=lambda p: int((p.get("spec") or {}).get("priority") or 0))
            if not victims_all:
                continue
            for k in range(1, len(victims_all) + 1):
                victims = victims_all[:k]
                if self._fits_without(pod, state, victims, pods):
                    score = (k, max(int((v.get("spec") or {}).get("priority") or 0) for v in victims))
                    if best is None or (score[0], score[1], state.name) < (best[0], best[1], best[2]):
                        best = (score[0], score[1], state.name, victims)
                    break
        if best is None:
            return None, message + " preemption: no lower-priority pods whose eviction would make room."
        _, _, node_name, victims = best
        pods_rt = self.store.type("", "v1", "pods")
        for victim in victims:
            self._event(victim, "Preempted", f"Preempted by pod {pod['metadata']['uid']} on node {node_name}")
            with contextlib.suppress(ApiError):
                self.store.delete(pods_rt, victim["metadata"]["namespace"], victim["metadata"]["name"])
        current = self.store.find(pods_rt, pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is not None:
            new = copy.deepcopy(current)
            new.setdefault("status", {})["nominatedNodeName"] = node_name
            self.store.update(pods_rt, pod["metadata"]["namespace"], pod["metadata"]["name"], new,
                              subresource="status", check_rv=False)
        return None, (f"{message} preemption: evicting {len(victims)} lower-priority pod(s) on node {node_name}: "
                      f"{', '.join(v['metadata']['name'] for v in victims)}.")

    def _fits_without(self, pod: Obj, state: _NodeState, victims: Sequence[Obj], pods: Sequence[Obj]) -> bool:
        cpu, mem = pod_requests(pod)
        freed_cpu = sum((pod_requests(v)[0] for v in victims), Fraction(0))
        freed_mem = sum((pod_requests(v)[1] for v in victims), Fraction(0))
        trial = _NodeState(state.obj, state.cpu, state.memory, state.pods, state.used_cpu - freed_cpu,
                           state.used_memory - freed_mem, state.used_pods - len(victims))
        if self._node_filter(pod, trial, cpu, mem, self._volume_node_terms(pod)[0]):
            return False
        if not (pod.get("spec") or {}).get("resourceClaims"):
            return True
        victim_uids = {v["metadata"]["uid"] for v in victims}
        claims_rt = self.store.type("resource.k8s.io", "v1", "resourceclaims")
        kept = [c for c in self.store.list_objects(claims_rt) if (c.get("status") or {}).get("allocation") and
                not all(r.get("uid") in victim_uids for r in (c.get("status") or {}).get("reservedFor") or [])]
        inventory = Inventory.build(
            nodes=[state.obj], slices=self.store.list_objects(self.store.type("resource.k8s.io", "v1",
                                                                               "resourceslices")),
            device_classes=self.store.list_objects(self.store.type("resource.k8s.io", "v1", "deviceclasses")),
            claims=kept)
        claims, _ = self._pod_claims(pod, {})
        if claims is None:
            return False
        allocations, _ = Allocator(inventory).allocate(
            [c for c in claims if not (c.get("status") or {}).get("allocation")], state.name)
        return allocations is not None

    # ------------------------------------------------------------------------------------------ writes

    def _write(self, decision: _Decision) -> None:
        pod = decision.pod
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        claims_rt = self.store.type("resource.k8s.io", "v1", "resourceclaims")
        for claim, allocation in decision.claims:
            current = self.store.get(claims_rt, namespace, claim["metadata"]["name"])
            if allocation is not None and DELETE_PROTECTION not in (current["metadata"].get("finalizers") or []):
                # kube-scheduler protects an allocated claim: deleted while reserved, it stays (its device
                # allocated) until the resourceclaim controller deallocates it
                protected = copy.deepcopy(current)
                protected["metadata"]["finalizers"] = [*(current["metadata"].get("finalizers") or []),
                                                       DELETE_PROTECTION]
                current, _ = self.store.update(claims_rt, namespace, claim["metadata"]["name"], protected,
                                               check_rv=False)
            new = copy.deepcopy(current)
            status = new.setdefault("status", {})
            if allocation is not None:
                status["allocation"] = {**allocation, "allocationTimestamp": rfc3339(self.store.clock())}
            reserved = status.setdefault("reservedFor", [])
            if not any(r.get("uid") == pod["metadata"]["uid"] for r in reserved):
                reserved.append({"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]})
            self.store.update(claims_rt, namespace, claim["metadata"]["name"], new, subresource="status",
                              check_rv=False)
        self.store.bind(namespace, name, decision.node)
        self._last_message.pop(pod["metadata"]["uid"], None)
        self._event(pod, "Scheduled", f"Successfully assigned {namespace}/{name} to {decision.node}", "Normal")

    def _mark_unschedulable(self, pod: Obj, message: str) -> None:
        uid = pod["metadata"]["uid"]
        if self._last_message.get(uid) == message:
            return
        self._last_message[uid] = message
        pods_rt = self.store.type("", "v1", "pods")
        current = self.store.find(pods_rt, pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is None:
            return
        new = copy.deepcopy(current)
        status = new.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                           "lastProbeTime": None, "lastTransitionTime": rfc3339(self.store.clock())})
        status["conditions"] = conditions
        self.store.update(pods_rt, pod["metadata"]["namespace"], pod["metadata"]["name"], new,
                          subresource="status", check_rv=False)
        self._event(pod, "FailedScheduling", message)

    def _event(self, obj: Obj, reason: str, message: str, event_type: str = "Warning") -> None:
        meta = obj["metadata"]
        now = rfc3339(self.store.clock())
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace", "default")},
                "involvedObject": {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Pod"),
                                   "name": meta["name"], "namespace": meta.get("namespace"), "uid": meta["uid"]},
                "reason": reason, "message": message[:1024], "type": event_type,
                "source": {"component": self.scheduler_name}, "reportingComponent": self.scheduler_name,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        try:
            self.store.create(self.store.type("", "v1", "events"), meta.get("namespace", "default"), body)
        except ApiError:
            log.debug("event for %s not recorded", meta["name"])
