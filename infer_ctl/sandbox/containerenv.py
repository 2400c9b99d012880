"""A container's environment as kubelet builds it: `envFrom` first, then `env` in order (`value` with `$(VAR)`
references to earlier variables expanded; `valueFrom` secretKeyRef, configMapKeyRef, fieldRef and resourceFieldRef),
read through the API. What kubelet cannot build is a `ContainerConfigError` with kubelet's message ("couldn't find
key K in Secret NS/N", `secret "N" not found`): the container then waits with reason CreateContainerConfigError,
and is tried again later (the Secret may be created meanwhile).

The Pod's volumes: the sandbox mounts nothing (its processes read the host's filesystem), so an emptyDir or a
claim needs no setup here (kube-scheduler waits for a claim to bind). What kubelet does check before it starts a
container is that a Secret or ConfigMap volume's object exists unless the volume is optional: `check_volumes` raises
`VolumeNotReady` with kubelet's FailedMount message (`MountVolume.SetUp failed for volume "v" : configmap "c" not
found`), and the container waits in ContainerCreating until it exists."""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from fractions import Fraction
from typing import Any

from infer_ctl.core.quantity import QuantityError, parse_quantity
from infer_ctl.kube.client import Resource

SECRETS = Resource("v1", "secrets", "Secret")
CONFIG_MAPS = Resource("v1", "configmaps", "ConfigMap")
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
_FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")

Find = Callable[[Resource, str, str], Awaitable[Mapping[str, Any] | None]]


class ContainerConfigError(ValueError):
    pass


class VolumeNotReady(ValueError):
    pass


async def check_volumes(find: Find, pod: Mapping[str, Any]) -> None:
    """Every non-optional Secret and ConfigMap volume's object exists; else VolumeNotReady (see the docstring)."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        for key, resource, name_key in (("secret", SECRETS, "secretName"), ("configMap", CONFIG_MAPS, "name")):
            source = volume.get(key)
            if not source or source.get("optional"):
                continue
            name = str(source.get(name_key) or "")
            if await find(resource, name, namespace) is None:
                raise VolumeNotReady(f'MountVolume.SetUp failed for volume "{volume.get("name")}" : '
                                     f'{resource.kind.lower()} "{name}" not found')


def resource_value(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """A `resourceFieldRef` as kubelet writes it: the container's limit or request divided by the divisor (default
    1), rounded up; e.g. limits.memory 64Gi with divisor 1Mi: "65536". An unset limit is the node's allocatable in
    kubelet, which the sandbox does not have: "0"; an unset request reads 0 too."""
    kind, _, name = str(ref.get("resource") or "").partition(".")
    text = ((container.get("resources") or {}).get(kind) or {}).get(name)
    try:
        value = parse_quantity(str(text)) if text is not None else Fraction(0)
        divisor = parse_quantity(str(ref.get("divisor") or "1"))
    except QuantityError as e:
        raise ContainerConfigError(f"resourceFieldRef {ref.get('resource')}: {e}") from None
    if divisor <= 0:
        raise ContainerConfigError(f"resourceFieldRef {ref.get('resource')}: divisor must be positive")
    return str(math.ceil(value / divisor))


def expand(text: str, env: Mapping[str, str]) -> str:
    """kubelet's `$(VAR)`: a defined variable is replaced, an undefined reference stays, `$$` is a `$`."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(one, text)


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str) -> str:
    """A `fieldRef.fieldPath` of the Pod (status.podIP is the address the agent gives it, written just after)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
              "status.podIP": pod_ip, "status.podIPs": pod_ip, "status.hostIP": "127.0.0.1",
              "status.hostIPs": "127.0.0.1"}
    if path in simple:
        return str(simple[path] or "")
    m = _FIELD.fullmatch(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise ContainerConfigError(f"unsupported fieldPath {path!r}")


async def _data(find: Find, resource: Resource, name: str, namespace: str, *, optional: bool) -> dict[str, str] | None:
    """A Secret's (decoded) or ConfigMap's data; None when it is missing and optional."""
    obj = await find(resource, name, namespace)
    if obj is None:
        if optional:
            return None
        raise ContainerConfigError(f'{resource.kind.lower()} "{name}" not found')
    out: dict[str, str] = {}
    if resource is SECRETS:
        for key, value in (obj.get("data") or {}).items():
            try:
                out[str(key)] = base64.b64decode(str(value), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise ContainerConfigError(f"key {key} of Secret {namespace}/{name} is not base64 text") from None
        out.update({str(k): str(v) for k, v in (obj.get("stringData") or {}).items()})  # an emulator keeps it
    else:
        out.update({str(k): str(v) for k, v in (obj.get("data") or {}).items()})
    return out


async def container_env(find: Find, pod: Mapping[str, Any], container: Mapping[str, Any],
                        pod_ip: str) -> dict[str, str]:
    """The container's environment (see the module docstring); ContainerConfigError naming what is missing."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    env: dict[str, str] = {}
    for source in container.get("envFrom") or ():
        prefix = str(source.get("prefix") or "")
        for key, resource in (("secretRef", SECRETS), ("configMapRef", CONFIG_MAPS)):
            ref = source.get(key)
            if ref:
                data = await _data(find, resource, str(ref.get("name")), namespace,
                                   optional=bool(ref.get("optional")))
                env.update({prefix + k: v for k, v in (data or {}).items()})
    for var in container.get("env") or ():
        name = str(var.get("name"))
        source = var.get("valueFrom")
        if not source:
            env[name] = expand(str(var.get("value") or ""), env)
            continue
        for key, resource in (("secretKeyRef", SECRETS), ("configMapKeyRef", CONFIG_MAPS)):
            ref = source.get(key)
            if not ref:
                continue
            optional = bool(ref.get("optional"))
            data = await _data(find, resource, str(ref.get("name")), namespace, optional=optional)
            if data is None:
                break
            if ref.get("key") in data:
                env[name] = data[str(ref.get("key"))]
            elif not optional:
                raise ContainerConfigError(f"couldn't find key {ref.get('key')} in {resource.kind} "
                                           f"{namespace}/{ref.get('name')}")
            break
        else:
            if "fieldRef" in source:
                env[name] = field_value(pod, str(source["fieldRef"].get("fieldPath")), pod_ip)
            elif "resourceFieldRef" in source:
                env[name] = resource_value(container, source["resourceFieldRef"])
            else:
                raise ContainerConfigError(f"env {name}: unsupported valueFrom {sorted(source)}")
    return env
