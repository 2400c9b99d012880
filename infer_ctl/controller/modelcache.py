"""The node model cache where replicas mount it: whether a namespace's Pods mount it now (`off`, `dir`), the
namespaces that refused it (Pod Security refusing the hostPath, its claim's local PersistentVolume not to be had),
and, for modelCacheVolume persistentVolume, the namespace's claim and volume made and mended (`ensure_claim`)."""

from __future__ import annotations

import logging
from datetime import datetime

from infer_ctl.actuate.manifests import MODEL_CACHE_CLAIM, model_cache_claim
from infer_ctl.controller.events import Call, Recorder
from infer_ctl.controller.objects import KubeWrites, service_ref
from infer_ctl.controller.settings import Settings
from infer_ctl.core import api
from infer_ctl.core.policy import ModelCacheVolume
from infer_ctl.kube.client import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, KubeClient, KubeError

log = logging.getLogger(__name__)

# how long a namespace whose Pod Security level refused the node model cache mount gets replicas without it before
# the mount is tried again
CACHE_MOUNT_RECHECK_S = 600.0


def refuses_host_path(exc: KubeError) -> bool:
    """Whether the API server refused a Pod for its hostPath volume: Pod Security Admission's message, e.g.
    'pods "llm-r0" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes (volume "model-cache")'."""
    return exc.status == 403 and "violates PodSecurity" in exc.message and "hostPath volumes" in exc.message


class ModelCacheMounts:
    def __init__(self, kube: KubeClient, call: Call, settings: Settings, events: Recorder,
                 writes: KubeWrites) -> None:
        self.kube, self._k, self.settings, self.events, self.writes = kube, call, settings, events, writes
        # namespaces whose Pods start without the node model cache mount for now: why (Pod Security refused the
        # hostPath, the claim's volume could not be had, or a claim or volume being replaced), and until when (then
        # the mount is tried again: the namespace may have been relabelled, the install granted the volumes)
        self._cache_unmounted: dict[str, tuple[str, float]] = {}
        # modelCacheVolume persistentVolume: namespaces whose model cache volume was seen (or made) as it should be
        self._cache_volumes_checked: set[str] = set()

    def off(self, namespace: str, now_s: float) -> str:
        """Why replicas in `namespace` start without their node's model cache ("" when they mount it): the
        policies' `modelCacheHostPath` off (no replica mounts one anywhere), the namespace refusing hostPath
        volumes, or its claim of a local PersistentVolume failing (`ensure_claim`). Either way a node that
        holds the weights gives the cached tier no room."""
        if not self.settings.policies.scaling.model_cache_host_path:
            return "the node model cache is off in the policies (modelCacheHostPath: off)"
        refused = self._cache_unmounted.get(namespace)
        if refused is not None and refused[1] > now_s:
            return refused[0]
        return ""

    def dir(self, namespace: str, now_s: float) -> str:
        """The node model cache directory replicas in `namespace` mount ("" for none)."""
        return "" if self.off(namespace, now_s) else self.settings.policies.scaling.model_cache_host_path

    async def refused_in(self, svc: api.InferenceService, problem: str, now: datetime, *,
                         volume: bool = False) -> None:
        """Pod Security refused a hostPath Pod (a replica's cache mount, or a prefetch Pod) in `svc`'s namespace,
        or (`volume`) the namespace's claim of a local PersistentVolume could not be had (`problem`: the API
        server's refusal, or what is wrong with the volume there): no more cache mounts there until
        CACHE_MOUNT_RECHECK_S has passed, said in a Warning Event."""
        ns = svc.meta.namespace
        if volume:
            reason, note = "ModelCacheVolumeFailed", (f"the node model cache's claim in namespace {ns} and its "
                                                      f"local PersistentVolume could not be made ({problem})")
            why = f"namespace {ns}: the node model cache's claim could not be made ({problem})"
        else:
            reason, note = "ModelCacheMountRefused", (f"namespace {ns} refuses the node model cache's hostPath "
                                                      f"mount ({problem})")
            why = f"namespace {ns} refuses hostPath volumes ({problem})"
        self._cache_unmounted[ns] = (why, now.timestamp() + CACHE_MOUNT_RECHECK_S)
        await self.events.record(service_ref(svc), reason,
                                 f"{note}: its replicas start without it (loading from the network, no prefetch Pods), "
                                 f"tried again in {CACHE_MOUNT_RECHECK_S / 60:.0f} min", "Warning", "Create", now)

    async def ensure_claim(self, svc: api.InferenceService, now: datetime) -> None:
        """modelCacheVolume persistentVolume: before Pods that mount it are made, the claim of `svc`'s namespace
        of its nodes' model caches, and the local PersistentVolume it is bound to (`model_cache_claim`), made when
        missing. One read (the claim) per round of creations once the namespace's volume was checked. Where a
        Pod made now could not be placed with the claim, it is made without the mount (`off`, for a
        control period, no Event): a claim being deleted (its Pods still hold it), a claim Lost (its volume
        deleted: the claim is deleted and both made again), a volume left Released (its claim deleted with an
        earlier namespace of that name: it binds no new claim, so it is deleted and made again). Refused (RBAC,
        a quota), or a volume of another directory than the policies', the namespace's Pods start without the
        mount for CACHE_MOUNT_RECHECK_S, said in a Warning Event."""
        scaling = self.settings.policies.scaling
        ns = svc.meta.namespace
        now_s = now.timestamp()
        if scaling.model_cache_volume is not ModelCacheVolume.PERSISTENT_VOLUME or self.off(ns, now_s):
            return
        claim, volume = model_cache_claim(ns, scaling.model_cache_host_path)
        name = volume["metadata"]["name"]
        try:
            current = await self._k(self.kube.get, PERSISTENT_VOLUME_CLAIMS, MODEL_CACHE_CLAIM, ns)
            if current is not None and current["metadata"].get("deletionTimestamp"):
                self._cache_unmounted[ns] = (f"namespace {ns}: the node model cache's claim is being deleted",
                                           now_s + self.settings.period_s)
                return
            phase = ((current or {}).get("status") or {}).get("phase")
            if current is not None and phase == "Lost":
                # its volume was deleted: kube-controller-manager binds a Lost claim to no volume made again by
                # name, so the claim is deleted and both are made again
                log.info("%s: replacing the Lost model cache claim of %s", svc.meta.key, ns)
                await self._k(self.kube.delete, PERSISTENT_VOLUME_CLAIMS, MODEL_CACHE_CLAIM, ns)
                self._cache_unmounted[ns] = (f"namespace {ns}: the node model cache's claim was Lost (its volume "
                                           "deleted), being made again", now_s + self.settings.period_s)
                return
            if current is not None and ns in self._cache_volumes_checked:
                return
            existing = await self._k(self.kube.get, PERSISTENT_VOLUMES, name)
            volume_phase = ((existing or {}).get("status") or {}).get("phase")
            if existing is not None and volume_phase in ("Released", "Failed"):
                log.info("%s: replacing the %s model cache volume %s", svc.meta.key, volume_phase, name)
                await self._k(self.kube.delete, PERSISTENT_VOLUMES, name)
                self._cache_unmounted[ns] = (f"namespace {ns}: the node model cache's volume {name} was "
                                           f"{volume_phase}, being made again", now_s + self.settings.period_s)
                return
            path = str(((existing or {}).get("spec") or {}).get("local", {}).get("path") or "")
            if existing is not None and path != scaling.model_cache_host_path:
                await self.refused_in(
                    svc, f"volume {name} is of directory {path}, the policies' modelCacheHostPath is "
                         f"{scaling.model_cache_host_path}: delete the claim {MODEL_CACHE_CLAIM} in {ns} and the "
                         "volume to have them made again", now, volume=True)
                return
            if existing is None:
                await self.writes.create_shared(PERSISTENT_VOLUMES, volume, None)
            if current is None:
                await self.writes.create_shared(PERSISTENT_VOLUME_CLAIMS, claim, ns)
        except KubeError as exc:
            await self.refused_in(svc, exc.message, now, volume=True)
            return
        self._cache_volumes_checked.add(ns)
