"""Cluster file (YAML) -> Nodes, ResourceSlices and DeviceClasses as NVIDIA's DRA driver publishes them: what the
sandbox's API servers serve, and what the fleet simulator places on with the controller's placement
(`infer_ctl.sim.placing`), one description of a GPU node for both.

A cluster file lists node pools:

    apiVersion: sandbox.infer-ctl.io/v1alpha1
    kind: SandboxCluster
    metadata: {name: small}
    spec:
      nodePools:
        - name: h100              # nodes h100-0, h100-1
          count: 2
          accelerator: H100-80GB  # a catalog name from policies/accelerators.yaml
          gpus: 8
          cpu: "96"
          memory: 1Ti
          labels: {topology.kubernetes.io/zone: zone-a}
          taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
          modelCache: [meta-llama/Llama-3.1-8B-Instruct]   # cache keys (an InferenceService's
                                                         # spec.model.cacheKey: default its uri, else its name)
          modelCacheBytes: 500Gi  # the disk the node's model cache may fill (default 500Gi, the Node's
                                  # ephemeral-storage); the Node's annotation infer-ctl.io/model-cache-budget-bytes
                                  # overrides it. A download that would exceed it evicts the least recently used
                                  # models no running replica uses (see nodeagent.py)
          gpuMode: whole          # whole | mig | partitionable | shared
          migLayout: [3g.20gb, 2g.10gb, 1g.5gb, 1g.5gb]   # gpuMode mig: the MIG devices on every GPU

The four GPU modes are the four ways NVIDIA's driver (gpu.nvidia.com) publishes a GPU:
- `whole`: one device per GPU (`type: gpu`), capacity `memory`.
- `mig`: a static MIG layout; only the MIG devices (`type: mig`, `profile`, `parentUUID`) are allocatable.
- `partitionable`: dynamic MIG (KEP-4815): a counter set per GPU (`memory`, `memory-slice-0..7` (counter names
  must be DNS labels: kube-apiserver refuses `memorySlice0`),
  `multiprocessors`) in a counters-only slice, and a device for the whole GPU plus every MIG placement, each
  consuming the counters it occupies, so allocating one blocks the overlapping others.
- `shared`: consumable capacity (KEP-5075): each GPU `allowMultipleAllocations`, with a `memory` request policy,
  so several claims share one GPU, each consuming part of its memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infer_ctl.core.errors import FieldError, SpecError
from infer_ctl.core.policy import AcceleratorCatalog, AcceleratorType, MigProfile
from infer_ctl.core.quantity import QuantityError, parse_bytes, parse_quantity

DRIVER = "gpu.nvidia.com"
DRIVER_VERSION = "580.65.6"  # semver: NVIDIA publishes 580.65.06 without the leading zero
CUDA_DRIVER_VERSION = "13.0.0"
GPU_MODES = ("whole", "mig", "partitionable", "shared")
# A node's model-cache disk budget when its pool states none: the ephemeral-storage every sandbox Node reports.
DEFAULT_MODEL_CACHE_BYTES = 500 * 2**30
# At most 64 devices per slice when devices consume counters (ResourceSliceSpec.devices).
MAX_DEVICES_WITH_COUNTERS = 64
MAX_DEVICES = 128
# SMs per GPU by architecture, for the `multiprocessors` counter (H100 SXM 132, A100 108, L4 58).
_MULTIPROCESSORS = {"Hopper": 132, "Blackwell": 148, "Ampere": 108, "Ada Lovelace": 58}


@dataclass(frozen=True, slots=True)
class NodePool:
    name: str
    count: int
    accelerator: str | None
    gpus: int
    cpu: str
    memory: str
    pods: int
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]
    model_cache: tuple[str, ...]
    gpu_mode: str
    mig_layout: tuple[str, ...]
    model_cache_bytes: int = DEFAULT_MODEL_CACHE_BYTES


@dataclass(frozen=True, slots=True)
class SandboxNode:
    """What the node agent needs to know about a node beyond its API object."""

    name: str
    pool: str
    accelerator: str | None
    model_cache: frozenset[str]
    model_cache_bytes: int = 0  # the disk budget of its model cache (the pool's modelCacheBytes)


@dataclass(frozen=True, slots=True)
class Cluster:
    name: str
    pools: tuple[NodePool, ...]
    catalog: AcceleratorCatalog

    @property
    def nodes(self) -> tuple[SandboxNode, ...]:
        return tuple(SandboxNode(f"{p.name}-{i}", p.name, p.accelerator, frozenset(p.model_cache),
                                 p.model_cache_bytes)
                     for p in self.pools for i in range(p.count))

    def objects(self) -> list[dict[str, Any]]:
        """DeviceClasses first, then per node: the Node and its ResourceSlices (the order an API loader needs)."""
        out: list[dict[str, Any]] = [*device_classes()]
        for pool in self.pools:
            accel = self.catalog.get(pool.accelerator) if pool.accelerator else None
            for index in range(pool.count):
                node_name = f"{pool.name}-{index}"
                out.append(node_object(node_name, pool, accel))
                if accel is not None and pool.gpus > 0:
                    out.extend(resource_slices(node_name, pool, accel))
        return out


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses NVIDIA's Helm chart installs: whole GPUs and MIG devices of gpu.nvidia.com."""
    def device_class(name: str, device_type: str) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                                               f"device.attributes['{DRIVER}'].type == "
                                                               f"'{device_type}'"}}]}}

    return [device_class("gpu.nvidia.com", "gpu"), device_class("mig.nvidia.com", "mig")]


def _uuid(*parts: object) -> str:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def node_object(name: str, pool: NodePool, accel: AcceleratorType | None) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "sandbox.infer-ctl.io/pool": pool.name, **pool.labels}
    if accel is not None and pool.gpus:
        labels["nvidia.com/gpu.present"] = "true"
        labels["nvidia.com/gpu.product"] = accel.product_names[0].replace(" ", "-")
        labels["nvidia.com/gpu.count"] = str(pool.gpus)
    allocatable = {"cpu": pool.cpu, "memory": pool.memory, "pods": str(pool.pods), "ephemeral-storage": "500Gi"}
    spec: dict[str, Any] = {"providerID": f"sandbox://{name}"}
    if pool.taints:
        spec["taints"] = [dict(t) for t in pool.taints]
    return {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": spec,
        "status": {
            "capacity": dict(allocatable), "allocatable": allocatable,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "sandbox node agent is posting ready status"}],
            "nodeInfo": {"kubeletVersion": "v1.37.0-sandbox", "containerRuntimeVersion": "sandbox://process",
                         "architecture": "amd64", "operatingSystem": "linux", "osImage": "infer-ctl sandbox",
                         "kernelVersion": "", "kubeProxyVersion": "", "machineID": _uuid(name)[:32],
                         "systemUUID": _uuid(name, "system"), "bootID": _uuid(name, "boot")},
        },
    }


def _gpu_attributes(accel: AcceleratorType, index: int, uuid: str, node: str) -> dict[str, Any]:
    major, minor = accel.compute_capability
    return {
        "type": {"string": "gpu"},
        "uuid": {"string": f"GPU-{uuid}"},
        "productName": {"string": accel.product_names[0]},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": accel.architecture},
        "cudaComputeCapability": {"version": f"{major}.{minor}.0"},
        "driverVersion": {"version": DRIVER_VERSION},
        "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
        "index": {"int": index},
        "minor": {"int": index},
        "pcieBusID": {"string": f"0000:{0x18 + 0x10 * index:02x}:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{(index // 4) * 0x40:02x}"},
    }


def _mig_device(accel: AcceleratorType, node: str, gpu: int, profile: MigProfile, start: int, *,
                counter_set: str | None) -> dict[str, Any]:
    parent = _uuid(node, gpu)
    attrs = _gpu_attributes(accel, gpu, parent, node)
    attrs.update({"type": {"string": "mig"}, "uuid": {"string": f"MIG-{_uuid(node, gpu, profile.name, start)}"},
                  "parentUUID": {"string": f"GPU-{parent}"}, "profile": {"string": profile.name},
                  "parentIndex": {"int": gpu}, "parentMinor": {"int": gpu}, "placementStart": {"int": start},
                  "placementSize": {"int": profile.memory_slices}})
    for unused in ("minor", "pcieBusID"):
        attrs.pop(unused, None)
    sms = _MULTIPROCESSORS.get(accel.architecture, 100) * profile.compute_slices // 7
    device: dict[str, Any] = {
        "name": f"gpu-{gpu}-mig-{profile.name.replace('.', '')}-{start}",
        "attributes": attrs,
        "capacity": {"memory": {"value": _bytes(profile.memory_bytes)}, "multiprocessors": {"value": str(sms)}},
    }
    if counter_set is not None:
        counters = {f"memory-slice-{s}": {"value": "1"} for s in range(start, start + profile.memory_slices)}
        counters["memory"] = {"value": _bytes(profile.memory_bytes)}
        counters["multiprocessors"] = {"value": str(sms)}
        device["consumesCounters"] = [{"counterSet": counter_set, "counters": counters}]
    return device


def _bytes(value: int) -> str:
    mi = 1024 * 1024
    return f"{value // mi}Mi" if value % mi == 0 else str(value)


def _placements(profile: MigProfile) -> list[int]:
    """Start memory slices NVIDIA allows for a profile: aligned to its size (1g: 0..6, 2 slices: 0,2,4,6, ...)."""
    size = profile.memory_slices
    if size >= 8:
        return [0]
    starts = list(range(0, 8, size))
    if size == 1:
        starts = starts[:7]  # 7 compute slices: no eighth 1g instance
    if size == 4 and profile.compute_slices == 4:
        starts = [0]
    return [s for s in starts if s + size <= 8]


def resource_slices(node: str, pool: NodePool, accel: AcceleratorType) -> list[dict[str, Any]]:
    """The ResourceSlices of one node: pool = node name, one generation, slices numbered in order."""
    devices: list[dict[str, Any]] = []
    counter_sets: list[dict[str, Any]] = []
    for gpu in range(pool.gpus):
        uuid = _uuid(node, gpu)
        whole: dict[str, Any] = {"name": f"gpu-{gpu}", "attributes": _gpu_attributes(accel, gpu, uuid, node),
                                 "capacity": {"memory": {"value": _bytes(accel.memory_bytes)}}}
        if pool.gpu_mode == "whole":
            devices.append(whole)
        elif pool.gpu_mode == "shared":
            whole["allowMultipleAllocations"] = True
            step = 1024 ** 3
            # shares in whole GiB from 1 GiB: the largest one (and the default, what a request without an amount
            # takes: the whole device) is the device's memory rounded down to that grid, so that the default is
            # itself a valid request (an H100's 79.6 GiB: 79 GiB)
            top = accel.memory_bytes // step * step
            whole["capacity"]["memory"]["requestPolicy"] = {
                "default": _bytes(top), "validRange": {"min": "1Gi", "max": _bytes(top), "step": _bytes(step)}}
            devices.append(whole)
        elif pool.gpu_mode == "mig":
            profiles = [next(p for p in accel.mig_profiles if p.name == n) for n in pool.mig_layout]
            starts = layout_starts(profiles) or []
            for profile, start in sorted(zip(profiles, starts, strict=True), key=lambda ps: ps[1]):
                devices.append(_mig_device(accel, node, gpu, profile, start, counter_set=None))
        else:
            counter_set = f"gpu-{gpu}-counter-set"
            sms = _MULTIPROCESSORS.get(accel.architecture, 100)
            counters = {f"memory-slice-{s}": {"value": "1"} for s in range(8)}
            counters["memory"] = {"value": _bytes(accel.memory_bytes)}
            counters["multiprocessors"] = {"value": str(sms)}
            counter_sets.append({"name": counter_set, "counters": counters})
            whole["consumesCounters"] = [{"counterSet": counter_set, "counters": dict(counters)}]
            devices.append(whole)
            for profile in accel.mig_profiles:
                for start in _placements(profile):
                    devices.append(_mig_device(accel, node, gpu, profile, start, counter_set=counter_set))
    limit = MAX_DEVICES_WITH_COUNTERS if counter_sets else MAX_DEVICES
    chunks: list[list[dict[str, Any]]] = [devices[i:i + limit] for i in range(0, len(devices), limit)] or [[]]
    counter_chunks = [counter_sets[i:i + 8] for i in range(0, len(counter_sets), 8)]
    total = len(chunks) + len(counter_chunks)
    slices: list[dict[str, Any]] = []
    for number, counters_chunk in enumerate(counter_chunks):
        slices.append(_slice(node, number, total, {"sharedCounters": counters_chunk}))
    for number, chunk in enumerate(chunks, start=len(counter_chunks)):
        slices.append(_slice(node, number, total, {"devices": chunk}))
    return slices


def _slice(node: str, number: int, total: int, content: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-{number}"},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": total}, **content},
    }


# ------------------------------------------------------------------------------------------------ parsing


def load_cluster(path: Path, catalog: AcceleratorCatalog) -> Cluster:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SpecError([FieldError("", f"cannot read the cluster file: {e}")], subject=str(path)) from None
    return parse_cluster(doc, catalog, source=str(path))


def parse_cluster(doc: Any, catalog: AcceleratorCatalog, *, source: str = "cluster") -> Cluster:
    """Every problem of the cluster file at once, with field paths (`spec.nodePools[1].accelerator`)."""
    errors: list[FieldError] = []
    if not isinstance(doc, Mapping):
        raise SpecError([FieldError("", "the cluster file must be a YAML mapping")], subject=source)
    if doc.get("kind") != "SandboxCluster":
        errors.append(FieldError("kind", f"must be SandboxCluster, got {doc.get('kind')!r}"))
    name = str((doc.get("metadata") or {}).get("name") or "sandbox")
    raw_pools = (doc.get("spec") or {}).get("nodePools")
    if not isinstance(raw_pools, list) or not raw_pools:
        errors.append(FieldError("spec.nodePools", "Required value: at least one node pool", "FieldValueRequired"))
        raise SpecError(errors, subject=source)
    pools: list[NodePool] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_pools):
        path = f"spec.nodePools[{i}]"
        if not isinstance(raw, Mapping):
            errors.append(FieldError(path, "must be a mapping"))
            continue
        pool = _parse_pool(raw, path, catalog, errors)
        if pool is not None:
            if pool.name in seen:
                errors.append(FieldError(f"{path}.name", f"Duplicate value: {pool.name!r}", "FieldValueDuplicate"))
            seen.add(pool.name)
            pools.append(pool)
    if errors:
        raise SpecError(errors, subject=source)
    return Cluster(name, tuple(pools), catalog)


def _parse_pool(raw: Mapping[str, Any], path: str, catalog: AcceleratorCatalog,
                errors: list[FieldError]) -> NodePool | None:
    before = len(errors)
    name = raw.get("name")
    if not isinstance(name, str) or not name or not name.replace("-", "").isalnum() or name != name.lower():
        errors.append(FieldError(f"{path}.name", f"Invalid value: {name!r}: a lowercase DNS label is required"))
    count = raw.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        errors.append(FieldError(f"{path}.count", f"Invalid value: {count!r}: must be a positive integer"))
    accelerator = raw.get("accelerator")
    accel = None
    if accelerator is not None:
        accel = catalog.get(str(accelerator))
        if accel is None:
            errors.append(FieldError(f"{path}.accelerator", f"Unsupported value: {accelerator!r}: supported "
                                     f"values: {', '.join(catalog.names)}", "FieldValueNotSupported"))
    gpus = raw.get("gpus", 8 if accelerator else 0)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0 or gpus > 16:
        errors.append(FieldError(f"{path}.gpus", f"Invalid value: {gpus!r}: must be an integer from 0 to 16"))
    for field_name, default in (("cpu", "64"), ("memory", "512Gi")):
        try:
            parse_quantity(str(raw.get(field_name, default)))
        except QuantityError as e:
            errors.append(FieldError(f"{path}.{field_name}", f"Invalid value: {e}"))
    cache_bytes = _model_cache_bytes(raw, path, errors)
    mode = raw.get("gpuMode", "whole")
    if mode not in GPU_MODES:
        errors.append(FieldError(f"{path}.gpuMode", f"Unsupported value: {mode!r}: supported values: "
                                 f"{', '.join(GPU_MODES)}", "FieldValueNotSupported"))
    layout = tuple(str(p) for p in raw.get("migLayout") or ())
    if accel is not None and mode in ("mig", "partitionable") and not accel.mig_profiles:
        errors.append(FieldError(f"{path}.gpuMode", f"Invalid value: {mode!r}: {accel.name} does not support MIG"))
    if mode == "mig":
        if not layout:
            errors.append(FieldError(f"{path}.migLayout", "Required value: gpuMode mig needs a layout",
                                     "FieldValueRequired"))
        elif accel is not None:
            _check_layout(layout, accel, f"{path}.migLayout", errors)
    taints = raw.get("taints") or []
    if not isinstance(taints, list) or any(not isinstance(t, Mapping) or "key" not in t or t.get("effect") not in
                                           ("NoSchedule", "PreferNoSchedule", "NoExecute") for t in taints):
        errors.append(FieldError(f"{path}.taints", "Invalid value: each taint needs a key and an effect of "
                                 "NoSchedule, PreferNoSchedule or NoExecute"))
        taints = []
    if len(errors) > before:
        return None
    return NodePool(
        name=str(name), count=int(count), accelerator=accel.name if accel else None, gpus=int(gpus) if accel else 0,
        cpu=str(raw.get("cpu", "64")), memory=str(raw.get("memory", "512Gi")), pods=int(raw.get("pods", 110)),
        labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
        taints=tuple({str(k): str(v) for k, v in t.items()} for t in taints),
        model_cache=tuple(str(m) for m in raw.get("modelCache") or ()), gpu_mode=str(mode), mig_layout=layout,
        model_cache_bytes=cache_bytes)


def _model_cache_bytes(raw: Mapping[str, Any], path: str, errors: list[FieldError]) -> int:
    """The pool's `modelCacheBytes` (default DEFAULT_MODEL_CACHE_BYTES)."""
    if raw.get("modelCacheBytes") is None:
        return DEFAULT_MODEL_CACHE_BYTES
    try:
        return parse_bytes(str(raw["modelCacheBytes"]))
    except QuantityError as e:
        errors.append(FieldError(f"{path}.modelCacheBytes", f"Invalid value: {e}"))
        return DEFAULT_MODEL_CACHE_BYTES


def layout_starts(profiles: Sequence[MigProfile]) -> list[int] | None:
    """Placements (start memory slice) for a static MIG layout, or None when it does not fit one GPU.

    E.g. A100 [3g.20gb, 2g.10gb, 1g.5gb, 1g.5gb]: 3g at slice 4, 2g at 0, the 1g's at 2 and 3.
    """
    if sum(p.compute_slices for p in profiles) > 7:
        return None
    order = sorted(range(len(profiles)), key=lambda i: -profiles[i].memory_slices)
    starts: dict[int, int] = {}

    def place(k: int, used: frozenset[int]) -> bool:
        if k == len(order):
            return True
        index = order[k]
        profile = profiles[index]
        for start in _placements(profile):
            span = frozenset(range(start, start + profile.memory_slices))
            if not span & used:
                starts[index] = start
                if place(k + 1, used | span):
                    return True
        return False

    return [starts[i] for i in range(len(profiles))] if place(0, frozenset()) else None


def _check_layout(layout: Sequence[str], accel: AcceleratorType, path: str, errors: list[FieldError]) -> None:
    profiles: list[MigProfile] = []
    for i, name in enumerate(layout):
        profile = next((p for p in accel.mig_profiles if p.name == name), None)
        if profile is None:
            errors.append(FieldError(f"{path}[{i}]", f"Unsupported value: {name!r}: {accel.name} profiles are "
                                     f"{', '.join(p.name for p in accel.mig_profiles)}", "FieldValueNotSupported"))
            return
        profiles.append(profile)
    if layout_starts(profiles) is None:
        errors.append(FieldError(path, f"Invalid value: {', '.join(layout)} do not fit together on one "
                                 f"{accel.name} (7 compute and 8 memory slices)"))
