"""`infer-ctl explain NAMESPACE/NAME`: for every replica that is not running, the layer where it stopped.

The layers, in the order a replica passes them:
1. spec: the InferenceService is invalid (its `Valid` condition);
2. decision: the desired count (and the bound that clipped it) — replicas the decision does not want;
3. placement: no device matches (which filter and attribute: product, memory, compute capability, partition),
   no node has enough matching GPUs, the matching devices are in use (no free capacity), capacity held for a
   gang, or fragmentation (enough free GPUs in total, but no node with enough together);
4. scheduler: the Pod's `PodScheduled=False` message (taints, node resources, claims); or the API server
   refused to create the replica (a ResourceQuota, an admission webhook, a missing PriorityClass), from the
   controller's `FailedCreate` Events;
5. cold start: the replica is loading, for how long, against the measured p90;
6. the sleeping tier: a replica held asleep on a warm host (its shared claim), or asleep because it lent its GPU to
   another service's wake (yieldToSleepers), and a wake the warm host refused
   (the controller's `WakeRefused` Events: its device was taken; a replica was created instead).
Placement is evaluated anew against the current cluster with the controller's own engine and policies, so the
answer holds for the next replica the controller would try to place.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import numpy as np

from infer_ctl.actuate.manifests import (
    ANNOTATION_WARM_HOST,
    ANNOTATION_YIELDED_TO,
    ANNOTATION_YIELDS,
    held_asleep,
    selector,
)
from infer_ctl.controller.clock import SystemClock
from infer_ctl.controller.snapshot import gang_reservation, list_gang_demands
from infer_ctl.controller.warm import pod_gone
from infer_ctl.core import api
from infer_ctl.core.policy import Policies
from infer_ctl.core.quantity import human_bytes
from infer_ctl.engine.placement import replica_request
from infer_ctl.kube.client import (
    DEVICE_CLASSES,
    EVENTS,
    INFERENCE_SERVICES,
    KUEUE_WORKLOADS,
    NODES,
    POD_GROUPS,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    KubeClient,
)
from infer_ctl.kube.inferenceservice import check_inference_service
from infer_ctl.kube.labels import LABEL_SERVICE
from infer_ctl.kube.pods import replica_pods
from infer_ctl.place.framework import CycleInputs
from infer_ctl.place.inventory import Inventory
from infer_ctl.place.plugins import placement_engine
from infer_ctl.place.request import Sharing
from infer_ctl.place.state import MILLI, ClusterState


@dataclass(frozen=True, slots=True)
class Finding:
    subject: str  # a replica name, or a layer name for the service as a whole
    layer: str  # spec | decision | placement | scheduler | quota | admission | cold-start | running | sleeping |
    # yielded | wake
    message: str


def explain(kube: KubeClient, policies: Policies, namespace: str, name: str,
            now: datetime | None = None) -> list[Finding]:
    now = now or SystemClock().now()
    body = kube.get(INFERENCE_SERVICES, name, namespace)
    if body is None:
        return [Finding(f"{namespace}/{name}", "spec", "no such InferenceService")]
    status = body.get("status") or {}
    check = check_inference_service(body, policies.catalog)
    if not check.ok or check.service is None:
        return [Finding("spec", "spec", "invalid: " + "; ".join(str(e) for e in check.errors))]
    svc = check.service
    findings: list[Finding] = []
    desired = status.get("desired") or {}
    want = int(desired.get("serving", 0)) + int(desired.get("standby", 0))
    decision = status.get("lastDecision") or {}
    bounds = f"bounds {svc.spec.scaling.min_replicas}..{svc.spec.scaling.max_replicas}"
    why = f"{decision.get('reason', '?')}: {decision.get('message', '')}" if decision else "no decision yet"
    findings.append(Finding("decision", "decision", f"wants {desired.get('serving', 0)} serving + "
                                                    f"{desired.get('standby', 0)} standby ({bounds}); {why}"))
    uid = body["metadata"].get("uid")
    pods = [p for p in kube.list(PODS, namespace, label_selector=selector(svc.meta))
            if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or ())]
    cold = {(c.get("accelerator"), c.get("cached")): c for c in status.get("coldStarts") or ()}
    asleep = {str(p["metadata"]["name"]): p["metadata"].get("annotations") or {} for p in pods if held_asleep(p)}
    taken = _awake_on_warm_hosts(kube, namespace) if asleep else {}
    for replica in replica_pods(pods):
        state = replica.state
        if replica.name in asleep and state in (api.ReplicaState.SERVING, api.ReplicaState.STANDBY):
            notes = asleep[replica.name]
            host = notes.get(ANNOTATION_WARM_HOST, "")
            if notes.get(ANNOTATION_YIELDED_TO):
                findings.append(Finding(replica.name, "yielded", f"asleep on warm host {host} ({replica.node}): its "
                                        f"GPU is lent to {notes[ANNOTATION_YIELDED_TO]} (spec.scaling.prewarm."
                                        "yieldToSleepers); woken there once it is given back (the other "
                                        "service keeps it while the load already here needs it)"))
            elif host in taken and taken[host].lent:
                findings.append(Finding(replica.name, "sleeping", f"asleep on warm host {host} ({replica.node}), "
                                        f"whose GPU {', '.join(taken[host].awake)} serves on and lends "
                                        "(yieldToSleepers): a burst puts it to sleep and wakes this one there"))
            elif host in taken:
                findings.append(Finding(replica.name, "sleeping", f"asleep on warm host {host} ({replica.node}), "
                                        f"whose GPU {', '.join(taken[host].awake)} holds awake now: it wakes there "
                                        "once that sleeps again; a burst meanwhile wakes the service's sleepers "
                                        "elsewhere or starts replicas"))
            elif svc.spec.accelerator.sharing is api.Sharing.EXCLUSIVE:
                findings.append(Finding(replica.name, "sleeping", f"asleep on warm host {host} ({replica.node}), "
                                        "shared with other services' sleepers: woken only for load already here (a "
                                        "burst), whichever service's burst comes first; a forecast starts "
                                        "replicas instead"))
            else:
                findings.append(Finding(replica.name, "sleeping", f"asleep on warm host {host} ({replica.node}): "
                                                                  "woken when the traffic needs it"))
        elif state in (api.ReplicaState.SERVING, api.ReplicaState.STANDBY):
            findings.append(Finding(replica.name, "running", f"{state.value} on {replica.node} "
                                                             f"({replica.accelerator or 'GPU'})"))
        elif state is api.ReplicaState.PENDING:
            findings.append(Finding(replica.name, "scheduler", replica.scheduled_message or "not scheduled yet"))
        elif state is api.ReplicaState.LOADING:
            since = (now - replica.created).total_seconds() if replica.created else 0.0
            p90 = (cold.get((replica.accelerator, replica.cached)) or {}).get("p90Seconds")
            expected = f" (measured p90 {p90} s)" if p90 else (
                f" (hint {svc.spec.runtime.cold_start_s:g} s)" if svc.spec.runtime.cold_start_s else "")
            findings.append(Finding(replica.name, "cold-start", f"loading for {since:.0f} s on {replica.node}"
                                                                f"{expected}"))
        else:
            findings.append(Finding(replica.name, "running", f"{state.value}: being removed (drains, then stops)"))
    missing = want - sum(r.state is not api.ReplicaState.DRAINING for r in replica_pods(pods))
    if missing > 0:
        findings.append(Finding(f"{missing} more", "placement", _placement_finding(kube, policies, svc)))
    findings.extend(_refusal_findings(kube, namespace, name))
    findings.extend(_wake_findings(kube, namespace, name))
    return findings


class _HostUse(NamedTuple):
    awake: tuple[str, ...]  # the replicas not held asleep on a warm host, each "<pod> (of <service>)"
    lent: bool  # all of them lend it (their service yields to sleepers)


def _awake_on_warm_hosts(kube: KubeClient, namespace: str) -> dict[str, _HostUse]:
    """Per warm host of the namespace, the replicas not held asleep on it (as the controller's warm-host ledger
    counts them: awake, or loading)."""
    out: dict[str, _HostUse] = {}
    for pod in kube.list(PODS, namespace):
        meta = pod.get("metadata") or {}
        host = str((meta.get("annotations") or {}).get(ANNOTATION_WARM_HOST) or "")
        if not host or held_asleep(pod) or pod_gone(pod):
            continue
        service = (meta.get("labels") or {}).get(LABEL_SERVICE, "?")
        lends = (meta.get("annotations") or {}).get(ANNOTATION_YIELDS) == "true"
        use = out.get(host, _HostUse((), True))
        out[host] = _HostUse((*use.awake, f"{meta.get('name')} (of {service})"), use.lent and lends)
    return out


def _placement_finding(kube: KubeClient, policies: Policies, svc: api.InferenceService) -> str:
    inventory = Inventory.build(nodes=kube.list(NODES), slices=kube.list(RESOURCE_SLICES),
                                device_classes=kube.list(DEVICE_CLASSES), claims=kube.list(RESOURCE_CLAIMS),
                                pods=kube.list(PODS))
    engine = placement_engine(policies.placement)
    request = replica_request(svc, policies.catalog, "next")
    state = ClusterState.from_inventory(inventory)
    rng = np.random.default_rng(0)
    # Pending gangs hold GPUs out of placement, as in the controller's cycles.
    gangs = list_gang_demands(kube, pod_groups=kube.has_api(POD_GROUPS.api_version),
                              workloads=kube.has_api(KUEUE_WORKLOADS.api_version))
    held = gang_reservation(state, gangs)
    decision = engine.schedule(request, state, CycleInputs(gang_reserved_gpus=dict(held.reserved)), rng)
    if decision.placement is not None:
        return (f"not created yet: the next replica fits on {decision.placement.node}; "
                "the controller creates it on its next cycle")
    reasons = "; ".join(str(r) for r in decision.status.reasons) or decision.status.message
    if any(r.plugin == "GangReservation" for r in decision.status.reasons):
        return f"capacity held for a pending gang: {reasons}"
    eligible = state.eligible(request)
    if request.sharing is Sharing.EXCLUSIVE:
        matching = eligible.slots.sum(axis=1)
        free = (eligible.slots & (state.free_milli == MILLI)).sum(axis=1)
        if matching.size and int(matching.max()) >= request.count:
            total, best = int(free.sum()), int(free.max())
            if total >= request.count > best:
                return (f"fragmentation: {total} matching GPUs are free across the cluster, but no node has "
                        f"{request.count} of them together (the most on one node: {best}); filters: {reasons}")
            if best < request.count:
                return (f"no free capacity: {int(matching.max())} matching GPUs on the largest node, "
                        f"{total} free in all, {request.count} wanted on one node; filters: {reasons}")
            # the devices are there and free: the nodes that hold them refuse the Pod (its CPU or memory, a
            # taint, a cordon)
            return f"matching GPUs are free, but no node that has them can take the replica: {reasons}"
        elif matching.size and int(matching.max()) > 0:
            return (f"no node has {request.count} matching GPUs (the most on one node: {int(matching.max())}); "
                    f"filters: {reasons}")
    elif request.sharing is Sharing.MIG and any(eligible.partitions) and not any(
            ok and part.memory_bytes >= request.device_memory_bytes
            for ok, part in zip(eligible.partitions, state.partitions, strict=True)):
        largest = max((part for ok, part in zip(eligible.partitions, state.partitions, strict=True) if ok),
                      key=lambda part: part.memory_bytes)
        return (f"no MIG partition is large enough: the model needs {human_bytes(request.device_memory_bytes)}, "
                f"the largest matching partition is {largest.profile} ({human_bytes(largest.memory_bytes)})")
    elif eligible.slots.any() or any(eligible.partitions):
        kind = "MIG partitions" if request.sharing is Sharing.MIG else "shares of GPUs"
        return f"no free capacity: matching {kind} exist, none is free enough; filters: {reasons}"
    return f"no device matches: {reasons}; the cluster has {cluster_accelerators(inventory, policies)}"


def cluster_accelerators(inventory: Inventory, policies: Policies) -> str:
    """What the cluster's ResourceSlices offer, by the catalog's product names (what `spec.accelerator.products`
    takes), e.g. "A100-40GB: 16 MIG devices on 1 node (1g.5gb x8, 2g.10gb x4, 3g.20gb x4); H100-80GB: 16 GPUs on 2
    nodes; L4: 4 GPUs on 1 node"."""
    gpus: dict[str, list[str]] = defaultdict(list)  # product -> node of each whole GPU
    migs: dict[str, list[tuple[str, str]]] = defaultdict(list)  # product -> (node, profile) of each MIG device
    for device in inventory.devices:
        raw = device.attribute("productName", device.id.driver)
        if raw is None:
            continue
        known = policies.catalog.by_product_name(str(raw))
        product = known.name if known is not None else str(raw)
        if device.kind == "mig":
            migs[product].append((device.node_name, str(device.attribute("profile", device.id.driver) or "?")))
        else:
            gpus[product].append(device.node_name)
    if not gpus and not migs:
        return "no GPUs (no ResourceSlice publishes a device with a productName)"

    def nodes(names: list[str]) -> str:
        count = len(set(names))
        return f"{count} node{'s' if count != 1 else ''}"

    parts = []
    for product in sorted(gpus.keys() | migs.keys()):
        held = []
        if gpus[product]:
            held.append(f"{len(gpus[product])} GPU{'s' if len(gpus[product]) != 1 else ''} on {nodes(gpus[product])}")
        if migs[product]:
            profiles = Counter(profile for _node, profile in migs[product])
            held.append(f"{len(migs[product])} MIG devices on {nodes([n for n, _ in migs[product]])} ("
                        + ", ".join(f"{p} x{c}" for p, c in sorted(profiles.items())) + ")")
        parts.append(f"{product}: {'; '.join(held)}")
    return "; ".join(parts)


def _refusal_findings(kube: KubeClient, namespace: str, name: str) -> list[Finding]:
    """The API server's refusals to create the service's replicas (the controller records each as a
    `FailedCreate` Event on the service): the newest, as a quota or an admission finding."""
    refusals = []
    for event in kube.list(EVENTS, namespace):
        regarding = event.get("regarding") or event.get("involvedObject") or {}
        note = str(event.get("note") or event.get("message") or "")
        if regarding.get("kind") == api.KIND and regarding.get("name") == name and event.get("reason") == \
                "FailedCreate":
            refusals.append((str(event.get("eventTime") or event.get("lastTimestamp") or ""), note))
    if not refusals:
        return []
    _, note = max(refusals)
    return [Finding("create", "quota" if "exceeded quota" in note else "admission", note)]


def _wake_findings(kube: KubeClient, namespace: str, name: str) -> list[Finding]:
    """Wakes the warm hosts refused (the controller's `WakeRefused` Events on the service): the newest per
    sleeper."""
    newest: dict[str, tuple[str, str]] = {}
    for event in kube.list(EVENTS, namespace):
        regarding = event.get("regarding") or event.get("involvedObject") or {}
        if regarding.get("kind") != api.KIND or regarding.get("name") != name or event.get("reason") != "WakeRefused":
            continue
        note = str(event.get("note") or event.get("message") or "")
        sleeper = note.removeprefix("the wake of sleeper ").split(" ", 1)[0]
        when = str(event.get("eventTime") or event.get("lastTimestamp") or "")
        if sleeper not in newest or when > newest[sleeper][0]:
            newest[sleeper] = (when, note)
    return [Finding(sleeper, "wake", note) for sleeper, (_, note) in sorted(newest.items())]


def render(namespace: str, name: str, findings: list[Finding]) -> str:
    width = max((len(f.subject) for f in findings), default=10)
    lines = [f"{namespace}/{name}"]
    for f in findings:
        lines.append(f"  {f.subject:<{width}}  [{f.layer}] {f.message}")
    return "\n".join(lines)
