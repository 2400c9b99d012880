"""Which policies a command reads: local files, or the ones the cluster's controller runs (its ConfigMap).

deploy/ runs the controller with `INFER_CTL_POLICIES=/etc/infer-ctl/policies` and a volume mounted at that path
from a ConfigMap (kustomize: `infer-ctl-policies-<hash>`, generated; Helm: `<release>-policies` or the value
policiesConfigMap). The ConfigMap is found the way the controller finds its files: the Deployment in the
controller's namespace whose container sets INFER_CTL_POLICIES, and the ConfigMap volume mounted there. Its name is
therefore never guessed, and a renamed or hashed ConfigMap is still the one the controller reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer_ctl.config.policies import POLICIES_ENV, default_policies_dir, load_policies, parse_policies
from infer_ctl.core.policy import Policies
from infer_ctl.kube.client import KubeClient, KubeError, Resource
from infer_ctl.kube.modelcache import CONFIG_MAPS

DEPLOYMENTS = Resource("apps/v1", "deployments", "Deployment")


class PolicySourceError(RuntimeError):
    """The policies named cannot be read (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class PolicySource:
    policies: Policies
    description: str  # "ConfigMap infer-ctl-system/infer-ctl-policies-5fh2 (mounted by ...)", "local files DIR (...)"


@dataclass(frozen=True, slots=True)
class Mount:
    deployment: str
    configmap: str


def controller_mounts(deployment: Mapping[str, Any]) -> list[str]:
    """The ConfigMaps a Deployment mounts where one of its containers reads its policies ($INFER_CTL_POLICIES)."""
    spec = deployment.get("spec", {}).get("template", {}).get("spec", {})
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    out = []
    for container in spec.get("containers") or []:
        path = next((e.get("value") for e in container.get("env") or [] if e.get("name") == POLICIES_ENV), None)
        if not path:
            continue
        for mount in container.get("volumeMounts") or []:
            if mount.get("mountPath", "").rstrip("/") != path.rstrip("/"):
                continue
            name = (volumes.get(mount.get("name")) or {}).get("configMap", {}).get("name")
            if name and name not in out:
                out.append(name)
    return out


def find_controller_configmap(kube: KubeClient, namespace: str) -> Mount | None:
    """The policies ConfigMap the controller's Deployment in `namespace` mounts; None when no Deployment there
    mounts one. Two Deployments mounting different ConfigMaps: PolicySourceError (say which with
    --policies-configmap)."""
    found = [Mount(d["metadata"]["name"], cm) for d in kube.list(DEPLOYMENTS, namespace)
             for cm in controller_mounts(d)]
    if len({m.configmap for m in found}) > 1:
        listed = ", ".join(f"{m.configmap} (Deployment {m.deployment})" for m in found)
        raise PolicySourceError(f"more than one controller in {namespace} mounts policies: {listed}; choose one "
                                f"with --policies-configmap {namespace}/NAME")
    return found[0] if found else None


def policies_from_configmap(kube: KubeClient, namespace: str, name: str) -> Policies:
    """The policies in ConfigMap namespace/name (one key per policy file); SpecError names the ConfigMap and key."""
    configmap = kube.get(CONFIG_MAPS, name, namespace)
    if configmap is None:
        raise PolicySourceError(f"ConfigMap {namespace}/{name} does not exist")
    data: Mapping[str, str] = configmap.get("data") or {}
    return parse_policies(dict(data), lambda key: f"ConfigMap {namespace}/{name}, key {key}")


def resolve(kube: KubeClient, *, local: Path | None, configmap: str | None, controller_namespace: str) -> PolicySource:
    """The policies as the command was told: `--policies DIR` (local files), `--policies-configmap [NS/]NAME`, or
    by default the controller's ConfigMap in `controller_namespace`, falling back to the local default files when
    no controller there mounts one or its Deployments cannot be read (the description says why)."""
    if local is not None:
        return PolicySource(load_policies(local), f"local files {local} (--policies)")
    if configmap is not None:
        namespace, _, name = configmap.rpartition("/")
        namespace = namespace or controller_namespace
        try:
            policies = policies_from_configmap(kube, namespace, name)
        except KubeError as exc:
            raise PolicySourceError(f"cannot read ConfigMap {namespace}/{name}: {exc}") from exc
        return PolicySource(policies, f"ConfigMap {namespace}/{name} (--policies-configmap)")
    try:
        mount = find_controller_configmap(kube, controller_namespace)
    except KubeError as exc:
        if exc.status == 0:  # the cluster is unreachable: the caller says so
            raise
        why = f"cannot list the Deployments in {controller_namespace}: {exc}"
        return PolicySource(load_policies(None), f"local files {default_policies_dir()} ({why})")
    if mount is None:
        return PolicySource(load_policies(None), f"local files {default_policies_dir()} (no controller Deployment in "
                                                 f"{controller_namespace} mounts a policies ConfigMap)")
    try:
        policies = policies_from_configmap(kube, controller_namespace, mount.configmap)
    except KubeError as exc:
        raise PolicySourceError(f"cannot read ConfigMap {controller_namespace}/{mount.configmap}, which Deployment "
                                f"{controller_namespace}/{mount.deployment} mounts: {exc}") from exc
    return PolicySource(policies, f"ConfigMap {controller_namespace}/{mount.configmap} (the policies Deployment "
                                  f"{controller_namespace}/{mount.deployment} runs with)")
