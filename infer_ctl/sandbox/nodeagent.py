"""The sandbox's kubelet (and NVIDIA's DRA driver): runs each bound Pod as a local model-server process.

One agent serves every node of the sandbox (each process is attributed to its Pod's node). It sees the cluster
through a `ClusterView` (`view.py`): the emulator's in-process Store, or any API server over HTTP (the real
control plane of `localcluster`, where there is no kubelet), with the same logic for both.

For a bound Pod (spec.nodeName one of its nodes) it starts a model-server process (forked by the
`python -m infer_ctl.sandbox.modelserver --zygote` fork server, so a start costs milliseconds of CPU, not an
interpreter start) with the Pod's accelerator (from its allocated ResourceClaim, whoever allocated it, the
emulator's scheduler or kube-scheduler: the device's productName, MIG profile and the catalog's relative
throughput) and cold start (shorter when the node has the model cached, and every model loaded once stays
cached on that node), then writes pods/status: phase Running, host and pod IPs, a status per container, and
the conditions PodReadyToStartContainers, Initialized, ContainersReady and Ready, the last two True when the
server says its model is loaded. Each status write is a merge patch of whole lists, conditional on the
resourceVersion it was computed from (read again on a conflict), so it never undoes another writer's change.
The Pod's address is 127.0.0.1 and its port, which every Pod on one machine cannot share, is in the annotation
`sandbox.infer-ctl.io/address` (host:port).

Deleting a Pod (deletionTimestamp: all an API server does for a bound Pod) marks it not ready, sends SIGTERM
(the server drains in-flight requests), kills it at the end of the grace period, then finishes the deletion
(grace 0, on the Pod's uid, so a new Pod of the same name is never deleted). Every process is stopped when the
agent stops.

Given objects to `publish` (`Cluster.objects()`: DeviceClasses, Nodes with their status, ResourceSlices), the
agent registers them as kubelet and the DRA driver do on a real control plane: it creates (or updates) them,
owns each node's ResourceSlices by its Node, then renews a Lease per node in `kube-node-lease` every 10 s (the
node-lifecycle controller taints and evicts a node whose Lease is older than its grace period) and posts the
node conditions (Ready; no memory, disk or PID pressure) every 60 s. On the emulator the cluster loader has
already created them, and nothing is published.

Per-Pod knobs (annotations, all optional): `sandbox.infer-ctl.io/service-time-ms` (on an H100; scaled by the
catalog's relative throughput), `.../concurrency`, `.../cold-start-seconds` (default: the owning
InferenceService's `spec.runtime.coldStartSeconds`, else 5), `.../warm-start-seconds` (cached model; default a
fifth of the cold start), and `.../runtime: pause` for a Pod that needs no process (Ready at once).

A Pod of infer-ctl's own image (`ghcr.io/infer-ctl/infer-ctl`, the controller of deploy/'s kustomize overlays and
Helm chart) is not a model server: it runs as the image's entrypoint, `infer-ctl <args>`, with its env, its
ServiceAccount's token, its ConfigMap volumes, remapped ports and its HTTP probes (`controllerpod.py`; on the real
control plane only, the emulator has no TokenRequest). Its output is in `pod_logs[(namespace, name)]`, its
probes' local URLs in `pod_probes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.kube.client import DEVICE_CLASSES, NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, KubeError, Resource
from infer_ctl.sandbox import controllerpod
from infer_ctl.sandbox.cluster import SandboxNode
from infer_ctl.sandbox.store import Obj, rfc3339
from infer_ctl.sandbox.view import ClusterView

log = logging.getLogger(__name__)

PREFIX = "sandbox.infer-ctl.io/"
ANNOTATION_ADDRESS = PREFIX + "address"
ANNOTATION_CACHE_KEY = "infer-ctl.io/model-cache-key"
CORE_EVENTS = Resource("v1", "events", "Event")
LEASES = Resource("coordination.k8s.io/v1", "leases", "Lease")
NODE_LEASE_NAMESPACE = "kube-node-lease"
_CONFLICT_RETRIES = 5
# Node conditions as kubelet posts them on a healthy node: (type, status, reason, message).
_NODE_CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "sandbox node agent is posting ready status"),
)


@dataclass(eq=False)
class Child:
    """One model-server process forked by the zygote."""

    ident: str
    on_line: Callable[[str], None]
    pid: int | None = None
    exited: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    started: asyncio.Event = field(default_factory=asyncio.Event)  # the zygote reported the pid

    def signal(self, sig: int) -> None:
        if self.pid is not None and not self.exited.done():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM (the server drains), SIGKILL once `grace_s` has passed."""
        if self.exited.done():
            return
        # A pod deleted right after binding: the fork may not be reported yet, and a signal needs the pid.
        waiters: set[asyncio.Future[Any]] = {asyncio.ensure_future(self.started.wait()), self.exited}
        await asyncio.wait(waiters, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters - {self.exited}:
            waiter.cancel()
        await controllerpod.terminate(self.signal, self.exited, grace_s)


@dataclass(eq=False)
class Zygote:
    """`python -m infer_ctl.sandbox.modelserver --zygote`: forks a model server per Pod (see modelserver)."""

    python: str
    children: dict[str, Child] = field(default_factory=dict)
    _process: asyncio.subprocess.Process | None = None
    _reader: asyncio.Task[None] | None = None
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            self.python, "-m", "infer_ctl.sandbox.modelserver", "--zygote", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, start_new_session=True)
        self._reader = asyncio.create_task(self._read())

    async def spawn(self, args: list[str], on_line: Callable[[str], None]) -> Child:
        assert self._process is not None and self._process.stdin is not None
        child = Child(f"c{next(self._ids)}", on_line)
        self.children[child.ident] = child
        self._process.stdin.write(json.dumps({"id": child.ident, "args": args}).encode() + b"\n")
        await self._process.stdin.drain()
        return child

    async def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        async for raw in self._process.stdout:
            ident, _, rest = raw.decode().strip().partition(" ")
            child = self.children.get(ident)
            if child is None:
                if rest.startswith("ERROR"):
                    log.warning("model-server zygote: %s", rest)
                continue
            if rest.startswith("PID "):
                child.pid = int(rest.split()[1])
                child.started.set()
            elif rest.startswith("EXITED "):
                self.children.pop(ident, None)
                if not child.exited.done():
                    child.exited.set_result(int(rest.split()[1]))
            else:
                try:
                    child.on_line(rest)
                except Exception:  # a failed status report must not stop the reader: children would block
                    log.exception("node agent: handling %r of %s failed", rest, ident)
        # The zygote is gone: its children are orphans now; stop them and report them exited.
        for child in list(self.children.values()):
            child.signal(signal.SIGKILL)
            if not child.exited.done():
                child.exited.set_result(-9)
        self.children.clear()

    async def stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()  # the zygote kills what is left and exits
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader


@dataclass
class _Running:
    pod_uid: str
    namespace: str
    name: str
    node: str
    child: Child | controllerpod.ControllerProcess | None = None
    port: int | None = None
    task: asyncio.Task[None] | None = None
    stopping: bool = False
    restarts: int = 0
    # Status writes of one pod, in the order they were decided (a READY report must not overtake LISTENING).
    writes: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class NodeAgent:
    view: ClusterView
    nodes: Mapping[str, SandboxNode]
    catalog: AcceleratorCatalog
    publish: Sequence[Obj] = ()
    default_cold_start_s: float = 5.0
    default_service_time_ms: float = 100.0
    default_concurrency: int = 8
    lease_duration_s: int = 40
    lease_renew_s: float = 10.0
    node_status_s: float = 60.0
    python: str = sys.executable
    registered: asyncio.Event = field(default_factory=asyncio.Event)  # every published object is in the API
    last_error: KubeError | None = None  # of registration or a heartbeat, for `KubeSide` to report
    _running: dict[str, _Running] = field(default_factory=dict)
    _cache: dict[str, set[str]] = field(default_factory=dict)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _zygote: Zygote | None = None
    _zygote_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _tasks: set[asyncio.Future[None]] = field(default_factory=set)
    _node_uids: dict[str, str] = field(default_factory=dict)
    _registered_at: str = ""
    pod_logs: dict[tuple[str, str], Path] = field(default_factory=dict)  # infer-ctl's own Pods' output
    pod_probes: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # their probes' local URLs
    _workdir: Path | None = None

    def __post_init__(self) -> None:
        self._cache = {name: set(node.model_cache) for name, node in self.nodes.items()}
        self.view.on_change(PODS, self._wake.set)
        if not self.publish:
            self.registered.set()

    async def run(self) -> None:
        keeper = asyncio.create_task(self._keep_nodes(), name="node heartbeat") if self.publish else None
        try:
            self._wake.set()
            while True:
                await self._wake.wait()
                self._wake.clear()
                try:
                    self.sync()
                except Exception:
                    log.exception("node agent sync failed; retrying on the next change")
        finally:
            if keeper is not None:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
            await self.shutdown()

    def sync(self) -> None:
        seen: set[str] = set()
        for pod in self.view.pods(nodes=self.nodes.keys()):
            node = str(pod["spec"]["nodeName"])
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            running = self._running.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                if running is None:
                    self._running[uid] = running = _Running(uid, pod["metadata"]["namespace"],
                                                            pod["metadata"]["name"], node)
                if not running.stopping:
                    running.stopping = True
                    grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
                    self._background(self._terminate(running, grace, confirm=True))
            elif running is None and (pod.get("status") or {}).get("phase") in (None, "Pending"):
                running = _Running(uid, pod["metadata"]["namespace"], pod["metadata"]["name"], node)
                self._running[uid] = running
                running.task = asyncio.ensure_future(self._run_pod(running, pod))
        for uid, running in list(self._running.items()):
            if uid not in seen and not running.stopping:
                running.stopping = True  # force-deleted: stop the process, nothing to confirm
                self._background(self._terminate(running, 0, confirm=False))

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("node agent: a background step failed", exc_info=task.exception())

    # ------------------------------------------------------------------------------------------ one pod

    def _knob(self, pod: Obj, name: str) -> str | None:
        value = (pod["metadata"].get("annotations") or {}).get(PREFIX + name)
        return str(value) if value is not None else None

    async def _owner_cold_start(self, pod: Obj) -> float | None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("kind") != "InferenceService":
                continue
            resource = Resource(str(ref.get("apiVersion", "")), "inferenceservices", "InferenceService")
            try:
                owner = await self.view.find(resource, ref["name"], pod["metadata"]["namespace"])
            except KubeError:
                return None
            value = (((owner or {}).get("spec") or {}).get("runtime") or {}).get("coldStartSeconds")
            return float(value) if value is not None else None
        return None

    async def _accelerator(self, pod: Obj) -> tuple[str, float]:
        """(catalog name or product, throughput relative to an H100) of the first device allocated to the pod."""
        statuses = {s.get("name"): s.get("resourceClaimName") for s in
                    (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        slices: list[Obj] | None = None
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            claim_name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
            claim = await self.view.find(RESOURCE_CLAIMS, str(claim_name), pod["metadata"]["namespace"]) \
                if claim_name else None
            results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
            for result in results or []:
                if slices is None:
                    slices = await self.view.list(RESOURCE_SLICES)
                for slc in slices:
                    if slc["spec"].get("pool", {}).get("name") != result.get("pool") or \
                            slc["spec"].get("driver", result.get("driver")) != result.get("driver"):
                        continue
                    for device in slc["spec"].get("devices") or []:
                        if device.get("name") != result.get("device"):
                            continue
                        attrs = device.get("attributes") or {}
                        product = (attrs.get("productName") or {}).get("string", "")
                        accel = self.catalog.by_product_name(product)
                        if accel is None:
                            return product, 1.0
                        share = 1.0
                        profile = (attrs.get("profile") or {}).get("string")
                        mig = next((p for p in accel.mig_profiles if p.name == profile), None)
                        if mig is not None:
                            share = mig.compute_slices / 7
                        label = f"{accel.name}/{profile}" if mig else accel.name
                        return label, accel.relative_throughput * share
        node = self.nodes[str(pod["spec"]["nodeName"])]
        accel = self.catalog.get(node.accelerator) if node.accelerator else None
        return (accel.name, accel.relative_throughput) if accel else ("cpu", 0.05)

    async def _run_pod(self, running: _Running, pod: Obj) -> None:
        if self._knob(pod, "runtime") == "pause":
            await self._report(running, started=True, ready=True)
            return
        image = str((((pod.get("spec") or {}).get("containers") or [{}])[0]).get("image", ""))
        if controllerpod.is_controller_image(image):
            await self._run_controller(running, pod)
            return
        model = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_CACHE_KEY) or running.name
        node_cache = self._cache.setdefault(running.node, set())
        cold = float(self._knob(pod, "cold-start-seconds") or await self._owner_cold_start(pod) or
                     self.default_cold_start_s)
        warm = float(self._knob(pod, "warm-start-seconds") or cold / 5)
        start_s = warm if model in node_cache else cold
        accelerator, relative = await self._accelerator(pod)
        service_ms = float(self._knob(pod, "service-time-ms") or self.default_service_time_ms) / max(relative, 1e-3)
        container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
        probe_path = ((container.get("readinessProbe") or {}).get("httpGet") or {}).get("path") or "/readyz"
        args = ["--namespace", running.namespace,
                "--service", (pod["metadata"].get("labels") or {}).get("infer-ctl.io/service", running.name),
                "--pod", running.name, "--model", model, "--accelerator", accelerator,
                "--service-time-ms", f"{service_ms:.3f}",
                "--concurrency", self._knob(pod, "concurrency") or str(self.default_concurrency),
                "--cold-start-s", f"{start_s:.3f}", "--ready-path", probe_path,
                "--drain-s", str((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))]
        backoff_s = 1.0
        while not running.stopping:
            zygote = await self._zygote_ready()

            def on_line(line: str) -> None:
                if line.startswith("LISTENING "):
                    running.port = int(line.split()[1])
                    self._background(self._report(running, started=True, ready=False))
                elif line == "READY":
                    node_cache.add(model)
                    self._background(self._report(running, started=True, ready=True))

            child = await zygote.spawn(args, on_line)
            running.child = child
            self._event(running, "Started", f"Started model server ({accelerator}, {model}, cold start "
                                            f"{start_s:.1f} s{' from the node cache' if model in node_cache else ''})")
            code = await asyncio.shield(child.exited)
            if running.stopping:
                return
            running.restarts += 1
            await self._report(running, started=False, ready=False, exit_code=code)
            await asyncio.sleep(backoff_s)  # kubelet's CrashLoopBackOff, doubling up to 10 s
            backoff_s = min(backoff_s * 2, 10.0)

    async def _run_controller(self, running: _Running, pod: Obj) -> None:
        """infer-ctl's own image as a local process, restarted with kubelet's back-off when it exits."""
        client = getattr(self.view, "client", None)
        if client is None:
            self._event(running, "Failed", "infer-ctl's image runs on the real control plane only (TokenRequest)")
            return
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="infer-ctl-pods-"))
        log_path = self._workdir / f"{running.namespace}_{running.name}.log"
        self.pod_logs[(running.namespace, running.name)] = log_path
        backoff_s = 1.0
        while not running.stopping:
            try:
                prepared = await asyncio.to_thread(controllerpod.prepare, client, pod, self._workdir)
            except (KubeError, OSError) as e:
                self._event(running, "Failed", f"Error: {e}")
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 10.0)
                continue
            child = await controllerpod.start(prepared, log_path)
            running.child = child
            self._event(running, "Started", f"Started container {prepared.container.get('name', 'main')} "
                                            f"(infer-ctl, pid {child.pid})")
            await self._report(running, started=True, ready=False)
            prober = asyncio.ensure_future(self._probe(running, child, prepared))
            try:
                code = await asyncio.shield(child.exited)
            finally:
                prober.cancel()
                controllerpod.cleanup(prepared)
            if running.stopping:
                return
            running.restarts += 1
            await self._report(running, started=False, ready=False, exit_code=code)
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 10.0)

    async def _probe(self, running: _Running, child: controllerpod.ControllerProcess,
                     prepared: controllerpod.Prepared) -> None:
        """kubelet's HTTP probes: readiness sets Ready (no readiness probe: Ready once started); liveness failing
        `failureThreshold` times in a row (after `initialDelaySeconds`) stops the process, which restarts it."""
        container = prepared.container
        readiness, liveness = container.get("readinessProbe") or {}, container.get("livenessProbe") or {}
        ready_url = controllerpod.probe_url(readiness, container, prepared.ports)
        live_url = controllerpod.probe_url(liveness, container, prepared.ports)
        self.pod_probes[(running.namespace, running.name)] = {
            kind: url for kind, url in (("readiness", ready_url), ("liveness", live_url)) if url}
        period_s = float(readiness.get("periodSeconds", 10))
        loop = asyncio.get_running_loop()
        started, ready, failures = loop.time(), False, 0
        while not child.exited.done():
            ok = await controllerpod.http_ok(ready_url, float(readiness.get("timeoutSeconds", 1))) \
                if ready_url else True
            if ok != ready:
                ready = ok
                await self._report(running, started=True, ready=ok)
            if live_url and loop.time() - started >= float(liveness.get("initialDelaySeconds", 0)):
                alive = await controllerpod.http_ok(live_url, float(liveness.get("timeoutSeconds", 1)))
                failures = 0 if alive else failures + 1
                if failures >= int(liveness.get("failureThreshold", 3)):
                    self._event(running, "Unhealthy", f"Liveness probe failed {failures} times: {live_url}")
                    await child.stop(30.0)
                    return
            await asyncio.sleep(min(period_s, float(liveness.get("periodSeconds", period_s))) if live_url
                                else period_s)

    async def _zygote_ready(self) -> Zygote:
        async with self._zygote_lock:  # pods bound together must share one zygote
            if self._zygote is None or not self._zygote.alive:
                zygote = Zygote(self.python)
                await zygote.start()
                self._zygote = zygote
            return self._zygote

    async def _terminate(self, running: _Running, grace_s: float, *, confirm: bool) -> None:
        child = running.child
        if child is not None or confirm:
            await self._report(running, started=child is not None, ready=False)
        if child is not None:
            self._event(running, "Killing", f"Stopping model server (draining, grace period {grace_s:.0f} s)")
            await child.stop(grace_s)
        if running.task is not None and not running.task.done():
            running.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running.task
            if running.child is not None and running.child is not child:
                await running.child.stop(0)  # spawned while we were stopping the previous one
        self._running.pop(running.pod_uid, None)
        if confirm:
            try:
                await self.view.delete_pod(running.namespace, running.name, running.pod_uid)
            except KubeError as e:
                log.warning("node agent: could not finish the deletion of pod %s/%s: %s", running.namespace,
                            running.name, e)

    async def shutdown(self) -> None:
        """Stop every model server (SIGTERM, SIGKILL after 5 s), then the zygote, which kills any leftover."""
        runs = list(self._running.values())
        for running in runs:
            running.stopping = True
        await asyncio.gather(*(self._terminate(r, 5.0, confirm=False) for r in runs), return_exceptions=True)
        if self._zygote is not None:
            await self._zygote.stop()
            self._zygote = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    # ------------------------------------------------------------------------------------------ status

    def _event(self, running: _Running, reason: str, message: str) -> None:
        """A kubelet-style Event on the Pod (Started, Killing), reported by the node's agent; written in the
        background (a slow API server must not hold up a start or a stop), and lost if the write fails."""
        now = rfc3339(self.view.now())
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{running.name}.", "namespace": running.namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": running.name,
                                   "namespace": running.namespace, "uid": running.pod_uid},
                "reason": reason, "message": message, "type": "Normal",
                "source": {"component": "kubelet", "host": running.node}, "reportingComponent": "kubelet",
                "reportingInstance": running.node, "firstTimestamp": now, "lastTimestamp": now, "count": 1}

        async def create() -> None:
            try:
                await self.view.create(CORE_EVENTS, body, running.namespace)
            except KubeError as e:
                log.debug("node agent: event %s of pod %s/%s not written: %s", reason, running.namespace,
                          running.name, e)

        self._background(create())

    async def _report(self, running: _Running, *, started: bool, ready: bool, exit_code: int | None = None) -> None:
        """Write the pod's address and status; on a conflict (the pod changed since it was read) read it again."""
        async with running.writes:
            for attempt in range(_CONFLICT_RETRIES):
                try:
                    await self._write_status(running, started=started, ready=ready, exit_code=exit_code)
                    return
                except KubeError as e:
                    if e.not_found:
                        return
                    if e.conflict and attempt + 1 < _CONFLICT_RETRIES:
                        continue
                    log.warning("node agent: status of pod %s/%s not written: %s", running.namespace,
                                running.name, e)
                    return

    async def _write_status(self, running: _Running, *, started: bool, ready: bool, exit_code: int | None) -> None:
        pod = await self.view.find(PODS, running.name, running.namespace)
        if pod is None or pod["metadata"]["uid"] != running.pod_uid:
            return
        now = rfc3339(self.view.now())
        address = f"127.0.0.1:{running.port}"
        if running.port is not None and (pod["metadata"].get("annotations") or {}).get(ANNOTATION_ADDRESS) != address:
            pod = await self.view.merge_patch(PODS, running.name, {"metadata": {
                "annotations": {ANNOTATION_ADDRESS: address},
                "resourceVersion": pod["metadata"]["resourceVersion"]}}, running.namespace)
        status = copy.deepcopy(pod.get("status") or {})
        containers = (pod.get("spec") or {}).get("containers") or [{"name": "main", "image": ""}]
        previous = {c.get("name"): c for c in status.get("containerStatuses") or []}
        pid = running.child.pid if running.child is not None else None
        container_statuses = []
        for index, container in enumerate(containers):
            name = container.get("name", "main")
            started_at = (((previous.get(name) or {}).get("state") or {}).get("running") or {}).get("startedAt") \
                or now
            if started:
                state: dict[str, Any] = {"running": {"startedAt": started_at}}
            elif exit_code is not None:
                state = {"waiting": {"reason": "CrashLoopBackOff",
                                     "message": f"model server exited with code {exit_code}"}}
            else:
                state = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}}
            # The container ID names the model server's process (sandbox://<pid>), for debugging and for tests;
            # the one process stands for every container of the pod.
            container_id = f"sandbox://{pid}" if pid else f"sandbox://{running.pod_uid[:12]}"
            if index:
                container_id += f"/{name}"
            container_statuses.append({"name": name, "image": container.get("image", ""),
                                       "imageID": f"sandbox://{container.get('image', '')}",
                                       "containerID": container_id, "ready": ready, "started": started,
                                       "restartCount": running.restarts, "state": state})
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        for ctype, value in (("PodReadyToStartContainers", True), ("Initialized", True),
                             ("ContainersReady", ready), ("Ready", ready)):
            text = "True" if value else "False"
            if conditions.get(ctype, {}).get("status") != text:
                conditions[ctype] = {"type": ctype, "status": text, "lastProbeTime": None,
                                     "lastTransitionTime": now}
        patch = {
            "phase": "Running" if started or exit_code is not None else status.get("phase", "Pending"),
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}], "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}], "startTime": status.get("startTime") or now,
            "containerStatuses": container_statuses, "conditions": list(conditions.values()),
        }
        await self.view.merge_patch(PODS, running.name, {"metadata": {"resourceVersion": pod["metadata"][
            "resourceVersion"]}, "status": patch}, running.namespace, subresource="status")

    # ------------------------------------------------------------------------------------------ nodes

    async def _keep_nodes(self) -> None:
        """Publish the nodes and their devices (retrying until the API server takes them), then keep each node's
        Lease and status fresh. Failures are logged and retried; they never stop the agent."""
        backoff_s = 0.5
        while True:
            try:
                await self._register()
                break
            except KubeError as e:
                self.last_error = e
                log.warning("node agent: registering the nodes failed (%s); retrying in %.1f s", e, backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 10.0)
        self.registered.set()
        loop = asyncio.get_running_loop()
        status_due = loop.time() + self.node_status_s
        while True:
            await asyncio.sleep(self.lease_renew_s)  # a ticker: kubelet renews its Lease on a period
            await self._renew_leases()
            if loop.time() >= status_due:
                status_due = loop.time() + self.node_status_s
                await self._post_node_statuses()

    def _published_nodes(self) -> list[Obj]:
        return [o for o in self.publish if o.get("kind") == "Node" and o["metadata"]["name"] in self.nodes]

    async def _register(self) -> None:
        self._registered_at = rfc3339(self.view.now())
        for obj in self.publish:
            if obj.get("kind") == "DeviceClass":
                await self._create_or_replace(DEVICE_CLASSES, obj)
        for node in self._published_nodes():
            name = node["metadata"]["name"]
            body = copy.deepcopy(node)
            body["status"] = self._node_status(node)
            try:
                created = await self.view.create(NODES, body)
            except KubeError as e:
                if e.status != 409:
                    raise
                # Registered before (an earlier agent): take over its labels, keep what controllers added.
                created = await self.view.merge_patch(NODES, name, {"metadata": {"labels": node["metadata"].get(
                    "labels") or {}}})
            self._node_uids[name] = created["metadata"]["uid"]
            await self._post_node_status(node)  # an API server may drop the status of a create
            await self._renew_lease(name)
        for obj in self.publish:
            node_name = (obj.get("spec") or {}).get("nodeName")
            if obj.get("kind") == "ResourceSlice" and node_name in self._node_uids:
                body = copy.deepcopy(obj)
                body["metadata"]["ownerReferences"] = [self._node_owner(str(node_name))]
                await self._create_or_replace(RESOURCE_SLICES, body)

    async def _create_or_replace(self, resource: Resource, obj: Obj) -> None:
        try:
            await self.view.create(resource, obj)
        except KubeError as e:
            if e.status != 409:
                raise
            current = await self.view.find(resource, obj["metadata"]["name"])
            if current is None:
                raise
            body = copy.deepcopy(obj)
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await self.view.replace(resource, body)

    def _node_owner(self, name: str) -> Obj:
        return {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self._node_uids[name], "controller": True}

    def _node_status(self, node: Obj) -> Obj:
        status = copy.deepcopy(node.get("status") or {})
        now = rfc3339(self.view.now())
        status["conditions"] = [{"type": ctype, "status": value, "reason": reason, "message": message,
                                 "lastHeartbeatTime": now, "lastTransitionTime": self._registered_at or now}
                                for ctype, value, reason, message in _NODE_CONDITIONS]
        return status

    async def _post_node_status(self, node: Obj) -> None:
        await self.view.merge_patch(NODES, node["metadata"]["name"], {"status": self._node_status(node)},
                                    subresource="status")

    async def _post_node_statuses(self) -> None:
        for node in self._published_nodes():
            try:
                await self._post_node_status(node)
            except KubeError as e:
                self.last_error = e
                log.warning("node agent: status of node %s not posted: %s", node["metadata"]["name"], e)

    async def _renew_leases(self) -> None:
        for name in list(self._node_uids):
            try:
                await self._renew_lease(name)
            except KubeError as e:
                self.last_error = e
                log.warning("node agent: Lease of node %s not renewed: %s", name, e)

    async def _renew_lease(self, name: str) -> None:
        now = _micro_time(self.view.now())
        try:
            await self.view.merge_patch(LEASES, name, {"spec": {"holderIdentity": name, "renewTime": now}},
                                        NODE_LEASE_NAMESPACE)
        except KubeError as e:
            if not e.not_found:
                raise
            await self.view.create(LEASES, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                             "ownerReferences": [self._node_owner(name)]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": self.lease_duration_s, "renewTime": now},
            }, NODE_LEASE_NAMESPACE)


def _micro_time(moment: datetime.datetime) -> str:
    """metav1.MicroTime, as Lease.spec.renewTime takes it."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
