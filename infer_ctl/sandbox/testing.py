"""Helpers for tests and benchmarks that drive the sandbox over HTTP: a threaded server and object builders."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from infer_ctl.sandbox.apiserver import ApiServerSite, SandboxApiServer
from infer_ctl.sandbox.store import Store
from infer_ctl.sandbox.threaded import LoopThread

T = TypeVar("T")


@dataclass
class RunningApiServer:
    url: str
    handler: SandboxApiServer
    thread: LoopThread

    @property
    def store(self) -> Store:
        return self.handler.store

    def in_loop(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the server's loop (the store is owned by that loop)."""
        return self.thread.call_sync(fn)


@contextmanager
def api_server_in_thread(handler: SandboxApiServer | None = None, port: int | None = None
                         ) -> Iterator[RunningApiServer]:
    """Start the API server on 127.0.0.1 in a thread; stop it (and every open watch) on exit."""
    thread = LoopThread("sandbox-api")
    api = handler if handler is not None else SandboxApiServer()
    server = ApiServerSite(api, port=port)
    thread.call(server.start)
    try:
        yield RunningApiServer(server.url, api, thread)
    finally:
        async def stop() -> None:
            await server.stop()  # ends every open watch first

        thread.call(stop)
        thread.stop()


# ------------------------------------------------------------------------------------------------ builders


def pod(name: str, namespace: str = "default", *, labels: Mapping[str, str] | None = None,
        image: str = "vllm/vllm-openai:v0.16.0", args: Sequence[str] = ("model",), cpu: str | None = None,
        memory: str | None = None,
        node_name: str | None = None, claims: Mapping[str, str] | None = None,
        claim_templates: Mapping[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A Pod with one container (by default stock vLLM serving `model` on port 8000, which the sandbox's node agent
    runs as its vLLM stand-in); `claims` maps request names to ResourceClaim names, `claim_templates` to
    ResourceClaimTemplate names."""
    container: dict[str, Any] = {"name": "server", "image": image}
    if args:
        container["args"] = list(args)
    if image.startswith("vllm/vllm-openai"):
        # vLLM listens once its model is loaded: Ready from /health, as the controller's Pods have it
        container["ports"] = [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
        container["readinessProbe"] = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1}
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    if requests:
        container["resources"] = {"requests": requests}
    pod_claims = [{"name": n, "resourceClaimName": c} for n, c in (claims or {}).items()]
    pod_claims += [{"name": n, "resourceClaimTemplateName": t} for n, t in (claim_templates or {}).items()]
    if pod_claims:
        container.setdefault("resources", {})["claims"] = [{"name": c["name"]} for c in pod_claims]
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
                            "spec": {"containers": [container], **copy.deepcopy(spec)}}
    if pod_claims:
        body["spec"]["resourceClaims"] = pod_claims
    if node_name:
        body["spec"]["nodeName"] = node_name
    return body


def config_map(name: str, namespace: str = "default", data: Mapping[str, str] | None = None,
               labels: Mapping[str, str] | None = None,
               owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(data or {})}


def owner_reference(owner: Mapping[str, Any], *, controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": controller, "blockOwnerDeletion": True}


def widget_crd(*, group: str = "example.infer-ctl.dev", scale: bool = True) -> dict[str, Any]:
    """A small namespaced CRD with status and scale subresources, a default and a CEL rule."""
    spec_schema = {
        "type": "object",
        "properties": {
            "replicas": {"type": "integer", "minimum": 0, "default": 1},
            "size": {"type": "string", "enum": ["small", "large"], "default": "small"},
            "maxReplicas": {"type": "integer", "default": 10},
        },
        "x-kubernetes-validations": [{"rule": "self.replicas <= self.maxReplicas",
                                      "message": "replicas must not exceed maxReplicas"}],
    }
    subresources: dict[str, Any] = {"status": {}}
    if scale:
        subresources["scale"] = {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": True, "storage": True, "subresources": subresources,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": spec_schema,
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                }}},
            }],
        },
    }


def widget(name: str, namespace: str = "default", *, group: str = "example.infer-ctl.dev",
           **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name, "namespace": namespace},
            "spec": dict(spec)}
