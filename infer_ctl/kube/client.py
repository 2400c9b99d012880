"""A small, untyped Kubernetes client for the controller's reads and writes, on the official client's transport.

Objects are plain dicts, exactly as the API server serves them (the placement inventory and the status code
read dicts), so the generated model classes and their client-side validation stay out of the way. Connection,
kubeconfig and in-cluster auth come from the `kubernetes` package. Calls block; async code runs them with
`asyncio.to_thread`. Watches are in `infer_ctl.kube.informer`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException


@dataclass(frozen=True, slots=True)
class Resource:
    api_version: str
    plural: str
    kind: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
        if subresource is not None:
            base += f"/{subresource}"
        return base


PODS = Resource("v1", "pods", "Pod")
SERVICES = Resource("v1", "services", "Service")
NODES = Resource("v1", "nodes", "Node", namespaced=False)
PERSISTENT_VOLUMES = Resource("v1", "persistentvolumes", "PersistentVolume", namespaced=False)
PERSISTENT_VOLUME_CLAIMS = Resource("v1", "persistentvolumeclaims", "PersistentVolumeClaim")
EVENTS = Resource("events.k8s.io/v1", "events", "Event")
RESOURCE_CLAIMS = Resource("resource.k8s.io/v1", "resourceclaims", "ResourceClaim")
RESOURCE_CLAIM_TEMPLATES = Resource("resource.k8s.io/v1", "resourceclaimtemplates", "ResourceClaimTemplate")
RESOURCE_SLICES = Resource("resource.k8s.io/v1", "resourceslices", "ResourceSlice", namespaced=False)
DEVICE_CLASSES = Resource("resource.k8s.io/v1", "deviceclasses", "DeviceClass", namespaced=False)
POD_GROUPS = Resource("scheduling.k8s.io/v1beta1", "podgroups", "PodGroup")
KUEUE_WORKLOADS = Resource("kueue.x-k8s.io/v1beta2", "workloads", "Workload")
PRIORITY_CLASSES = Resource("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", namespaced=False)
INFERENCE_SERVICES = Resource("infer-ctl.io/v1alpha1", "inferenceservices", "InferenceService")
# kopf's cluster-wide peering object: status = {peer identity: {priority, lastseen, lifetime}}
KOPF_PEERINGS = Resource("kopf.dev/v1", "clusterkopfpeerings", "ClusterKopfPeering", namespaced=False)


class KubeError(Exception):
    """The API server refused a request; `status` is the HTTP status, `reason` kube's reason (Conflict, ...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}: {message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class KubeClient:
    def __init__(self, api_client: kubernetes.client.ApiClient, *, timeout_s: float = 10.0) -> None:
        self._api = api_client
        self.timeout_s = timeout_s

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, context: str | None = None) -> KubeClient:
        """From a kubeconfig file (or $KUBECONFIG / ~/.kube/config), else the in-cluster service account."""
        configuration = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_kube_config(config_file=kubeconfig, context=context,
                                               client_configuration=configuration)
        except kubernetes.config.ConfigException:
            if kubeconfig is not None:
                raise
            kubernetes.config.load_incluster_config(client_configuration=configuration)
        return cls(kubernetes.client.ApiClient(configuration))

    @property
    def configuration(self) -> kubernetes.client.Configuration:
        configuration: kubernetes.client.Configuration = self._api.configuration
        return configuration

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    def close(self) -> None:
        self._api.close()

    def request(self, method: str, path: str, *, query: Mapping[str, str] | None = None, body: Any = None,
                content_type: str = "application/json") -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            method, url, headers, _, _ = self._api.param_serialize(
                method, path, query_params=list((query or {}).items()), header_params=headers,
                auth_settings=["BearerToken"])
            response = self._api.call_api(method, url, header_params=headers,
                                          body=body,
                                          _request_timeout=self.timeout_s)
            response.read()
        except ApiException as exc:
            raise _kube_error(exc) from None
        except urllib3.exceptions.HTTPError as exc:
            raise KubeError(0, "Unreachable", f"cannot reach the API server at {self.host}: {exc}") from None
        if response.status >= 400:
            raise _error_from_body(response.status, response.data)
        return json.loads(response.data) if response.data else None

    def list(self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict[str, Any]]:
        query = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        result = self.request("GET", resource.path(namespace), query=query)
        items: list[dict[str, Any]] = result.get("items") or []
        for item in items:  # list items carry no apiVersion/kind on the wire
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", resource.kind)
        return items

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.request("GET", resource.path(namespace, name))
            return obj
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    def create(self, resource: Resource, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        created: dict[str, Any] = self.request("POST", resource.path(namespace), body=obj)
        return created

    def merge_patch(self, resource: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None,
                    *, subresource: str | None = None) -> dict[str, Any]:
        patched: dict[str, Any] = self.request("PATCH", resource.path(namespace, name, subresource), body=patch,
                                               content_type="application/merge-patch+json")
        return patched

    def delete(self, resource: Resource, name: str, namespace: str | None = None, *,
               grace_period_s: int | None = None) -> bool:
        """Delete; False when it was already gone. Dependents are collected in the background."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        try:
            self.request("DELETE", resource.path(namespace, name), body=body)
            return True
        except KubeError as exc:
            if exc.not_found:
                return False
            raise

    def has_api(self, api_version: str) -> bool:
        """Whether the server serves a group version (PodGroups and Kueue are optional)."""
        path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        try:
            self.request("GET", path)
            return True
        except KubeError as exc:
            if exc.status in (403, 404, 503):
                return False
            raise

    def event(self, regarding: Mapping[str, Any], *, reason: str, note: str, type: str = "Normal",
              action: str, now: datetime, controller: str = "infer-ctl") -> str:
        """An events.k8s.io/v1 Event about `regarding` (reason CamelCase, note at most 1 KiB); returns its name."""
        meta = regarding["metadata"]
        namespace = meta.get("namespace") or "default"
        name = f"{meta['name']}.{time.time_ns():x}{secrets.token_hex(2)}"
        event = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            # Named as client-go's event recorder names them (`<name>.<wall-clock nanoseconds in hex>`), plus a
            # random suffix: one cycle posts several Events about one object at once. (kube-apiserver refuses the
            # generateName "<name>.": it must itself be a DNS subdomain, and may not end in '.'.)
            "metadata": {"name": name, "namespace": namespace},
            "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": f"infer-ctl.io/{controller}",
            "reportingInstance": controller,
            "action": action,
            "reason": reason,
            "note": note[:1024],
            "type": type,
            "regarding": {"apiVersion": regarding.get("apiVersion"), "kind": regarding.get("kind"),
                          "name": meta["name"], "namespace": namespace, "uid": meta.get("uid", "")},
        }
        self.create(EVENTS, event, namespace)
        return name

    def event_series(self, name: str, namespace: str, *, count: int, now: datetime) -> None:
        """Count further occurrences of an Event in its `series` (as client-go's recorder does): one Event for a
        repeating condition, not one per occurrence."""
        self.merge_patch(EVENTS, name, {"series": {"count": count,
                                                   "lastObservedTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}},
                         namespace)


def _kube_error(exc: ApiException) -> KubeError:
    return _error_from_body(int(exc.status or 0), exc.body)


def _error_from_body(status: int, data: Any) -> KubeError:
    reason, message = "", ""
    try:
        body = json.loads(data) if data else {}
        reason, message = str(body.get("reason", "")), str(body.get("message", ""))
    except (ValueError, AttributeError):
        message = str(data)[:500]
    return KubeError(status, reason or "Error", message or f"HTTP {status}")
