"""Assume and forget devices (kube-scheduler's Reserve and Unreserve): a plan's placements and the warm hosts it
makes are pinned on the shared snapshot before its lock is released, so that the next service's plan does not take
them; a claim never written is forgotten again. One owner of the pins and of the warm hosts this controller made
that the watch-fed cache may not show yet."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from infer_ctl.actuate.manifests import warm_host_labels
from infer_ctl.controller.clock import Clock
from infer_ctl.controller.settings import Settings
from infer_ctl.controller.snapshot import ClusterView, Snapshot
from infer_ctl.controller.warm import warm_host_claim
from infer_ctl.core import api
from infer_ctl.engine.cycle import CyclePlan, Observation
from infer_ctl.engine.placement import ReplicaPlacement
from infer_ctl.kube.labels import ANNOTATION_PINNED_DEVICES
from infer_ctl.place.inventory import Device

# a warm host made here is trusted for this long before the cache shows it (after that it was deleted)
MADE_HOST_TRUSTED_S = 60.0


def pin_results(placement: ReplicaPlacement) -> list[dict[str, Any]]:
    """The devices a placement chose, as a claim's allocation results would name them."""
    assert placement.decision.placement is not None
    consumed = {k.rpartition("/")[2]: str(math.ceil(v))
                for k, v in placement.decision.placement.consumed_capacity.items()}
    return [{"request": "gpu", "driver": d.driver, "pool": d.pool, "device": d.name,
             **({"consumedCapacity": consumed} if consumed else {})}
            for d in placement.decision.placement.devices]


class Assumptions:
    def __init__(self, view: ClusterView, settings: Settings, clock: Clock) -> None:
        self.view, self.settings, self.clock = view, settings, clock
        # warm hosts this controller made that the cache may not show yet (with their pinned device as their
        # allocation), and when: so that the next service's cycle puts its sleepers there too, not on a new one
        self._made_hosts: dict[tuple[str, str], tuple[dict[str, Any], float]] = {}

    def made(self, namespace: str, claim: str) -> bool:
        """Whether this controller made the warm host `claim` and the cache may not show it yet."""
        return (namespace, claim) in self._made_hosts

    def unpin(self, namespace: str, claim: str) -> None:
        """A pinned claim that was not written (yet): its devices are free on the snapshot again."""
        self.view.unpin(namespace, claim)

    def forget(self, namespace: str, claim: str) -> None:
        """A pinned claim that will not be written: its devices free again, and no warm host of that name made."""
        self.view.unpin(namespace, claim)
        self._made_hosts.pop((namespace, claim), None)

    def pin(self, namespace: str, placements: Sequence[ReplicaPlacement]) -> None:
        """Hold the placed devices on the shared snapshot until the scheduler allocates the claims (and write
        them on each claim, for a controller that starts before that)."""
        for placement in placements:
            if placement.claim is None or placement.decision.placement is None:
                continue
            results = pin_results(placement)
            claim = placement.claim.claim
            claim["metadata"].setdefault("annotations", {})[ANNOTATION_PINNED_DEVICES] = json.dumps(
                results, separators=(",", ":"))
            self.view.pin(namespace, claim["metadata"]["name"], results)

    def pin_warm_hosts(self, svc: api.InferenceService, snapshot: Snapshot, plan: CyclePlan,
                       observation: Observation, devices: Mapping[str, Device]) -> dict[str, dict[str, Any]]:
        """The claims of the warm hosts the plan's new sleepers go to that do not exist yet, their devices pinned
        (the plan took them on the snapshot, as a placement is)."""
        existing = {d.claim for d in observation.warm_hosts.devices if d.exists} \
            if observation.warm_hosts is not None else set()
        out: dict[str, dict[str, Any]] = {}
        for replica in plan.create:
            host = replica.warm_host
            if not replica.sleeping or not host or host in existing or host in out or host not in devices:
                continue
            claim, results = warm_host_claim(svc, self.settings.policies.catalog, snapshot, devices[host], host)
            out[host] = claim
            self.view.pin(svc.meta.namespace, host, results)
            self._made_hosts[(svc.meta.namespace, host)] = (
                {**claim, "status": {"allocation": {"devices": {"results": results}}}}, self.clock.monotonic())
            # (its device was taken on the snapshot by the plan: `engine.cycle._take_new_warm_hosts`)
        return out

    def lent_hosts(self, namespace: str, plan: CyclePlan) -> None:
        """The placed claims of a yielding service's new replicas become warm hosts (`warm_host_name` of the
        placed device, labelled, not owned: other services' sleepers reference them too), before they are
        pinned."""
        for replica in plan.create:
            if replica.sleeping or not replica.warm_host or replica.placement is None \
                    or replica.placement.claim is None:
                continue
            claim = replica.placement.claim.claim
            claim["metadata"]["name"] = replica.warm_host
            claim["metadata"]["labels"] = {**(claim["metadata"].get("labels") or {}), **warm_host_labels()}
            self._made_hosts[(namespace, replica.warm_host)] = (
                {**claim, "status": {"allocation": {"devices": {"results": pin_results(replica.placement)}}}},
                self.clock.monotonic())

    def unseen_hosts(self, claims: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The warm hosts made here that the cache does not show yet (forgotten once it does, or after a
        minute: then they were deleted)."""
        shown = {(str(c["metadata"].get("namespace", "")), str(c["metadata"]["name"])) for c in claims}
        now = self.clock.monotonic()
        self._made_hosts = {k: v for k, v in self._made_hosts.items()
                            if k not in shown and now - v[1] < MADE_HOST_TRUSTED_S}
        return [claim for claim, _ in self._made_hosts.values()]
