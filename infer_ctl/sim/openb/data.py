"""The openb trace (Alibaba cluster-trace-gpu-v2023) as Kubernetes objects.

Nodes become Node objects plus one ResourceSlice each (resource.k8s.io/v1, driver `gpu.nvidia.com`, one
device per GPU with `type`, `productName`, `uuid`, capacity `memory` where the model's memory is known).
openb's fractional GPU requests (`gpu_milli`, a share of one GPU) are published the way DRA expresses sharing:
each GPU is `allowMultipleAllocations` with a consumable capacity `shares` of 1000 (requestPolicy default 1000,
valid range 1..1000 step 1), and a fractional pod's claim requests `capacity.requests.shares`. Whole-GPU pods
claim `count` devices; `gpu_spec` (e.g. `V100M16|V100M32`) becomes a CEL selector on `productName`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer_ctl.place.frag import TaskClass
from infer_ctl.place.inventory import NVIDIA_DRIVER

SHARES = "shares"

# Device memory of the named models, MiB (from the reference simulator's table; G2/G3 are anonymised).
MODEL_MEMORY_MIB = {
    "P4": 7611,
    "2080": 11019,
    "1080": 11178,
    "M40": 11448,
    "T4": 15109,
    "V100M16": 16160,
    "P100": 16280,
    "A10": 22731,
    "3090": 24268,
    "V100M32": 32510,
    "A100": 81251,
}


class OpenbError(ValueError):
    """A malformed row in an openb CSV; the message names the file, line and column."""


@dataclass(frozen=True, slots=True)
class OpenbNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class OpenbPod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str

    @property
    def gpu_milli_total(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def task_class(self) -> TaskClass:
        products = tuple(sorted(p for p in self.gpu_spec.split("|") if p))
        return TaskClass(self.cpu_milli, self.gpu_milli if self.num_gpu else 0, self.num_gpu, products)


def _int(row: dict[str, str], col: str, where: str) -> int:
    raw = row.get(col)
    if raw is None or raw == "":
        raise OpenbError(f"{where}: column {col!r} is missing")
    try:
        value = int(float(raw))
    except ValueError:
        raise OpenbError(f"{where}: column {col!r}: {raw!r} is not a number") from None
    if value < 0:
        raise OpenbError(f"{where}: column {col!r}: {value} is negative")
    return value


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise OpenbError(f"{path}: header lacks column(s) {', '.join(missing)}")
        yield from enumerate(reader, start=2)


def load_nodes(path: Path) -> list[OpenbNode]:
    nodes = []
    for line, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model")):
        where = f"{path}:{line}"
        node = OpenbNode(
            row["sn"],
            _int(row, "cpu_milli", where),
            _int(row, "memory_mib", where),
            _int(row, "gpu", where),
            row.get("model") or "",
        )
        if node.gpus and not node.model:
            raise OpenbError(f"{where}: a node with GPUs needs a model")
        nodes.append(node)
    return nodes


def load_pods(path: Path) -> list[OpenbPod]:
    pods = []
    for line, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        where = f"{path}:{line}"
        num = _int(row, "num_gpu", where)
        milli = _int(row, "gpu_milli", where)
        if milli > 1000:
            raise OpenbError(f"{where}: column 'gpu_milli': {milli} exceeds one GPU (1000)")
        if num > 1 and milli not in (0, 1000):
            raise OpenbError(f"{where}: a multi-GPU pod must take whole GPUs (gpu_milli 1000), got {milli}")
        if num >= 1 and milli == 0:
            raise OpenbError(f"{where}: num_gpu {num} with gpu_milli 0")
        pods.append(
            OpenbPod(
                row["name"],
                _int(row, "cpu_milli", where),
                _int(row, "memory_mib", where),
                num,
                milli if num else 0,
                (row.get("gpu_spec") or "").strip(),
            )
        )
    return pods


def node_object(node: OpenbNode) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name}},
        "status": {"allocatable": {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi", "pods": "110"}},
    }


def slice_object(node: OpenbNode) -> dict[str, Any]:
    devices = []
    for i in range(node.gpus):
        capacity: dict[str, Any] = {
            SHARES: {
                "value": "1000",
                "requestPolicy": {"default": "1000", "validRange": {"min": "1", "max": "1000", "step": "1"}},
            },
        }
        if node.model in MODEL_MEMORY_MIB:
            capacity["memory"] = {"value": f"{MODEL_MEMORY_MIB[node.model]}Mi"}
        devices.append(
            {
                "name": f"gpu-{i}",
                "attributes": {
                    "type": {"string": "gpu"},
                    "productName": {"string": node.model},
                    "uuid": {"string": f"GPU-{node.name}-{i}"},
                },
                "capacity": capacity,
                "allowMultipleAllocations": True,
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node.name}-{NVIDIA_DRIVER}"},
        "spec": {
            "driver": NVIDIA_DRIVER,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def device_class_object() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": NVIDIA_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NVIDIA_DRIVER}'"}}]},
    }


def claim_object(pod: OpenbPod) -> dict[str, Any]:
    """The ResourceClaim a pod's GPU request becomes (no device request for CPU-only pods)."""
    requests: list[dict[str, Any]] = []
    if pod.num_gpu:
        exactly: dict[str, Any] = {"deviceClassName": NVIDIA_DRIVER, "count": pod.num_gpu}
        products = [p for p in pod.gpu_spec.split("|") if p]
        if products:
            listed = ", ".join(f"'{p}'" for p in products)
            exactly["selectors"] = [
                {"cel": {"expression": f"device.attributes['{NVIDIA_DRIVER}'].productName in [{listed}]"}}
            ]
        if pod.gpu_milli < 1000:
            exactly["capacity"] = {"requests": {SHARES: str(pod.gpu_milli)}}
        requests.append({"name": "gpu", "exactly": exactly})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{pod.name}-gpu", "namespace": "openb"},
        "spec": {"devices": {"requests": requests}},
    }
