"""Builders for DRA objects shaped as resource.k8s.io/v1 (Kubernetes 1.37) serves them."""

from __future__ import annotations

from typing import Any

import pytest


class Builders:
    """Fluent-ish builders: every test states only what matters to it."""

    @staticmethod
    def node(name: str, cpu: str = "64", memory: str = "256Gi", *, taints: list[dict[str, str]] | None = None,
             unschedulable: bool = False, pods: str = "110") -> dict[str, Any]:
        spec: dict[str, Any] = {}
        if taints:
            spec["taints"] = taints
        if unschedulable:
            spec["unschedulable"] = True
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "spec": spec, "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods}}}

    @staticmethod
    def gpu(name: str, *, product: str = "NVIDIA A100-SXM4-80GB", memory: str = "80Gi", uuid: str | None = None,
            arch: str = "Ampere", cc: str = "8.0.0", shareable: bool = False,
            taints: list[dict[str, str]] | None = None, counters: dict[str, Any] | None = None) -> dict[str, Any]:
        dev: dict[str, Any] = {
            "name": name,
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": product},
                "architecture": {"string": arch},
                "cudaComputeCapability": {"version": cc},
                "uuid": {"string": uuid or f"GPU-{name}"},
            },
            "capacity": {"memory": {"value": memory}},
        }
        if shareable:
            dev["allowMultipleAllocations"] = True
            dev["capacity"]["memory"]["requestPolicy"] = {"default": memory,
                                                          "validRange": {"min": "1Gi", "step": "1Gi"}}
        if taints:
            dev["taints"] = taints
        if counters:
            dev["consumesCounters"] = [counters]
        return dev

    @staticmethod
    def mig(name: str, profile: str, memory: str, parent_uuid: str, *, counters: dict[str, Any] | None = None,
            product: str = "NVIDIA A100-SXM4-80GB") -> dict[str, Any]:
        dev: dict[str, Any] = {
            "name": name,
            "attributes": {
                "type": {"string": "mig"},
                "profile": {"string": profile},
                "parentUUID": {"string": parent_uuid},
                "productName": {"string": product},
                "uuid": {"string": f"MIG-{name}"},
            },
            "capacity": {"memory": {"value": memory}},
        }
        if counters:
            dev["consumesCounters"] = [counters]
        return dev

    @staticmethod
    def slice(node: str, devices: list[dict[str, Any]], *, pool: str | None = None, generation: int = 1,
              count: int = 1, shared_counters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"driver": "gpu.nvidia.com", "nodeName": node,
                                "pool": {"name": pool or node, "generation": generation,
                                         "resourceSliceCount": count},
                                "devices": devices}
        if shared_counters:
            spec["sharedCounters"] = shared_counters
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-gpu-{generation}"}, "spec": spec}

    @staticmethod
    def device_class(name: str = "gpu.nvidia.com", *expressions: str) -> dict[str, Any]:
        exprs = expressions or ("device.driver == 'gpu.nvidia.com'",)
        return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": e}} for e in exprs]}}

    @staticmethod
    def claim(name: str, *, count: int = 1, selectors: tuple[str, ...] = (),
              capacity: dict[str, str] | None = None, allocated: list[dict[str, Any]] | None = None,
              device_class: str = "gpu.nvidia.com") -> dict[str, Any]:
        exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
        if selectors:
            exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
        if capacity:
            exactly["capacity"] = {"requests": capacity}
        obj: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                               "metadata": {"name": name, "namespace": "default"},
                               "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
        if allocated:
            obj["status"] = {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.nvidia.com", **r} for r in allocated]}}}
        return obj


@pytest.fixture
def b() -> type[Builders]:
    return Builders
