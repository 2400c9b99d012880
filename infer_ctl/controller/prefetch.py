"""The cached tier's prefetch: a Pod on each node the plan wants the model's weights on, the finished ones
collected, and a node whose copy failed not asked again until its back-off has passed."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from infer_ctl.actuate.manifests import prefetch_pod
from infer_ctl.controller.events import Call, Recorder
from infer_ctl.controller.memory import ServiceMemory
from infer_ctl.controller.modelcache import ModelCacheMounts, refuses_host_path
from infer_ctl.controller.objects import KubeWrites, finished, termination
from infer_ctl.controller.settings import Settings
from infer_ctl.core import api
from infer_ctl.core.errors import SpecError
from infer_ctl.core.modeluri import hub_source
from infer_ctl.engine.placement import GPU_TOLERATIONS
from infer_ctl.kube.client import PODS, KubeClient, KubeError

log = logging.getLogger(__name__)

# the wait before a prefetch is tried again on a node where it failed, by failures in a row (as kubelet backs off
# a crashing container: doubling, capped)
PREFETCH_BACKOFF_S = (30.0, 60.0, 120.0, 300.0, 600.0)


def prefetch_backoff_s(failures: int) -> float:
    return PREFETCH_BACKOFF_S[min(failures, len(PREFETCH_BACKOFF_S)) - 1]


class Prefetcher:
    def __init__(self, kube: KubeClient, call: Call, settings: Settings, events: Recorder,  # noqa: PLR0917
                 cache: ModelCacheMounts, writes: KubeWrites) -> None:
        self.kube, self._k, self.settings, self.events = kube, call, settings, events
        self.cache, self.writes = cache, writes

    async def prefetch(self, body: Mapping[str, Any], svc: api.InferenceService, nodes: Sequence[str],
                       prefetches: Sequence[Mapping[str, Any]], now: datetime,
                       *, memory: ServiceMemory | None = None) -> None:
        """The cached tier: a prefetch Pod on each node the plan wants the weights on; finished ones are deleted
        (the node-side reporter's record is what says the node holds the model), a Pod refused with a Warning
        Event naming spec.model.uri when the prefetch cannot download from it (`hub_source`), a failed one with a
        Warning Event, and its node is not tried again until its backoff (`PREFETCH_BACKOFF_S`) has passed: the
        plan looks at other nodes meanwhile."""
        ns = svc.meta.namespace
        failed = memory.prefetch_failed if memory is not None else {}
        now_s = now.timestamp()
        for pod in prefetches:
            if not finished(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            phase = (pod.get("status") or {}).get("phase")
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            if phase == "Failed":
                failures = failed.get(node, (0, 0.0))[0] + 1
                delay = prefetch_backoff_s(failures)
                failed[node] = (failures, now_s + delay)
                await self.events.record(body, "PrefetchFailed", f"copying the model to node {node} failed: "
                                         f"{termination(pod)}; not tried on that node again for {delay:.0f} s "
                                         f"(failure {failures} in a row)", "Warning", "Prefetch", now)
            else:
                failed.pop(node, None)
                log.info("%s: node %s holds the model now", svc.meta.key, node)
            await self._k(self.kube.delete, PODS, pod["metadata"]["name"], ns)
        nodes = [n for n in nodes if failed.get(n, (0, 0.0))[1] <= now_s]
        if nodes:
            try:  # a model the prefetch cannot download (an s3:// uri, ...): said, and no Pod
                hub_source(svc.spec.model.uri, svc.spec.model.name)
            except SpecError as exc:
                await self.events.record(body, "PrefetchRefused", f"the cached tier copies no weights to nodes: {exc}",
                                         "Warning", "Prefetch", now)
                return
            await self.cache.ensure_claim(svc, now)
        cache_dir = self.cache.dir(ns, now_s)
        if nodes and not cache_dir:  # modelCacheHostPath: off, or refused here: no hostPath Pods
            log.debug("%s: no prefetch Pods: %s", svc.meta.key, self.cache.off(ns, now_s))
            return
        for node in nodes:
            pod = prefetch_pod(svc, node=node, tolerations=[{"key": t.key, "operator": t.operator,
                                                              "effect": t.effect} for t in GPU_TOLERATIONS],
                               cache_dir=cache_dir, model_cache=self.settings.policies.scaling.model_cache_volume)
            try:
                created = await self.writes.create(PODS, pod, ns, svc.meta.uid)
            except KubeError as exc:
                if not refuses_host_path(exc):
                    raise
                await self.cache.refused_in(svc, exc.message, now)  # no copies here for a while
                return
            if created:
                await self.events.record(body, "Prefetch", f"copying the model's weights to node {node} (the cached "
                                         "tier has less room than the forecast needs)", "Normal", "Prefetch", now)
