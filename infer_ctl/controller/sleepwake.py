"""The sleeping tier's sleep/wake client: a sleep (out of traffic first, then `POST /sleep?level=1` in the
background: it lets the requests in flight finish), a wake (`POST /wake_up`, waited for, then the serving label),
a lender's replica put to sleep for another service's wake or load (`displace`), and the sleepers held asleep whose
model server has not answered a sleep yet (`ensure_asleep`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from infer_ctl.actuate.engine import EngineClient
from infer_ctl.actuate.manifests import (
    ANNOTATION_ASLEEP,
    ANNOTATION_ENGINE,
    ANNOTATION_ENGINE_VERSION,
    ANNOTATION_WARM_HOST,
    ANNOTATION_YIELDED_AT,
    ANNOTATION_YIELDED_TO,
    Role,
    held_asleep,
)
from infer_ctl.controller.clock import Clock
from infer_ctl.controller.events import Recorder
from infer_ctl.controller.memory import ServiceMemory
from infer_ctl.controller.objects import KubeWrites, owner_of, seconds
from infer_ctl.controller.settings import Settings, runtime_of
from infer_ctl.controller.snapshot import ClusterView
from infer_ctl.core import api
from infer_ctl.core.runtime import ServiceRuntime, parse_version
from infer_ctl.engine.cycle import CyclePlan, weight_bytes
from infer_ctl.kube import pods as kube_pods
from infer_ctl.kube.client import PODS
from infer_ctl.kube.labels import LABEL_ROLE
from infer_ctl.kube.pods import ReplicaPod

log = logging.getLogger(__name__)

# the sleeping tier: a refused wake is not tried again for this many control periods (the plan creates instead),
# and the HTTP deadline of a wake (on top of the model's weight bytes over the policies' wakeGbps; a sleep's is the
# sleep/wake client's, with the engine profile's drain timeout)
WAKE_REFUSED_PERIODS = 3.0
WAKE_TIMEOUT_S = 10.0


class SleepWake:
    def __init__(self, engine: EngineClient, settings: Settings, events: Recorder,  # noqa: PLR0917
                 writes: KubeWrites, view: ClusterView, clock: Clock) -> None:
        self._engine, self.settings, self.events, self.writes, self.view, self.clock = \
            engine, settings, events, writes, view, clock
        # sleeps under way (a sleep lets the requests in flight finish first: it does not hold up the cycle)
        self._sleeping: dict[tuple[str, str], asyncio.Task[None]] = {}

    def close(self) -> None:
        for task in self._sleeping.values():
            task.cancel()

    async def wake(self, body: Mapping[str, Any], svc: api.InferenceService, memory: ServiceMemory,  # noqa: PLR0917
                   name: str, address: str, now: datetime) -> bool:
        """`POST /wake_up`, then the serving label (and the asleep annotation removed). A refusal (409
        DeviceMemory: the warm host's device is taken; or no answer in time) is remembered for
        WAKE_REFUSED_PERIODS, with one Warning Event; False then."""
        ns = svc.meta.namespace
        expected = weight_bytes(svc.spec.model) / (self.settings.policies.scaling.wake_gbps * 1e9)
        started = self.clock.monotonic()
        runtime = runtime_of(svc, self.settings)
        why = "its engine has no runtime profile" if runtime is None else \
            await self._engine.wake(address, runtime, WAKE_TIMEOUT_S + 3 * expected)
        if why:
            memory.wake_refused[name] = (why, now.timestamp() + WAKE_REFUSED_PERIODS * self.settings.period_s)
            await self.events.record(body, "WakeRefused", f"the wake of sleeper {name} was refused ({why}); a "
                                     "replica is created instead", "Warning", "Wake", now)
            return False
        memory.wakes.append(self.clock.monotonic() - started)
        memory.asleep.discard(name)
        await self.writes.patch_pod(name, ns, {"metadata": {
            "labels": {LABEL_ROLE: Role.SERVING.value},
            "annotations": {ANNOTATION_ASLEEP: None, ANNOTATION_YIELDED_AT: None, ANNOTATION_YIELDED_TO: None}}})
        return True

    def start_sleep(self, svc: api.InferenceService, memory: ServiceMemory, name: str, address: str) -> None:
        """`_sleep` in the background (one per replica at a time): it may wait for requests in flight."""
        key = (svc.meta.namespace, name)
        running = self._sleeping.get(key)
        if not address or (running is not None and not running.done()):
            return
        task = asyncio.create_task(self._sleep(svc, memory, name, address), name=f"sleep {key[0]}/{name}")
        self._sleeping[key] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self._sleeping.get(key) is finished:
                del self._sleeping[key]

        task.add_done_callback(done)

    async def _sleep(self, svc: api.InferenceService, memory: ServiceMemory, name: str, address: str) -> None:
        """`POST /sleep?level=1` (it lets the requests in flight finish, then moves the weights to host memory),
        after the replica left traffic. A sleep that fails is tried again by the next cycle (`ensure_asleep`)."""
        runtime = runtime_of(svc, self.settings)
        why = "its engine has no runtime profile" if runtime is None else await self._engine.sleep(address, runtime)
        if not why:
            memory.asleep.add(name)
        else:
            log.warning("%s: the sleep of %s failed (tried again next cycle): %s", svc.meta.key, name, why)

    def pod_runtime(self, pod: Mapping[str, Any]) -> ServiceRuntime | None:
        """A replica Pod's engine, from the annotations its controller wrote (any service's: a lender's replica is
        put to sleep by the borrower's cycle)."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        profile = self.settings.policies.runtimes.profiles.get(str(annotations.get(ANNOTATION_ENGINE, "")))
        if profile is None:
            return None
        # the sleep/wake client reads the profile and version only: the port and path are the profile's defaults
        return ServiceRuntime(profile, parse_version(str(annotations.get(ANNOTATION_ENGINE_VERSION, ""))),
                              profile.port, profile.health_path)

    def ensure_asleep(self, svc: api.InferenceService, memory: ServiceMemory,
                      replicas: Sequence[ReplicaPod], pods: Sequence[Mapping[str, Any]], *,
                      woken: frozenset[str] = frozenset()) -> None:
        """Sleepers held asleep whose model server has not answered a sleep yet (a new one, once ready: vLLM and
        SGLang load onto the device and cannot start asleep; one whose sleep failed; any after a controller
        restart) are put to sleep (idempotent: a sleeping server answers at once)."""
        held = {str(p["metadata"]["name"]) for p in pods if held_asleep(p)}
        memory.asleep &= held
        due = [r for r in replicas if r.name in held and r.name not in memory.asleep and r.name not in woken
               and r.address and r.state in (api.ReplicaState.STANDBY, api.ReplicaState.SERVING)]
        for r in due:
            self.start_sleep(svc, memory, r.name, r.address)

    async def yielded_at(self, namespace: str, names: Sequence[str]) -> dict[str, float]:
        """When each of the replicas `names` yielded its GPU to another service's wake (its `yielded-at`
        annotation, as the cache shows it), for those that did."""
        wanted = set(names)
        out: dict[str, float] = {}
        for pod in (await self.view.cached(PODS))[0]:
            meta = pod.get("metadata") or {}
            if meta.get("namespace") == namespace and meta.get("name") in wanted:
                at = seconds((meta.get("annotations") or {}).get(ANNOTATION_YIELDED_AT))
                if at is not None:
                    out[str(meta["name"])] = at
        return out

    async def displace(self, body: Mapping[str, Any], svc: api.InferenceService, plan: CyclePlan,
                       now: datetime) -> None:
        """Put to sleep the replicas of services that yield to sleepers whose devices the plan's wakes take: out
        of traffic first (the standby label, the asleep annotation, when and to whom it yielded), then the sleep,
        waited for (the wakes need the device memory it frees). One Event on each yielding service. A sleep that
        fails leaves the device taken: the wake that needed it is then refused, and a replica created instead."""
        ns = svc.meta.namespace
        pods = {str(p["metadata"]["name"]): p for p in (await self.view.cached(PODS))[0]
                if (p.get("metadata") or {}).get("namespace") == ns}
        loads = [r.name for r in plan.create if r.sleeping]
        to = ", ".join(plan.actions.wake) if plan.actions.wake else \
            f"new sleeper(s) {', '.join(loads)} to load on (no engine starts asleep)"

        async def one(name: str) -> None:
            pod = pods.get(name)
            if pod is None:
                return
            await self.writes.patch_pod(name, ns, {"metadata": {
                "labels": {LABEL_ROLE: Role.STANDBY.value},
                "annotations": {ANNOTATION_ASLEEP: "true", ANNOTATION_YIELDED_AT: f"{now.timestamp():.3f}",
                                ANNOTATION_YIELDED_TO: f"{svc.meta.name}: {to}"[:250]}}})
            runtime = self.pod_runtime(pod)
            why = "its engine has no runtime profile" if runtime is None else \
                await self._engine.sleep(kube_pods.replica_pod(pod).address, runtime)
            owner = owner_of(pod)
            if owner is not None:
                lent_for = f"wake of {to}" if plan.actions.wake else to
                note = (f"replica {name} went to sleep: its GPU (warm host "
                        f"{(pod['metadata'].get('annotations') or {}).get(ANNOTATION_WARM_HOST, '')}) is lent to "
                        f"{svc.meta.name}'s {lent_for}")
                await self.events.record(owner, "Yielded", note + (f"; the sleep failed: {why}" if why else ""),
                                         "Warning" if why else "Normal", "Yield", now)
            if why:
                log.warning("%s: the sleep of %s, yielding its GPU, failed: %s", svc.meta.key, name, why)

        await asyncio.gather(*(one(name) for name in plan.displace))
