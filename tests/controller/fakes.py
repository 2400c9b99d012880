"""Fakes for unit tests of the controller's shell units (no API server, no network, a clock moved by hand): a
Kubernetes client that records every call and answers from a dict, a watch-fed view that shows what was
written, and a sleep/wake engine that answers at once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from infer_ctl.kube.client import KubeError, Resource


async def direct(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The units' `call`, without a thread: the fake client answers at once."""
    return fn(*args, **kwargs)


@dataclass
class FakeKube:
    """Records every call as (verb, kind, name, detail) in order; objects live in `objects` by (kind, namespace,
    name). `refuse[(verb, kind, name)]` raises that KubeError once."""

    calls: list[tuple[str, str, str, Any]] = field(default_factory=list)
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    refuse: dict[tuple[str, str, str], KubeError] = field(default_factory=dict)
    events: int = 0

    def _maybe_refuse(self, verb: str, kind: str, name: str) -> None:
        exc = self.refuse.pop((verb, kind, name), None)
        if exc is not None:
            raise exc

    def create(self, resource: Resource, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        name = str(obj["metadata"]["name"])
        self.calls.append(("create", resource.kind, name, None))
        self._maybe_refuse("create", resource.kind, name)
        key = (resource.kind, namespace or "", name)
        if key in self.objects:
            raise KubeError(409, "AlreadyExists", f"{resource.kind} {name} exists")
        created = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
        self.objects[key] = created
        return created

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self.calls.append(("get", resource.kind, name, None))
        return self.objects.get((resource.kind, namespace or "", name))

    def merge_patch(self, resource: Resource, name: str, patch: Mapping[str, Any], namespace: str | None = None,
                    *, subresource: str | None = None) -> dict[str, Any]:
        self.calls.append(("patch", resource.kind, name, dict(patch)))
        self._maybe_refuse("patch", resource.kind, name)
        current = self.objects.get((resource.kind, namespace or "", name)) or {"metadata": {"name": name}}
        return {**current, **{k: v for k, v in patch.items() if k != "metadata"}}

    def delete(self, resource: Resource, name: str, namespace: str | None = None, *,
               grace_period_s: int | None = None) -> bool:
        self.calls.append(("delete", resource.kind, name, grace_period_s))
        return self.objects.pop((resource.kind, namespace or "", name), None) is not None

    def event(self, regarding: Mapping[str, Any], *, reason: str, note: str, type: str = "Normal",
              action: str, now: datetime, controller: str = "infer-ctl") -> str:
        self._maybe_refuse("event", "Event", reason)
        self.events += 1
        name = f"{regarding['metadata']['name']}.{self.events}"
        self.calls.append(("event", "Event", name, (reason, note, now)))
        return name

    def event_series(self, name: str, namespace: str, *, count: int, now: datetime) -> None:
        self.calls.append(("series", "Event", name, (count, now)))
        self._maybe_refuse("series", "Event", name)

    def verbs(self, *verbs: str) -> list[tuple[str, str, str]]:
        """The calls of these verbs (all when none is named), without their details."""
        return [(v, k, n) for v, k, n, _ in self.calls if not verbs or v in verbs]


@dataclass
class FakeView:
    """The watch-fed view as the units use it: what was written shows; pins are remembered."""

    wrote_objects: list[tuple[str, str]] = field(default_factory=list)
    pinned: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)

    def wrote(self, resource: Resource, obj: Mapping[str, Any]) -> None:
        self.wrote_objects.append((resource.kind, str(obj["metadata"]["name"])))

    async def cached(self, *resources: Resource) -> list[list[dict[str, Any]]]:
        return [list(self.pods) if r.kind == "Pod" else [] for r in resources]

    def pin(self, namespace: str, claim: str, results: list[dict[str, Any]]) -> None:
        self.pinned[(namespace, claim)] = results

    def unpin(self, namespace: str, claim: str) -> None:
        self.pinned.pop((namespace, claim), None)

    def created(self, namespace: str, claim: str) -> None:
        self.pinned.pop((namespace, claim), None)


@dataclass
class FakeEngine:
    """A model server's sleep/wake endpoint that answers at once; `refuse_wake` names the addresses that refuse."""

    refuse_wake: dict[str, str] = field(default_factory=dict)
    asked: list[tuple[str, str]] = field(default_factory=list)

    async def sleep(self, address: str, runtime: Any) -> str:
        self.asked.append(("sleep", address))
        return ""

    async def wake(self, address: str, runtime: Any, timeout_s: float) -> str:
        self.asked.append(("wake", address))
        return self.refuse_wake.get(address, "")
