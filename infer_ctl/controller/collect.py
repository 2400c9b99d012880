"""Warm-host collection: the warm hosts (shared claims of one GPU) that no Pod references any more are deleted
once seen so twice a control period apart, in every namespace this controller manages."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from infer_ctl.controller.assume import Assumptions
from infer_ctl.controller.events import Call
from infer_ctl.controller.settings import Settings
from infer_ctl.controller.snapshot import ClusterView
from infer_ctl.controller.warm import is_warm_host, referenced_claims
from infer_ctl.kube.client import PODS, RESOURCE_CLAIMS, KubeClient

log = logging.getLogger(__name__)


class WarmHostCollector:
    def __init__(self, kube: KubeClient, call: Call, view: ClusterView, settings: Settings,
                 assumptions: Assumptions) -> None:
        self.kube, self._k, self.view, self.settings, self.assumptions = kube, call, view, settings, assumptions
        # warm hosts (namespace, claim) no Pod referenced when last seen: deleted when seen so a period later
        self._unreferenced: dict[tuple[str, str], float] = {}
        self._warm_namespaces: set[str] = set()  # namespaces a cycle ran in: their idle warm hosts are collected

    async def after_cycle(self, namespace: str, now_s: float) -> None:
        """A service's cycle collects the idle warm hosts of every namespace this controller has run a cycle in
        (each one it manages), not only its own: the last service of a namespace may be gone, and its warm hosts
        with no cycle of their namespace to collect them (`collect`)."""
        self._warm_namespaces.add(namespace)
        await self.collect(now_s, sorted(self._warm_namespaces))

    async def collect(self, now_s: float, namespaces: Sequence[str] | None = None) -> None:
        """Warm hosts of `namespaces` (None: every namespace) no Pod references, seen so twice at least a control
        period apart, are deleted (a Pod is written just after its warm host's claim, and a watch-fed cache may
        show the one before the other; a warm host made this minute is kept until the cache shows it). Whether a
        service is left in the namespace does not matter: the operator also calls this every control period for
        the namespaces it manages, so that a controller with no service left collects them too."""
        claims, pods = await self.view.cached(RESOURCE_CLAIMS, PODS)
        wanted = None if namespaces is None else frozenset(namespaces)

        def swept(ns: str) -> bool:
            return wanted is None or ns in wanted

        referenced = {(str(p["metadata"].get("namespace", "")), c) for p in pods
                      if swept(str(p["metadata"].get("namespace", ""))) for c in referenced_claims(p)}
        hosts = {(str(c["metadata"].get("namespace", "")), str(c["metadata"]["name"])) for c in claims
                 if swept(str(c["metadata"].get("namespace", ""))) and is_warm_host(c)
                 and not c["metadata"].get("deletionTimestamp")}
        idle = {k for k in hosts if k not in referenced and not self.assumptions.made(*k)}
        self._unreferenced = {k: t for k, t in self._unreferenced.items() if k in idle or not swept(k[0])}
        for key in sorted(idle):
            first = self._unreferenced.setdefault(key, now_s)
            if now_s - first >= self.settings.period_s:
                if await self._k(self.kube.delete, RESOURCE_CLAIMS, key[1], key[0]):
                    log.info("removed warm host %s/%s: no sleeper references it", *key)
                self._unreferenced.pop(key, None)
