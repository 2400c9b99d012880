"""The sandbox's kubelet: runs each bound Pod as a local model-server process and reports its status.

One agent serves every node of the sandbox (each process is attributed to its Pod's node). For a bound Pod
it starts a model-server process (forked by the `python -m infer_ctl.sandbox.modelserver --zygote` fork
server, so a start costs milliseconds of CPU, not an interpreter start) with the Pod's accelerator (from its
allocated ResourceClaim: the device's productName, MIG profile and the catalog's relative throughput) and cold
start (shorter when the node has the model cached, and every model loaded once stays cached on that node),
then reports phase Running with container start time once the process listens, and `Ready` when the server
says its model is loaded.
The Pod's address is 127.0.0.1 and its port, which every Pod on one machine cannot share, is in the annotation
`sandbox.infer-ctl.io/address` (host:port).

Deleting a Pod (deletionTimestamp) marks it not ready, sends SIGTERM (the server drains in-flight requests),
kills it at the end of the grace period, then confirms the deletion (grace 0). Every process is stopped when
the agent stops.

Per-Pod knobs (annotations, all optional): `sandbox.infer-ctl.io/service-time-ms` (on an H100; scaled by the
catalog's relative throughput), `.../concurrency`, `.../cold-start-seconds` (default: the owning
InferenceService's `spec.runtime.coldStartSeconds`, else 5), `.../warm-start-seconds` (cached model; default a
fifth of the cold start), and `.../runtime: pause` for a Pod that needs no process (Ready at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.policy import AcceleratorCatalog
from infer_ctl.sandbox.cluster import SandboxNode
from infer_ctl.sandbox.store import ApiError, Event, Obj, Store, rfc3339

log = logging.getLogger(__name__)

PREFIX = "sandbox.infer-ctl.io/"
ANNOTATION_ADDRESS = PREFIX + "address"
ANNOTATION_CACHE_KEY = "infer-ctl.io/model-cache-key"


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
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self.exited), timeout=max(grace_s, 0.1))
        except TimeoutError:
            self.signal(signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.exited), timeout=5)


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
    child: Child | None = None
    port: int | None = None
    task: asyncio.Task[None] | None = None
    stopping: bool = False
    restarts: int = 0


@dataclass
class NodeAgent:
    store: Store
    nodes: Mapping[str, SandboxNode]
    catalog: AcceleratorCatalog
    default_cold_start_s: float = 5.0
    default_service_time_ms: float = 100.0
    default_concurrency: int = 8
    python: str = sys.executable
    _running: dict[str, _Running] = field(default_factory=dict)
    _cache: dict[str, set[str]] = field(default_factory=dict)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _zygote: Zygote | None = None
    _zygote_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _tasks: set[asyncio.Future[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._cache = {name: set(node.model_cache) for name, node in self.nodes.items()}
        self.store.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.key == ("", "pods"):
            self._wake.set()

    async def run(self) -> None:
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
            await self.shutdown()

    def sync(self) -> None:
        pods_rt = self.store.type("", "v1", "pods")
        seen: set[str] = set()
        for pod in self.store.list_objects(pods_rt):
            node = (pod.get("spec") or {}).get("nodeName")
            if node not in self.nodes:
                continue
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            running = self._running.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                if running is None:
                    self._running[uid] = running = _Running(uid, pod["metadata"]["namespace"],
                                                            pod["metadata"]["name"], str(node))
                if not running.stopping:
                    running.stopping = True
                    grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
                    self._background(self._terminate(running, grace, confirm=True))
            elif running is None and (pod.get("status") or {}).get("phase") in (None, "Pending"):
                running = _Running(uid, pod["metadata"]["namespace"], pod["metadata"]["name"], str(node))
                self._running[uid] = running
                running.task = asyncio.ensure_future(self._run_pod(running, pod))
        for uid, running in list(self._running.items()):
            if uid not in seen and not running.stopping:
                running.stopping = True  # force-deleted: stop the process, nothing to confirm
                self._background(self._terminate(running, 0, confirm=False))

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------------------------------ one pod

    def _knob(self, pod: Obj, name: str) -> str | None:
        value = (pod["metadata"].get("annotations") or {}).get(PREFIX + name)
        return str(value) if value is not None else None

    def _owner_cold_start(self, pod: Obj) -> float | None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("kind") != "InferenceService":
                continue
            group, _, version = str(ref.get("apiVersion", "")).rpartition("/")
            try:
                owner = self.store.find(self.store.type(group, version, "inferenceservices"),
                                        pod["metadata"]["namespace"], ref["name"])
            except ApiError:
                return None
            value = (((owner or {}).get("spec") or {}).get("runtime") or {}).get("coldStartSeconds")
            return float(value) if value is not None else None
        return None

    def _accelerator(self, pod: Obj) -> tuple[str, float]:
        """(catalog name or product, throughput relative to an H100) of the first device allocated to the pod."""
        claims_rt = self.store.type("resource.k8s.io", "v1", "resourceclaims")
        slices_rt = self.store.type("resource.k8s.io", "v1", "resourceslices")
        statuses = {s.get("name"): s.get("resourceClaimName") for s in
                    (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            claim_name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
            claim = self.store.find(claims_rt, pod["metadata"]["namespace"], str(claim_name)) if claim_name else None
            results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
            for result in results or []:
                for slc in self.store.list_objects(slices_rt):
                    if slc["spec"].get("pool", {}).get("name") != result.get("pool"):
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
            self._report(running, started=True, ready=True)
            return
        model = (pod["metadata"].get("annotations") or {}).get(ANNOTATION_CACHE_KEY) or running.name
        node_cache = self._cache.setdefault(running.node, set())
        cold = float(self._knob(pod, "cold-start-seconds") or self._owner_cold_start(pod) or
                     self.default_cold_start_s)
        warm = float(self._knob(pod, "warm-start-seconds") or cold / 5)
        start_s = warm if model in node_cache else cold
        accelerator, relative = self._accelerator(pod)
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
                    self._report(running, started=True, ready=False)
                elif line == "READY":
                    node_cache.add(model)
                    self._report(running, started=True, ready=True)

            child = await zygote.spawn(args, on_line)
            running.child = child
            self._event(running, "Started", f"Started model server ({accelerator}, {model}, cold start "
                                            f"{start_s:.1f} s{' from the node cache' if model in node_cache else ''})")
            code = await asyncio.shield(child.exited)
            if running.stopping:
                return
            running.restarts += 1
            self._report(running, started=False, ready=False, exit_code=code)
            await asyncio.sleep(backoff_s)  # kubelet's CrashLoopBackOff, doubling up to 10 s
            backoff_s = min(backoff_s * 2, 10.0)

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
            with contextlib.suppress(ApiError):
                self._report(running, started=child is not None, ready=False)
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
            pods_rt = self.store.type("", "v1", "pods")
            with contextlib.suppress(ApiError):
                self.store.delete(pods_rt, running.namespace, running.name, grace_period_s=0)

    async def shutdown(self) -> None:
        """Stop every model server (SIGTERM, SIGKILL after 5 s), then the zygote, which kills any leftover."""
        runs = list(self._running.values())
        for running in runs:
            running.stopping = True
        await asyncio.gather(*(self._terminate(r, 5.0, confirm=False) for r in runs), return_exceptions=True)
        if self._zygote is not None:
            await self._zygote.stop()
            self._zygote = None

    # ------------------------------------------------------------------------------------------ status

    def _event(self, running: _Running, reason: str, message: str) -> None:
        """A kubelet-style Event on the Pod (Started, Killing), reported by the node's agent."""
        now = rfc3339(self.store.clock())
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{running.name}.", "namespace": running.namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": running.name,
                                   "namespace": running.namespace, "uid": running.pod_uid},
                "reason": reason, "message": message, "type": "Normal",
                "source": {"component": "kubelet", "host": running.node}, "reportingComponent": "kubelet",
                "reportingInstance": running.node, "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        with contextlib.suppress(ApiError):
            self.store.create(self.store.type("", "v1", "events"), running.namespace, body)

    def _report(self, running: _Running, *, started: bool, ready: bool, exit_code: int | None = None) -> None:
        pods_rt = self.store.type("", "v1", "pods")
        pod = self.store.find(pods_rt, running.namespace, running.name)
        if pod is None or pod["metadata"]["uid"] != running.pod_uid:
            return
        now = rfc3339(self.store.clock())
        if running.port is not None and (pod["metadata"].get("annotations") or {}).get(ANNOTATION_ADDRESS) != \
                f"127.0.0.1:{running.port}":
            pod, _ = self.store.patch(pods_rt, running.namespace, running.name, "application/merge-patch+json",
                                      {"metadata": {"annotations": {ANNOTATION_ADDRESS: f"127.0.0.1:{running.port}"}}})
        new = copy.deepcopy(pod)
        status = new.setdefault("status", {})
        container = ((pod.get("spec") or {}).get("containers") or [{"name": "main", "image": ""}])[0]
        previous: dict[str, Any] = next(iter(status.get("containerStatuses") or []), {})
        started_at = ((previous.get("state") or {}).get("running") or {}).get("startedAt") or now
        if started:
            state: dict[str, Any] = {"running": {"startedAt": started_at}}
        elif exit_code is not None:
            state = {"waiting": {"reason": "CrashLoopBackOff",
                                 "message": f"model server exited with code {exit_code}"}}
        else:
            state = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}}
        pid = running.child.pid if running.child is not None else None
        # The container ID names the model server's process (sandbox://<pid>), for debugging and for tests.
        container_id = f"sandbox://{pid}" if pid else f"sandbox://{running.pod_uid[:12]}"
        status.update({
            "phase": "Running" if started or exit_code is not None else status.get("phase", "Pending"),
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}], "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}], "startTime": status.get("startTime") or now,
            "containerStatuses": [{"name": container.get("name", "main"), "image": container.get("image", ""),
                                   "imageID": f"sandbox://{container.get('image', '')}",
                                   "containerID": container_id,
                                   "ready": ready, "started": started, "restartCount": running.restarts,
                                   "state": state}],
        })
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        for ctype, value in (("PodReadyToStartContainers", True), ("Initialized", True),
                             ("ContainersReady", ready), ("Ready", ready)):
            text = "True" if value else "False"
            if conditions.get(ctype, {}).get("status") != text:
                conditions[ctype] = {"type": ctype, "status": text, "lastProbeTime": None,
                                     "lastTransitionTime": now}
        status["conditions"] = list(conditions.values())
        self.store.update(pods_rt, running.namespace, running.name, new, subresource="status", check_rv=False)
