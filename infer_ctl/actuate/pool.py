"""The InferencePool of an InferenceService (Gateway API Inference Extension, `inference.networking.k8s.io/v1`):
how llm-d, KServe's LLMInferenceService and the gateways that implement the extension (Envoy Gateway, kgateway,
Istio, GKE) route to model servers.

The controller writes one per InferenceService where the CRD is served (the reconciler's `_ensure_routing`),
over the same replicas as its routing Service (`infer_ctl.actuate.manifests.routing_service`):
- named after the InferenceService, in its namespace, owned by it (controller reference: deleting the service
  deletes the pool through the garbage collector);
- `selector.matchLabels` = the serving replicas' labels (`serving_selector`): standby, sleeping, loading and
  prefetch Pods carry another role, so a replica leaves the pool before it is put to sleep or removed, and joins
  it only once woken and confirmed awake, exactly as with the Service;
- `targetPorts` = the engine's port (the runtime profile's, or the spec's `runtime.port`);
- `endpointPickerRef`: the v1 schema requires the pool to name its Endpoint Picker (EPP), the ext-proc server
  the gateway asks which endpoint takes each request (a Service and its port; `port` is required for a Service).
  Infer-ctl does not run the picker: the user installs one per pool, as GIE's own guides do. Its default is GIE's
  naming (`<pool name>-epp` on port 9002, the EPP's default gRPC port, as in GIE's InferencePool documentation and
  Helm chart); a service's annotation `infer-ctl.io/endpoint-picker: "<service>:<port>"` names another (e.g. one
  picker shared by several pools, or llm-d's). `failureMode` is GIE's default, FailClose: a gateway whose picker is
  down refuses the request rather than bypass the picker's load-aware choice.

Every defaulted field of the v1 schema is written out (`appProtocol`, the reference's `group`, `kind`,
`failureMode`), so that the object the API server stores is the object built here and a comparison of the two
(`pool_differs`) needs no knowledge of the CRD's defaults.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infer_ctl.actuate.manifests import owner_reference, selector_labels, serving_selector
from infer_ctl.core import api
from infer_ctl.kube.client import Resource

POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = f"{POOL_GROUP}/v1"
INFERENCE_POOLS = Resource(POOL_VERSION, "inferencepools", "InferencePool")
POOL_CRD = f"inferencepools.{POOL_GROUP}"

ANNOTATION_ENDPOINT_PICKER = "infer-ctl.io/endpoint-picker"
EPP_SUFFIX = "-epp"
EPP_PORT = 9002  # the EPP's default gRPC (ext-proc) port (GIE: pkg/lwepp/server/options.go DefaultGrpcPort)
FAILURE_MODE = "FailClose"
APP_PROTOCOL = "http"
# a Service name (RFC 1035 label), as the API server checks it
_SERVICE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class EndpointPicker:
    """The Service of the Endpoint Picker a pool names, and its port (the Service's port, not a target port)."""

    service: str
    port: int


def endpoint_picker(pool_name: str, annotations: Mapping[str, str] | None = None) -> EndpointPicker:
    """The picker a pool references: the annotation's `<service>:<port>` when set, else `<pool name>-epp:9002`.
    Raises ValueError naming the annotation and what is wrong with its value.

    E.g. a service `llm` without the annotation -> EndpointPicker("llm-epp", 9002); with
    `infer-ctl.io/endpoint-picker: shared-epp:9002` -> EndpointPicker("shared-epp", 9002)."""
    value = (annotations or {}).get(ANNOTATION_ENDPOINT_PICKER)
    if value is None:
        return EndpointPicker(pool_name + EPP_SUFFIX, EPP_PORT)
    name, sep, port_text = str(value).strip().rpartition(":")
    if not sep:
        raise ValueError(f"annotation {ANNOTATION_ENDPOINT_PICKER}: {value!r} is not '<service>:<port>' "
                         "(the endpoint picker's Service and its port, e.g. llm-epp:9002)")
    if not _SERVICE_NAME.match(name):
        raise ValueError(f"annotation {ANNOTATION_ENDPOINT_PICKER}: {name!r} is not a Service name (lower-case "
                         "letters, digits and '-', starting with a letter, at most 63 characters)")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"annotation {ANNOTATION_ENDPOINT_PICKER}: port {port_text!r} is not a number from 1 to "
                         "65535")
    return EndpointPicker(name, int(port_text))


def inference_pool(svc: api.InferenceService, port: int, picker: EndpointPicker) -> dict[str, Any]:
    """The InferencePool over the service's serving replicas on the engine's `port` (see the module docstring)."""
    if not 1 <= port <= 65535:
        raise ValueError(f"{svc.meta.key}: target port {port} is not a number from 1 to 65535")
    return {"apiVersion": POOL_VERSION, "kind": "InferencePool",
            "metadata": {"name": svc.meta.name, "namespace": svc.meta.namespace, "labels": selector_labels(svc.meta),
                         "ownerReferences": [owner_reference(svc.meta)]},
            "spec": {"selector": {"matchLabels": serving_selector(svc.meta)},
                     "targetPorts": [{"number": port}],
                     "appProtocol": APP_PROTOCOL,
                     "endpointPickerRef": {"group": "", "kind": "Service", "name": picker.service,
                                           "port": {"number": picker.port}, "failureMode": FAILURE_MODE}}}


def pool_differs(existing: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Whether the stored pool's spec is not the one wanted (what a patch would change)."""
    return bool((existing.get("spec") or {}) != want["spec"])


def pool_patch(want: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch that makes a pool's spec `want`'s (every field of it is set; lists are replaced whole)."""
    return {"spec": dict(want["spec"])}


# ------------------------------------------------------------------------------------------------ reading a pool


@dataclass(frozen=True, slots=True)
class PoolRoute:
    """What a front door reads of an InferencePool: the labels its member Pods carry and the ports it routes to."""

    match_labels: tuple[tuple[str, str], ...]
    target_ports: tuple[int, ...]

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels)


def pool_route(pool: Mapping[str, Any]) -> PoolRoute | None:
    """The route of a stored InferencePool; None when it selects nothing usable (no labels or no port: the v1
    schema requires both, so only a malformed object)."""
    spec = pool.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    ports = tuple(int(p["number"]) for p in spec.get("targetPorts") or () if isinstance(p.get("number"), int))
    if not labels or not ports:
        return None
    return PoolRoute(tuple(sorted((str(k), str(v)) for k, v in labels.items())), ports)
