"""The sandbox's kubelet (and NVIDIA's DRA driver): runs each bound Pod as a local model-server process.

One agent serves every node of the sandbox (each process is attributed to its Pod's node). It sees the cluster
through a `ClusterView` (`view.py`): the emulator's in-process Store, or any API server over HTTP (the real
control plane of `localcluster`, where there is no kubelet), with the same logic for both.

For a bound Pod (spec.nodeName one of its nodes) it runs the Pod's container as the image table says (`images.py`:
an fnmatch glob on the image -> a local command; the user's `--images FILE` before the built-in entries, which map
vLLM's and SGLang's images to the stand-ins). A built-in stand-in is forked by the
`python -m infer_ctl.sandbox.modelserver --zygote` fork server (a start costs milliseconds of CPU, not an interpreter
start) with argv `[vllm|sglang, *container.args, --host <podIP>]` (the container's `command`, one of the engine's
launchers, stripped; `--host` only when the args have none) and exactly the env below; any other command runs as a
process of its own (`command + container.args`, cwd a temporary directory, output in `pod_logs`). `$(VAR)` in
command and args is expanded as kubelet does. The env is the container's (`containerenv.py`: values, Secrets,
ConfigMaps, fieldRefs; envFrom; a missing Secret or key leaves the container waiting CreateContainerConfigError with
a Warning Event, tried again with back-off; resourceFieldRef from the container's resources) plus the simulated
hardware, `INFER_CTL_SANDBOX_*`: the Pod's
accelerator (from its allocated ResourceClaim, whoever allocated it, the emulator's scheduler or kube-scheduler: the
device's productName, MIG profile), the service time scaled by the catalog's relative throughput, the concurrency,
the cold start (shorter when the node has the model cached), the model's bytes, the wake/sleep links, the memory
ledger's URL, the engine version from the image tag and the grace period.
Each Pod gets its own loopback address (`podnet.py`), written to status.podIP/podIPs; the controller, the front door
and Prometheus address it as `<podIP>:<containerPort>`. The agent then writes pods/status: phase Running, host and
pod IPs, a status per container, and the conditions PodReadyToStartContainers, Initialized, ContainersReady and
Ready, the last two from kubelet's probes (`probes.py`: startup, readiness, liveness on the podIP; no readiness
probe: Ready once started; failed liveness probes restart the container). Each status write is a merge patch of
whole lists, conditional on the resourceVersion it was computed from (read again on a conflict), so it never undoes
another writer's change.

Volumes are not mounted (the processes read the host's filesystem; the model cache's hostPath or claim is the
node's cache directory, below): a Pod's emptyDir, claim, Secret or ConfigMap volume is accepted, and a Secret or
ConfigMap volume whose object is missing (not optional) holds the container in ContainerCreating with kubelet's
FailedMount Event until it exists (`containerenv.check_volumes`). `container_envs` records the env each container
was started with (what its process got), by (namespace, name).

Deleting a Pod (deletionTimestamp: all an API server does for a bound Pod) marks it not ready, runs the
container's preStop hook within the grace period (a sleep or an HTTP GET of the Pod's address; an exec hook is not
emulated, a Warning Event says so), sends SIGTERM (the server drains in-flight requests), kills it at the end of
the grace period, then finishes the deletion
(grace 0, on the Pod's uid, so a new Pod of the same name is never deleted). Every process is stopped when the
agent stops.

Given objects to `publish` (`Cluster.objects()`: DeviceClasses, Nodes with their status, ResourceSlices), the
agent registers them as kubelet and the DRA driver do on a real control plane: it creates (or updates) them,
owns each node's ResourceSlices by its Node, then renews a Lease per node in `kube-node-lease` every 10 s (the
node-lifecycle controller taints and evicts a node whose Lease is older than its grace period) and posts the
node conditions (Ready; no memory, disk or PID pressure) every 60 s. On the emulator the cluster loader has
already created them, and nothing is published.

Per-Pod knobs (annotations, all optional; on the Pod, else on the InferenceService that owns it, since the
controller writes the replicas' Pods): `sandbox.infer-ctl.io/service-time-ms` (on an H100; scaled by the
catalog's relative throughput), `.../concurrency`, `.../cold-start-seconds` (default: the owning
InferenceService's `spec.runtime.coldStartSeconds`, else 5), `.../warm-start-seconds` (cached model; default a
fifth of the cold start), and `.../runtime: pause` for a Pod that needs no process (Ready at once).

Warm tiers. Every model server loads onto its device (neither vLLM nor SGLang can start asleep); a sleeper is put to
sleep by its controller once ready (`POST /sleep?level=1` moves the weights to host memory, `POST /wake_up` back),
with `infer-ctl.io/model-bytes` as the weights' size. The agent keeps a ledger of that memory: per node, the host
memory held by sleeping replicas, within a budget (the Node's annotation `infer-ctl.io/host-memory-bytes`, else its
`status.capacity.memory`); per device (from the Pod's allocated claims: a shared ResourceClaim gives several Pods the
same device, the "warm host"), the memory of the awake models, within the device's `memory` capacity in its
ResourceSlice (split evenly over a Pod's devices). A model server asks the agent before each move (an HTTP endpoint of
the agent's on 127.0.0.1, passed as INFER_CTL_SANDBOX_AGENT_URL): a wake that would overfill the device is refused
(the stand-in answers as its engine answers an error), a sleep that would overfill the host budget too (`HostMemory`).
A start that does not fit fails as the container would: on a full device it exits with CUDA's out-of-memory error
(exit 1), and is restarted with kubelet's back-off (container waiting in CrashLoopBackOff, `lastState.terminated`
naming the reason), or with `restartPolicy: Never` leaves the Pod Failed.
Bandwidths, in GB/s (10^9 bytes/s), from the Pod's annotation, else its Node's, else the agent's defaults:
`sandbox.infer-ctl.io/h2d-gbps` (a wake; default 12), `.../d2h-gbps` (a sleep; default 12) and
`.../network-gbps` (a prefetch; default 0.5). The defaults are conservative against what is published: PCIe Gen4
x16 carries 32 GB/s per direction in theory and about 25 GB/s in pinned-memory copies; vLLM's sleep-mode
benchmarks (blog.vllm.ai, 2025-10-26) wake level-1 sleepers of 0.6B-235B models in 0.1-6 s on A4000-A100; llm-d's
fast model actuation reports about 3 s for 64 GiB (~23 GB/s). So 12 GB/s wakes a 16 GB 8B model in 1.3 s and a
140 GB 70B model in 12 s. A network fetch of 0.5 GB/s (4 Gbit/s) sits between a plain loader from object storage
(Run:ai's Model Streamer benchmark: about 48 s for an 8B model, ~0.33 GB/s) and a streaming loader (8-14 s).

The cached tier. A Pod labelled `infer-ctl.io/role: prefetch` with the annotations `infer-ctl.io/model-cache-key`
and `infer-ctl.io/model-bytes`, bound to a node, needs no GPU and runs no server: the agent downloads the model
into that node's cache (bytes / network bandwidth; one download at a time per node, its one link; nothing to do
when the node holds it already), then the Pod Succeeds (phase Succeeded, its container terminated with exit code
0, as a Job's Pod). A replica that starts there later loads in the warm start time if it mounts the node's cache:
its container mounts a hostPath volume or a PersistentVolumeClaim at a path that holds its
`INFER_CTL_MODEL_CACHE_DIR` (as the controller's replica Pods do, policies' modelCacheHostPath and
modelCacheVolume), else it loads from the network in the cold start time. (A model a replica loaded stays in the
node's cache too, as if the node kept the weights it pulled.)
The cache has a disk budget per node: the Node's annotation `infer-ctl.io/model-cache-budget-bytes`, else its pool's
`modelCacheBytes` in the cluster file (default 500Gi). A model's size is its Pod's `infer-ctl.io/model-bytes`
(the cluster file's preloaded entries count 0 bytes until a Pod states their size). A download that would exceed
the budget first evicts the least recently used models (a replica's start or a download is a use) that no running
replica on the node uses, with an Event `ModelCacheEvicted` on the Pod that made room; if even that cannot make
room, the prefetch Pod fails (its container terminated `ModelCacheFull`, exit 1, the message naming the budget and
the models held, and a Warning Event `ModelCacheFull`), and a replica's model is simply not kept.
Each node has a disk of its own on this machine (`node_root`/<node>/...): a download leaves the model's directory
in the node's cache directory (`model_cache_dir`, policies' default modelCacheHostPath) as `hf download` and the
prefetch's script do, the directory first, the weights (a sparse file of the model's bytes) and the completion
marker `.infer-ctl-complete` last; an eviction removes it. What records which node holds which model is the
node-side reporter's ConfigMap per node (infer_ctl.observe.nodecache), which scans that directory: on the real
control plane deploy/'s DaemonSet, whose Pods this agent runs with the node's directory as their hostPath; on the
emulator, which runs no DaemonSets, the agent runs the same reporter itself (`report_caches`).
The agent also publishes what each node holds on its Node (a merge patch of annotations, only when they change):
`infer-ctl.io/model-cache` (the cache keys, comma-separated, sorted; kept beside the records for the sandbox's
own tests and views, read by no controller) and `infer-ctl.io/host-memory-used-bytes`.
A bad annotation (model bytes, a bandwidth, the host budget) leaves the container waiting with
`CreateContainerConfigError` and a Warning Event that names the annotation and the problem.

A Pod of infer-ctl's own image (`ghcr.io/infer-ctl/infer-ctl`, the controller of deploy/'s kustomize overlays and
Helm chart) is not a model server: it runs as the image's entrypoint, `infer-ctl <args>`, with its env, its
ServiceAccount's token, its ConfigMap volumes, remapped ports and its HTTP probes (`controllerpod.py`; on the real
control plane only, the emulator has no TokenRequest). Its output is in `pod_logs[(namespace, name)]`, its
probes' local URLs in `pod_probes`. An entry of the user's image table that matches infer-ctl's image stands for
that entrypoint: scripts/run-image.sh runs the image scripts/build-image.sh built, from its root filesystem.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import datetime
import itertools
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web

from infer_ctl.actuate.manifests import ANNOTATION_DEVICE_BYTES, ENV_MODEL_CACHE_DIR
from infer_ctl.config.cluster import DEFAULT_MODEL_CACHE_BYTES, SandboxNode
from infer_ctl.core.policy import DEFAULT_MODEL_CACHE_HOST_PATH, AcceleratorCatalog
from infer_ctl.core.quantity import QuantityError, format_bytes, parse_bytes
from infer_ctl.kube.client import DEVICE_CLASSES, NODES, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES, KubeError, Resource
from infer_ctl.kube.labels import (
    ANNOTATION_D2H_GBPS,
    ANNOTATION_H2D_GBPS,
    ANNOTATION_HOST_MEMORY_BYTES,
    ANNOTATION_HOST_MEMORY_USED,
    ANNOTATION_MODEL_BYTES,
    ANNOTATION_MODEL_CACHE,
    ANNOTATION_NETWORK_GBPS,
    LABEL_ROLE,
    ROLE_PREFETCH,
)
from infer_ctl.kube.modelcache import COMPLETE_MARKER
from infer_ctl.observe.nodecache import Reporter
from infer_ctl.sandbox import containerenv, controllerpod, images
from infer_ctl.sandbox import probes as probes_
from infer_ctl.sandbox.engines.http import ASLEEP_REQUEST
from infer_ctl.sandbox.loops import run_on_changes
from infer_ctl.sandbox.podnet import PodAddresses
from infer_ctl.sandbox.store import Obj, rfc3339
from infer_ctl.sandbox.view import ClusterView

log = logging.getLogger(__name__)

PREFIX = "sandbox.infer-ctl.io/"
ANNOTATION_CACHE_KEY = "infer-ctl.io/model-cache-key"
ANNOTATION_MODEL_CACHE_BUDGET = "infer-ctl.io/model-cache-budget-bytes"  # on a Node: its model cache's disk budget
CORE_EVENTS = Resource("v1", "events", "Event")
LEASES = Resource("coordination.k8s.io/v1", "leases", "Lease")
NODE_LEASE_NAMESPACE = "kube-node-lease"
_CONFLICT_RETRIES = 5
# Bandwidths (GB/s) when neither the Pod nor its Node says: see the module docstring for the sources.
DEFAULT_H2D_GBPS = 12.0
DEFAULT_D2H_GBPS = 12.0
DEFAULT_NETWORK_GBPS = 0.5
_GB = 1e9
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
    pending: int | None = None  # a signal sent before the zygote reported the pid: delivered when it does

    def signal(self, sig: int) -> None:
        if self.exited.done():
            return
        if self.pid is None:
            # A pod deleted right after binding: the zygote (a loaded machine can take seconds to read its stdin)
            # has not forked yet. The signal waits for the pid, a SIGKILL over a SIGTERM.
            self.pending = signal.SIGKILL if signal.SIGKILL in (sig, self.pending) else sig
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)

    def forked(self, pid: int) -> None:
        self.pid = pid
        if self.pending is not None:
            self.signal(self.pending)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM (the server drains), SIGKILL once `grace_s` has passed."""
        if not self.exited.done():
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

    async def spawn(self, args: list[str], env: Mapping[str, str], on_line: Callable[[str], None]) -> Child:
        """Fork a stand-in with `args` (its argv after the module: `[vllm|sglang, ...]`) and exactly `env`."""
        assert self._process is not None and self._process.stdin is not None
        child = Child(f"c{next(self._ids)}", on_line)
        self.children[child.ident] = child
        self._process.stdin.write(json.dumps({"id": child.ident, "args": args, "env": dict(env)}).encode() + b"\n")
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
                child.forked(int(rest.split()[1]))
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
class Holding:
    """The weights of one Pod's model server: in host memory (asleep), on its devices (awake), or both mid-move."""

    pod: str  # namespace/name, for messages
    node: str
    model_bytes: int
    devices: Mapping[str, int]  # device key (driver/pool/device) -> the device's memory capacity in bytes
    host: bool = False
    device: bool = False
    device_bytes: int = 0  # what the Pod says it takes of a device awake (`infer-ctl.io/device-memory-bytes`)

    @property
    def per_device_bytes(self) -> int:
        """The device memory it takes awake per device: its annotation's (a sleeper of an exclusive service takes
        its whole warm host), else the weights split evenly over the Pod's devices (tensor parallelism)."""
        if self.device_bytes > 0:
            return self.device_bytes
        return -(-self.model_bytes // max(len(self.devices), 1))


@dataclass
class MemoryLedger:
    """What the model servers of the agent's nodes hold: host memory per node (sleeping replicas) and memory per
    device (awake ones; a shared ResourceClaim gives several Pods the same device). Each reservation checks and
    commits with no await in between, so two wakes can never both take the same free bytes of a device."""

    holdings: dict[str, Holding] = field(default_factory=dict)  # by Pod uid

    def host_used(self, node: str) -> int:
        return sum(h.model_bytes for h in self.holdings.values() if h.host and h.node == node)

    def device_used(self, key: str) -> int:
        return sum(h.per_device_bytes for h in self.holdings.values() if h.device and key in h.devices)

    def reserve_host(self, uid: str, budget_bytes: int) -> str | None:
        """Hold the weights of `uid` in its node's host memory; None, or why they do not fit."""
        holding = self.holdings[uid]
        if not holding.host:
            used = self.host_used(holding.node)
            if used + holding.model_bytes > budget_bytes:
                holders = ", ".join(sorted(h.pod for h in self.holdings.values() if h.host and h.node == holding.node))
                return (f"host memory of node {holding.node}: sleeping replicas hold {format_bytes(used)} "
                        f"({holders or 'none'}) of its budget of {format_bytes(budget_bytes)}; {holding.pod} needs "
                        f"{format_bytes(holding.model_bytes)} more")
            holding.host = True
        return None

    def reserve_device(self, uid: str) -> str | None:
        """Hold the weights of `uid` on its devices; None, or why they do not fit (the first full device)."""
        holding = self.holdings[uid]
        if not holding.device:
            need = holding.per_device_bytes
            for key, capacity in sorted(holding.devices.items()):
                used = self.device_used(key)
                if capacity > 0 and used + need > capacity:  # a device that publishes no memory is not limited
                    holders = ", ".join(sorted(h.pod for h in self.holdings.values() if h.device and key in h.devices))
                    return (f"device {key} ({format_bytes(capacity)}): awake models hold {format_bytes(used)} "
                            f"({holders or 'none'}); {holding.pod} needs {format_bytes(need)}")
            holding.device = True
        return None

    def release(self, uid: str, where: str) -> None:
        holding = self.holdings.get(uid)
        if holding is not None:
            if where == "host":
                holding.host = False
            else:
                holding.device = False


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
    ip: str | None = None  # the Pod's own loopback address (podnet.py); None for infer-ctl's own Pods
    startup_ok: bool = True  # the startup probe has succeeded (or there is none): containerStatus.started
    model: str = ""  # a replica's model cache key: a model a running replica uses is never evicted from the cache
    container: Obj | None = None  # the Pod's (first) container: its preStop hook runs at the Pod's deletion
    # Status writes of one pod, in the order they were decided (a probe's verdict must not overtake the start).
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
    image_table: images.ImageTable | None = None  # None: the built-in entries only
    addresses: PodAddresses = field(default_factory=PodAddresses)
    h2d_gbps: float = DEFAULT_H2D_GBPS
    d2h_gbps: float = DEFAULT_D2H_GBPS
    network_gbps: float = DEFAULT_NETWORK_GBPS
    ledger: MemoryLedger = field(default_factory=MemoryLedger)
    ledger_port: int = 0  # the model servers' endpoint for memory reservations (bound by `run`)
    registered: asyncio.Event = field(default_factory=asyncio.Event)  # every published object is in the API
    last_error: KubeError | None = None  # of registration or a heartbeat, for `KubeSide` to report
    _running: dict[str, _Running] = field(default_factory=dict)
    _cache: dict[str, set[str]] = field(default_factory=dict)
    # per node: each cached model's bytes (downloads under way included) and when it was last used (a counter)
    _cache_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    _cache_used: dict[str, dict[str, int]] = field(default_factory=dict)
    _uses: itertools.count[int] = field(default_factory=itertools.count)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _zygote: Zygote | None = None
    _zygote_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _tasks: set[asyncio.Future[None]] = field(default_factory=set)
    _node_uids: dict[str, str] = field(default_factory=dict)
    _registered_at: str = ""
    pod_logs: dict[tuple[str, str], Path] = field(default_factory=dict)  # infer-ctl's own Pods' output
    pod_probes: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)  # their probes' local URLs
    # requests that reached a stand-in while it slept (or had released its memory), per Pod: the sleeping tier
    # routes none there (a Pod leaves routing before its sleep and joins after a confirmed wake)
    asleep_requests: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    # the environment each model-server container was last started with (namespace, name): exactly what its
    # process got (a stand-in forked by the zygote has its os.environ replaced with it)
    container_envs: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    _workdir: Path | None = None
    _ledger_runner: aiohttp.web.AppRunner | None = None
    _downloads: dict[str, asyncio.Lock] = field(default_factory=dict)  # one download at a time per node
    _dirty: set[str] = field(default_factory=set)  # nodes whose annotations may have to be published
    _published: dict[str, dict[str, str]] = field(default_factory=dict)
    _publish_wake: asyncio.Event = field(default_factory=asyncio.Event)
    _session: aiohttp.ClientSession | None = None  # the probes'
    _images: images.ImageTable = field(init=False)
    # The nodes' disks: node N's path P is <node_root>/N/P (a temporary directory unless given). Each node's model
    # cache (`model_cache_dir`, policies' modelCacheHostPath) holds a directory per model as a download leaves
    # it (`_write_cached`), which the node-side reporter scans: deploy/'s DaemonSet on the real control plane
    # (its hostPath is this directory), or the agent itself on the emulator, which runs no DaemonSets
    # (`report_caches`: the namespace to write the records in; None: the DaemonSet does).
    node_root: Path | None = None
    model_cache_dir: str = DEFAULT_MODEL_CACHE_HOST_PATH
    report_caches: str | None = None
    report_interval_s: float = 1.0
    _own_root: bool = False
    _reporters: dict[str, Reporter] = field(default_factory=dict)
    _report_wake: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._images = self.image_table or images.ImageTable.with_builtins(python=self.python)
        if self.node_root is None:
            self.node_root, self._own_root = Path(tempfile.mkdtemp(prefix="infer-ctl-nodes-")), True
            # enterable by every user, as a node's /var/lib is: a Pod run as its runAsUser (scripts/run-image.sh)
            # reads its hostPath volumes here
            self.node_root.chmod(0o755)
        self._cache = {name: set(node.model_cache) for name, node in self.nodes.items()}
        for name, keys in self._cache.items():
            for key in keys:
                self._write_cached(name, key, 0)  # the cluster file's preloaded models (size unknown)
        self._dirty = set(self.nodes)
        self.view.on_change(PODS, self._wake.set)
        if not self.publish:
            self.registered.set()

    async def run(self) -> None:
        await self._serve_ledger()
        helpers = [asyncio.create_task(self._publish_nodes(), name="node annotations")]
        if self.report_caches is not None:
            helpers.append(asyncio.create_task(self._report_caches(self.report_caches), name="node cache records"))
        if self.publish:
            helpers.append(asyncio.create_task(self._keep_nodes(), name="node heartbeat"))
        try:
            await run_on_changes(self._wake, self.sync, "node agent sync")
        finally:
            for helper in helpers:
                helper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await helper
            await self.shutdown()
            if self._ledger_runner is not None:
                await self._ledger_runner.cleanup()
                self._ledger_runner = None

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

    def _knob(self, pod: Obj, name: str, owner: Obj | None = None) -> str | None:
        """A knob from the Pod's annotation, else from its InferenceService's (the controller writes the Pods, so
        a service's manifest sets its model servers' knobs there)."""
        for obj in (pod, owner or {}):
            value = ((obj.get("metadata") or {}).get("annotations") or {}).get(PREFIX + name)
            if value is not None:
                return str(value)
        return None

    async def _owner(self, pod: Obj) -> Obj | None:
        """The InferenceService that owns the Pod (None: none, or unreadable)."""
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("kind") != "InferenceService":
                continue
            resource = Resource(str(ref.get("apiVersion", "")), "inferenceservices", "InferenceService")
            try:
                return await self.view.find(resource, ref["name"], pod["metadata"]["namespace"])
            except KubeError:
                return None
        return None

    async def _allocated_devices(self, pod: Obj) -> list[tuple[str, Obj]]:
        """(driver/pool/device, the device in its ResourceSlice) of every device allocated to the pod's claims,
        whoever allocated them (the emulator's scheduler or kube-scheduler)."""
        statuses = {s.get("name"): s.get("resourceClaimName") for s in
                    (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        slices: list[Obj] | None = None
        out: list[tuple[str, Obj]] = []
        for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
            claim_name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
            claim = await self.view.find(RESOURCE_CLAIMS, str(claim_name), pod["metadata"]["namespace"]) \
                if claim_name else None
            results = (((claim or {}).get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
            for result in results or []:
                if slices is None:
                    slices = await self.view.list(RESOURCE_SLICES)
                device = next((d for slc in slices if slc["spec"].get("pool", {}).get("name") == result.get("pool")
                               and slc["spec"].get("driver", result.get("driver")) == result.get("driver")
                               for d in slc["spec"].get("devices") or [] if d.get("name") == result.get("device")),
                              None)
                if device is not None:
                    out.append((f"{result.get('driver')}/{result.get('pool')}/{result.get('device')}", device))
        return out

    def _accelerator(self, devices: Sequence[tuple[str, Obj]], node_name: str) -> tuple[str, float]:
        """(catalog name or product, throughput relative to an H100) of the pod's first device (else its node's)."""
        for _, device in devices[:1]:
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
        node = self.nodes[node_name]
        accel = self.catalog.get(node.accelerator) if node.accelerator else None
        return (accel.name, accel.relative_throughput) if accel else ("cpu", 0.05)

    async def _node(self, name: str) -> Obj:
        """The Node object (a bare stand-in when it is not registered: no annotations, no capacity)."""
        return await self.view.find(NODES, name) or {"metadata": {"name": name}}

    async def _host_budget(self, node_name: str) -> int:
        """The node's host-memory budget for sleeping replicas; ValueError naming a bad annotation or capacity."""
        node = await self._node(node_name)
        text = (node["metadata"].get("annotations") or {}).get(ANNOTATION_HOST_MEMORY_BYTES)
        where = f"node {node_name}: annotation {ANNOTATION_HOST_MEMORY_BYTES}"
        if text is None:
            text = ((node.get("status") or {}).get("capacity") or {}).get("memory")
            where = f"node {node_name}: status.capacity.memory"
        if text is None:
            raise ValueError(f"{where}: missing, so the node has no host-memory budget")
        try:
            return parse_bytes(str(text))
        except QuantityError as e:
            raise ValueError(f"{where}: {e}") from None

    def _gbps(self, pod: Obj, node: Obj, key: str, default: float) -> float:
        """A bandwidth from the pod's annotation, else its node's, else `default`; ValueError naming a bad one."""
        for owner, obj in (("pod", pod), (f"node {node['metadata']['name']}", node)):
            text = (obj["metadata"].get("annotations") or {}).get(key)
            if text is None:
                continue
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{owner}: annotation {key}: {text!r} is not a positive number of GB/s")
            return value
        return default

    def _reserve_start(self, running: _Running) -> str | None:
        """What the start fills: its devices (every engine loads awake); None, or why it does not fit."""
        return self.ledger.reserve_device(running.pod_uid)

    def _forget(self, running: _Running) -> None:
        holding = self.ledger.holdings.pop(running.pod_uid, None)
        if holding is not None and holding.host:
            self._node_changed(running.node)

    async def _run_pod(self, running: _Running, pod: Obj) -> None:
        container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
        image = str(container.get("image", ""))
        if controllerpod.is_controller_image(image):
            await self._run_controller(running, pod)  # remapped ports on 127.0.0.1 (controllerpod.py)
            return
        running.ip = self.addresses.allocate(running.pod_uid)
        if self._knob(pod, "runtime") == "pause":
            await self._report(running, started=True, ready=True)
            return
        annotations = pod["metadata"].get("annotations") or {}
        if (pod["metadata"].get("labels") or {}).get(LABEL_ROLE) == ROLE_PREFETCH:
            await self._run_prefetch(running, pod)
            return
        planned = await self._plan_container(running, container)
        if planned is None:
            return
        launch, probes = planned
        model = annotations.get(ANNOTATION_CACHE_KEY) or running.name
        running.model = model
        owner = await self._owner(pod)
        hint = (((owner or {}).get("spec") or {}).get("runtime") or {}).get("coldStartSeconds")
        cold = float(self._knob(pod, "cold-start-seconds", owner) or hint or self.default_cold_start_s)
        warm = float(self._knob(pod, "warm-start-seconds", owner) or cold / 5)
        cached = self._cached_start(running, pod, model)
        start_s = warm if cached else cold
        try:
            model_bytes = _model_bytes(annotations, required=False)
            device_bytes = _model_bytes(annotations, required=False, key=ANNOTATION_DEVICE_BYTES)
            node = await self._node(running.node)
            h2d = self._gbps(pod, node, ANNOTATION_H2D_GBPS, self.h2d_gbps)
            d2h = self._gbps(pod, node, ANNOTATION_D2H_GBPS, self.d2h_gbps)
        except ValueError as e:
            await self._config_error(running, str(e))
            return
        cache_budget = await self._cache_budget_or_none(running.node)
        devices = await self._allocated_devices(pod)
        accelerator, relative = self._accelerator(devices, running.node)
        capacities = {key: _device_memory(device) for key, device in devices}
        service_ms = float(self._knob(pod, "service-time-ms", owner) or self.default_service_time_ms) / max(relative,
                                                                                                         1e-3)
        grace_s = float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        # The simulated hardware: what a real node's GPU, disk and links would impose, which no engine flag says.
        hardware = {
            "INFER_CTL_SANDBOX_NAMESPACE": running.namespace, "INFER_CTL_SANDBOX_POD": running.name,
            "INFER_CTL_SANDBOX_ACCELERATOR": accelerator, "INFER_CTL_SANDBOX_SERVICE_TIME_MS": f"{service_ms:.3f}",
            "INFER_CTL_SANDBOX_CONCURRENCY": self._knob(pod, "concurrency", owner) or str(self.default_concurrency),
            "INFER_CTL_SANDBOX_COLD_START_S": f"{start_s:.3f}", "INFER_CTL_SANDBOX_MODEL_BYTES": str(model_bytes),
            "INFER_CTL_SANDBOX_H2D_GBPS": repr(h2d), "INFER_CTL_SANDBOX_D2H_GBPS": repr(d2h),
            "INFER_CTL_SANDBOX_AGENT_URL": f"http://127.0.0.1:{self.ledger_port}/v1/pods/{running.pod_uid}",
            "INFER_CTL_SANDBOX_ENGINE_VERSION": images.engine_version(image),
            "INFER_CTL_SANDBOX_DRAIN_S": f"{grace_s:g}",
        }
        backoff_s = 1.0
        running.container = container
        while not running.stopping:
            env = await self._configured_env(running, pod, container)
            if env is None:
                return
            self.ledger.holdings[running.pod_uid] = Holding(f"{running.namespace}/{running.name}", running.node,
                                                            model_bytes, capacities, device_bytes=device_bytes)
            try:
                refused = self._reserve_start(running)
            except ValueError as e:
                self._forget(running)
                await self._config_error(running, str(e))
                return
            if refused is not None:
                self._forget(running)
                if not await self._failed_start(running, pod, "Error", 1, f"CUDA out of memory: {refused}",
                                                backoff_s=backoff_s):
                    return
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 10.0)
                continue
            self.container_envs[(running.namespace, running.name)] = {**env, **hardware}
            try:
                child = await self._start_container(running, launch, {**env, **hardware}, model=model,
                                                    model_bytes=model_bytes, cache_budget=cache_budget)
            except OSError as e:
                self._forget(running)
                if not await self._failed_start(running, pod, "StartError", 128, f"exec {launch.argv[0]}: {e}",
                                                backoff_s=backoff_s):
                    return
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 10.0)
                continue
            running.child = child
            self._event(running, "Started", f"Started container {container.get('name', 'main')} on {running.ip} "
                                            f"({accelerator}, {model}, cold start {start_s:.1f} s"
                                            f"{' from the node cache' if cached else ''})")
            prober = asyncio.ensure_future(self._probe_container(
                running, child, container, probes, grace_s=grace_s,
                on_ready=lambda: self._keep_loaded(running, model, model_bytes, cache_budget)))
            try:
                code = await asyncio.shield(child.exited)
            finally:
                prober.cancel()
                self._forget(running)
            if running.stopping:
                return
            running.restarts += 1
            await self._report(running, started=False, ready=False, exit_code=code)
            await asyncio.sleep(backoff_s)  # kubelet's CrashLoopBackOff, doubling up to 10 s
            backoff_s = min(backoff_s * 2, 10.0)

    async def _plan_container(self, running: _Running, container: Obj
                              ) -> tuple[images.Launch, dict[str, probes_.Probe | None]] | None:
        """What to run for the container and its probes; None when it cannot start (reported as kubelet does:
        waiting ErrImagePull, CreateContainerError or CreateContainerConfigError, with a Warning Event)."""
        image = str(container.get("image", ""))
        try:
            launch = self._images.launch(container)
            probes = {kind: probes_.parse_probe(kind, container)
                      for kind in (probes_.STARTUP, probes_.READINESS, probes_.LIVENESS)}
        except images.LaunchError as e:
            self._event(running, "Failed", f"Error: {e}", "Warning")
            await self._report(running, started=False, ready=False,
                               state={"waiting": {"reason": "CreateContainerError", "message": str(e)}})
            return None
        except probes_.ProbeSpecError as e:
            await self._config_error(running, str(e))
            return None
        if launch is None:
            message = (f"image {image!r}: no entry of the sandbox's image table matches it (add one with "
                       "`infer-ctl sandbox up --images FILE`)")
            self._event(running, "Failed", f"Failed to pull image {image!r}: {message}", "Warning")
            await self._report(running, started=False, ready=False,
                               state={"waiting": {"reason": "ErrImagePull", "message": message}})
            return None
        return launch, probes

    async def _start_container(self, running: _Running, launch: images.Launch, env: dict[str, str], *, model: str,
                               model_bytes: int, cache_budget: int | None) -> Child | controllerpod.ControllerProcess:
        """Fork a stand-in through the zygote, or run any other command as a process of its own (OSError: it
        cannot be executed)."""
        assert running.ip is not None
        args = [controllerpod.expand(a, env) for a in launch.argv]  # kubelet expands $(VAR) in command and args
        if launch.zygote_args is not None:
            engine_args = [controllerpod.expand(a, env) for a in launch.zygote_args]
            if not any(a == "--host" or a.startswith("--host=") for a in engine_args):
                engine_args += ["--host", running.ip]  # in a cluster it binds 0.0.0.0 of its own network namespace
            zygote = await self._zygote_ready()

            def on_line(line: str) -> None:
                # vLLM's API server listens only once the engine has loaded: the model is on the node now.
                if line.startswith("LISTENING "):
                    running.port = int(line.rpartition(":")[2]) if ":" in line else int(line.split()[1])
                    self._keep_loaded(running, model, model_bytes, cache_budget)
                elif line == ASLEEP_REQUEST:
                    self.asleep_requests[running.namespace, running.name] += 1
                    log.warning("%s/%s: a request reached its model server while it slept", running.namespace,
                                running.name)

            return await zygote.spawn(engine_args, env, on_line)
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="infer-ctl-pods-"))
        log_path = self._workdir / f"{running.namespace}_{running.name}.log"
        self.pod_logs[(running.namespace, running.name)] = log_path
        cwd = Path(tempfile.mkdtemp(prefix=f"{running.name}-", dir=self._workdir))
        # An image's own ENV would give PATH; the host's stands for it, so a bare command name is found.
        full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env}
        with log_path.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                *args, env=full_env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
                cwd=cwd, start_new_session=True)
        return controllerpod.ControllerProcess(process)

    async def _probe_container(self, running: _Running, child: Child | controllerpod.ControllerProcess,
                               container: Obj, probes: Mapping[str, probes_.Probe | None], *, grace_s: float,
                               on_ready: Callable[[], None]) -> None:
        """kubelet's probe workers for one run of the container (see probes.py): started, ready, restarts."""
        assert running.ip is not None
        loop = asyncio.get_running_loop()
        began = loop.time()
        startup, readiness, liveness = (probes.get(k) for k in (probes_.STARTUP, probes_.READINESS,
                                                                probes_.LIVENESS))
        verdicts = {p.kind: probes_.Verdict(p) for p in (startup, readiness, liveness) if p is not None}
        due: dict[str, float] = {}

        def arm(probe: probes_.Probe | None) -> None:
            if probe is not None:
                due[probe.kind] = max(began + probe.initial_delay_s, loop.time())

        async def became_started() -> None:
            running.startup_ok = True
            arm(readiness)
            arm(liveness)
            await self._report(running, started=True, ready=readiness is None)
            if readiness is None:
                on_ready()

        running.startup_ok = False
        if startup is None:
            await became_started()
        else:
            await self._report(running, started=True, ready=False)
            arm(startup)
        name = container.get("name", "main")
        session = await self._probe_session()
        while due and not child.exited.done():
            kind, at = min(due.items(), key=lambda item: item[1])
            await asyncio.sleep(max(0.0, at - loop.time()))
            verdict = verdicts[kind]
            ok = await probes_.check(verdict.probe, running.ip, session)
            if child.exited.done():
                return
            due[kind] = at + verdict.probe.period_s
            if not verdict.record(ok):
                continue
            what = f"{kind.capitalize()} probe failed {verdict.failures} times: {verdict.probe.url(running.ip)}"
            if kind == probes_.STARTUP:
                if verdict.result:
                    del due[kind]
                    await became_started()
                    continue
                self._event(running, "Unhealthy", what, "Warning")
            elif kind == probes_.READINESS:
                await self._report(running, started=True, ready=bool(verdict.result))
                if verdict.result:
                    on_ready()
                else:
                    self._event(running, "Unhealthy", what, "Warning")
                continue
            elif verdict.result:
                continue
            else:
                self._event(running, "Unhealthy", what, "Warning")
            self._event(running, "Killing", f"Container {name} failed {kind} probe, will be restarted")
            probe_grace = ((container.get(f"{kind}Probe") or {}).get("terminationGracePeriodSeconds"))
            await child.stop(float(probe_grace) if probe_grace is not None else grace_s)
            return

    async def _probe_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # no proxy from the environment: a probe goes to the Pod's address, as kubelet's does
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session

    async def _failed_start(self, running: _Running, pod: Obj, reason: str, exit_code: int, message: str, *,
                            backoff_s: float) -> bool:
        """Report a container that ended at its start as kubelet does; True when it is to be restarted."""
        now = rfc3339(self.view.now())
        terminated = {"exitCode": exit_code, "reason": reason, "message": message, "startedAt": now,
                      "finishedAt": now}
        policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
        if policy == "Never":
            self._event(running, "Failed", f"Container terminated ({reason}): {message}", "Warning")
            await self._report(running, started=False, ready=False, state={"terminated": terminated},
                               phase="Failed")
            return False
        running.restarts += 1
        name = (((pod.get("spec") or {}).get("containers") or [{}])[0]).get("name", "main")
        waiting = {"reason": "CrashLoopBackOff", "message": f"back-off {backoff_s:.0f}s restarting failed "
                                                            f"container={name} pod={running.name}"}
        self._event(running, "BackOff", f"Back-off restarting failed container {name} ({reason}: {message})",
                    "Warning")
        await self._report(running, started=False, ready=False, state={"waiting": waiting},
                           last_state={"terminated": terminated})
        return True

    async def _config_error(self, running: _Running, message: str) -> None:
        """kubelet's answer to a container it cannot configure: waiting, CreateContainerConfigError, an Event."""
        self._event(running, "Failed", f"Error: {message}", "Warning")
        await self._report(running, started=False, ready=False,
                           state={"waiting": {"reason": "CreateContainerConfigError", "message": message}})

    async def _configured_env(self, running: _Running, pod: Obj, container: Obj) -> dict[str, str] | None:
        """The container's env, once its Secret and ConfigMap volumes exist and its env can be built; until then
        it waits as kubelet's container does (ContainerCreating with FailedMount, or CreateContainerConfigError),
        tried again with back-off, one Event per distinct problem. None: the Pod is stopping."""
        backoff_s, problem = 1.0, ""
        while not running.stopping:
            try:
                await containerenv.check_volumes(self.view.find, pod)
                return await containerenv.container_env(self.view.find, pod, container, running.ip or "")
            except (containerenv.VolumeNotReady, containerenv.ContainerConfigError) as e:
                if str(e) != problem:
                    problem = str(e)
                    if isinstance(e, containerenv.VolumeNotReady):
                        await self._mount_failed(running, problem)
                    else:
                        await self._config_error(running, problem)
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 10.0)
        return None

    async def _mount_failed(self, running: _Running, message: str) -> None:
        """kubelet's answer to a volume it cannot set up: the container waits in ContainerCreating, an Event
        FailedMount names the volume (tried again later: the Secret or ConfigMap may be created meanwhile)."""
        self._event(running, "FailedMount", message, "Warning")
        await self._report(running, started=False, ready=False,
                           state={"waiting": {"reason": "ContainerCreating"}})

    async def _pre_stop(self, running: _Running, grace_s: float) -> float:
        """kubelet's preStop hook at a Pod's deletion, within its grace period: a sleep, or an HTTP GET of the Pod's
        address (an exec hook is not emulated: there is no container to run it in; an Event says so). Returns the
        grace left for SIGTERM; as kubelet, a hook that used it all leaves 2 s more."""
        hook = ((running.container or {}).get("lifecycle") or {}).get("preStop") or {}
        if not hook or grace_s <= 0 or running.ip is None:
            return grace_s
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            async with asyncio.timeout(grace_s):
                if "sleep" in hook:
                    await asyncio.sleep(float((hook.get("sleep") or {}).get("seconds", 0)))
                elif "httpGet" in hook:
                    get = hook.get("httpGet") or {}
                    port = probes_.container_port(running.container or {}, get.get("port", "http"))
                    session = await self._probe_session()
                    with contextlib.suppress(aiohttp.ClientError, OSError):
                        async with session.get(f"http://{running.ip}:{port}{get.get('path') or '/'}") as answer:
                            await answer.read()
                else:
                    self._event(running, "FailedPreStopHook", "the sandbox does not run exec preStop hooks "
                                                              "(no container to run them in)", "Warning")
        except (TimeoutError, probes_.ProbeSpecError):
            pass
        left = grace_s - (loop.time() - began)
        return left if left > 0 else 2.0

    async def _run_prefetch(self, running: _Running, pod: Obj) -> None:
        """Download a model into the node's cache, then complete (see the module docstring)."""
        annotations = pod["metadata"].get("annotations") or {}
        key = annotations.get(ANNOTATION_CACHE_KEY)
        try:
            if not key:
                raise ValueError(f"annotation {ANNOTATION_CACHE_KEY}: required on a prefetch Pod (the model to "
                                 "fetch into the node's cache)")
            model_bytes = _model_bytes(annotations, required=True)
            gbps = self._gbps(pod, await self._node(running.node), ANNOTATION_NETWORK_GBPS, self.network_gbps)
            budget = await self._cache_budget(running.node)
        except ValueError as e:
            await self._config_error(running, str(e))
            return
        # its env as kubelet builds it (the hub token from the service's Secret): a missing Secret or key leaves it
        # waiting, tried again with back-off, before any download
        env = await self._configured_env(running, pod, ((pod.get("spec") or {}).get("containers") or [{}])[0])
        if env is None:
            return
        self.container_envs[(running.namespace, running.name)] = env
        cache = self._cache.setdefault(running.node, set())
        await self._report(running, started=True, ready=False)
        held = key in cache
        self._event(running, "Started", f"Prefetching {key} into the model cache of {running.node}: "
                                        + ("already there" if held else
                                           f"{format_bytes(model_bytes)} at {gbps:g} GB/s"))
        async with self._downloads.setdefault(running.node, asyncio.Lock()):
            if key in cache:
                self._cache_use(running.node, key, model_bytes)
            else:
                refused = self._make_room(running, key, model_bytes, budget)
                if refused is not None:
                    self._event(running, "ModelCacheFull", refused, "Warning")
                    now = rfc3339(self.view.now())
                    await self._report(running, started=False, ready=False, phase="Failed", state={"terminated": {
                        "exitCode": 1, "reason": "ModelCacheFull", "message": refused, "finishedAt": now}})
                    return
                sizes = self._cache_bytes.setdefault(running.node, {})
                sizes[key] = model_bytes  # counted from now on: a model kept during the download sees it
                self._write_partial(running.node, key)
                try:
                    await asyncio.sleep(model_bytes / (gbps * _GB))
                except BaseException:  # the Pod stopped mid-download: nothing was kept
                    sizes.pop(key, None)
                    self._remove_cached(running.node, key)
                    raise
                cache.add(key)
                self._write_cached(running.node, key, model_bytes)
                self._cache_use(running.node, key, model_bytes)
                self._node_changed(running.node)
        now = rfc3339(self.view.now())
        await self._report(running, started=False, ready=False, phase="Succeeded", state={"terminated": {
            "exitCode": 0, "reason": "Completed", "finishedAt": now}})

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
        image = str((((pod.get("spec") or {}).get("containers") or [{}])[0]).get("image", ""))
        entry = self._images.match(image)  # a user's entry for infer-ctl's image: e.g. the built image's rootfs
        command = entry.command if entry is not None else None
        while not running.stopping:
            try:
                prepared = await asyncio.to_thread(controllerpod.prepare, client, pod, self._workdir,
                                                   lambda path: self.node_path(running.node, path), command)
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
            await child.stop(await self._pre_stop(running, grace_s))
        if running.task is not None and not running.task.done():
            running.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running.task
            if running.child is not None and running.child is not child:
                await running.child.stop(0)  # spawned while we were stopping the previous one
        self._running.pop(running.pod_uid, None)
        self.container_envs.pop((running.namespace, running.name), None)
        self._forget(running)
        self.addresses.release(running.pod_uid)
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
        if self._own_root and self.node_root is not None:
            shutil.rmtree(self.node_root, ignore_errors=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.addresses.close()

    # ------------------------------------------------------------------------------------------ status

    def _event(self, running: _Running, reason: str, message: str, event_type: str = "Normal") -> None:
        """A kubelet-style Event on the Pod (Started, Killing, BackOff, Failed), reported by the node's agent;
        written in the background (a slow API server must not hold up a start or a stop), and lost if the write
        fails."""
        now = rfc3339(self.view.now())
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{running.name}.", "namespace": running.namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": running.name,
                                   "namespace": running.namespace, "uid": running.pod_uid},
                "reason": reason, "message": message[:1024], "type": event_type,
                "source": {"component": "kubelet", "host": running.node}, "reportingComponent": "kubelet",
                "reportingInstance": running.node, "firstTimestamp": now, "lastTimestamp": now, "count": 1}

        async def create() -> None:
            try:
                await self.view.create(CORE_EVENTS, body, running.namespace)
            except KubeError as e:
                log.debug("node agent: event %s of pod %s/%s not written: %s", reason, running.namespace,
                          running.name, e)

        self._background(create())

    async def _report(self, running: _Running, *, started: bool, ready: bool, exit_code: int | None = None,
                      state: Mapping[str, Any] | None = None, last_state: Mapping[str, Any] | None = None,
                      phase: str | None = None) -> None:
        """Write the pod's address and status; on a conflict (the pod changed since it was read) read it again.
        `state`, `last_state` and `phase` override what `started` and `exit_code` imply."""
        async with running.writes:
            for attempt in range(_CONFLICT_RETRIES):
                try:
                    await self._write_status(running, started=started, ready=ready, exit_code=exit_code,
                                             state=state, last_state=last_state, phase=phase)
                    return
                except KubeError as e:
                    if e.not_found:
                        return
                    if e.conflict and attempt + 1 < _CONFLICT_RETRIES:
                        continue
                    log.warning("node agent: status of pod %s/%s not written: %s", running.namespace,
                                running.name, e)
                    return

    async def _write_status(self, running: _Running, *, started: bool, ready: bool, exit_code: int | None,
                            state: Mapping[str, Any] | None = None, last_state: Mapping[str, Any] | None = None,
                            phase: str | None = None) -> None:
        pod = await self.view.find(PODS, running.name, running.namespace)
        if pod is None or pod["metadata"]["uid"] != running.pod_uid:
            return
        now = rfc3339(self.view.now())
        status = copy.deepcopy(pod.get("status") or {})
        containers = (pod.get("spec") or {}).get("containers") or [{"name": "main", "image": ""}]
        previous = {c.get("name"): c for c in status.get("containerStatuses") or []}
        pid = running.child.pid if running.child is not None else None
        container_statuses = []
        for index, container in enumerate(containers):
            name = container.get("name", "main")
            started_at = (((previous.get(name) or {}).get("state") or {}).get("running") or {}).get("startedAt") \
                or now
            if state is not None:
                current: dict[str, Any] = copy.deepcopy(dict(state))
                if "terminated" in current:
                    current["terminated"].setdefault("startedAt", started_at)
            elif started:
                current = {"running": {"startedAt": started_at}}
            elif exit_code is not None:
                current = {"waiting": {"reason": "CrashLoopBackOff",
                                       "message": f"model server exited with code {exit_code}"}}
            else:
                current = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}}
            if last_state is not None:
                last: Mapping[str, Any] | None = last_state
            elif exit_code is not None:
                last = {"terminated": {"exitCode": exit_code, "reason": "Error", "startedAt": started_at,
                                       "finishedAt": now}}
            else:
                last = (previous.get(name) or {}).get("lastState")
            # The container ID names the model server's process (sandbox://<pid>), for debugging and for tests;
            # the one process stands for every container of the pod.
            container_id = f"sandbox://{pid}" if pid else f"sandbox://{running.pod_uid[:12]}"
            if index:
                container_id += f"/{name}"
            entry = {"name": name, "image": container.get("image", ""),
                     "imageID": f"sandbox://{container.get('image', '')}", "containerID": container_id,
                     "ready": ready, "started": started and running.startup_ok, "restartCount": running.restarts,
                     "state": current}
            if last:
                entry["lastState"] = copy.deepcopy(dict(last))
            container_statuses.append(entry)
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        done_reason = {"Succeeded": "PodCompleted", "Failed": "PodFailed"}.get(phase or "")
        for ctype, value in (("PodReadyToStartContainers", True), ("Initialized", True),
                             ("ContainersReady", ready), ("Ready", ready)):
            text = "True" if value else "False"
            reason = done_reason if done_reason and ctype in ("ContainersReady", "Ready") else None
            if conditions.get(ctype, {}).get("status") != text or conditions.get(ctype, {}).get("reason") != reason:
                conditions[ctype] = {"type": ctype, "status": text, "lastProbeTime": None,
                                     "lastTransitionTime": conditions.get(ctype, {}).get("lastTransitionTime")
                                     if conditions.get(ctype, {}).get("status") == text else now}
                if reason:
                    conditions[ctype]["reason"] = reason
        restarted = exit_code is not None or last_state is not None
        patch = {
            "phase": phase or ("Running" if started or restarted else status.get("phase", "Pending")),
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}], "podIP": running.ip or "127.0.0.1",
            "podIPs": [{"ip": running.ip or "127.0.0.1"}], "startTime": status.get("startTime") or now,
            "containerStatuses": container_statuses, "conditions": list(conditions.values()),
        }
        await self.view.merge_patch(PODS, running.name, {"metadata": {"resourceVersion": pod["metadata"][
            "resourceVersion"]}, "status": patch}, running.namespace, subresource="status")

    # ------------------------------------------------------------------------------------------ memory, caches

    async def _serve_ledger(self) -> None:
        """The model servers' endpoint on 127.0.0.1: `POST /v1/pods/<uid>/(reserve|release)/(host|device)`."""
        app = aiohttp.web.Application()
        app.router.add_post("/v1/pods/{uid}/{operation:reserve|release}/{where:host|device}", self._ledger_request)
        self._ledger_runner = aiohttp.web.AppRunner(app, access_log=None, handle_signals=False)
        await self._ledger_runner.setup()
        site = aiohttp.web.TCPSite(self._ledger_runner, "127.0.0.1", self.ledger_port)
        await site.start()
        self.ledger_port = int(self._ledger_runner.addresses[0][1])

    async def _ledger_request(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        uid, operation, where = (request.match_info[k] for k in ("uid", "operation", "where"))
        holding = self.ledger.holdings.get(uid)
        if holding is None:
            return aiohttp.web.json_response({"reason": "NotFound", "message": f"no model server of pod uid {uid} "
                                                                               "runs on this node agent"}, status=404)
        if operation == "release":
            self.ledger.release(uid, where)
        elif where == "device":
            refused = self.ledger.reserve_device(uid)
            if refused is not None:
                return aiohttp.web.json_response({"reason": "DeviceMemory", "message": refused}, status=409)
        else:
            try:
                budget = await self._host_budget(holding.node)
            except ValueError as e:
                return aiohttp.web.json_response({"reason": "HostMemory", "message": str(e)}, status=409)
            if uid not in self.ledger.holdings:  # the pod stopped meanwhile
                return aiohttp.web.json_response({"reason": "NotFound", "message": f"pod uid {uid} stopped"},
                                                 status=404)
            refused = self.ledger.reserve_host(uid, budget)
            if refused is not None:
                return aiohttp.web.json_response({"reason": "HostMemory", "message": refused}, status=409)
        if where == "host":
            self._node_changed(holding.node)
        return aiohttp.web.json_response({})

    async def _cache_budget(self, node_name: str) -> int:
        """The disk budget of the node's model cache: its annotation, else its pool's modelCacheBytes; ValueError
        naming a bad annotation."""
        node = await self._node(node_name)
        text = (node["metadata"].get("annotations") or {}).get(ANNOTATION_MODEL_CACHE_BUDGET)
        if text is None:
            known = self.nodes.get(node_name)
            return known.model_cache_bytes if known is not None else DEFAULT_MODEL_CACHE_BYTES
        try:
            return parse_bytes(str(text))
        except QuantityError as e:
            raise ValueError(f"node {node_name}: annotation {ANNOTATION_MODEL_CACHE_BUDGET}: {e}") from None

    def _cached_start(self, running: _Running, pod: Obj, model: str) -> bool:
        """Whether a replica's start loads from its node's cache: the node holds the model and the Pod mounts the
        cache (`mounts_model_cache`). Held, the model counts as used either way."""
        if model not in self._cache.setdefault(running.node, set()):
            return False
        self._cache_use(running.node, model)
        return mounts_model_cache(pod)

    async def _cache_budget_or_none(self, node_name: str) -> int | None:
        """The cache's budget for a replica's start: None (its model is not kept) when the annotation is bad."""
        try:
            return await self._cache_budget(node_name)
        except ValueError as e:
            log.warning("node agent: %s", e)
            return None

    def _keep_loaded(self, running: _Running, model: str, model_bytes: int, budget: int | None) -> None:
        """A model a replica loaded stays in its node's cache, if it fits (evicting as a download does)."""
        cache = self._cache.setdefault(running.node, set())
        if model in cache or budget is None or self._make_room(running, model, model_bytes, budget) is not None:
            return
        cache.add(model)
        self._write_cached(running.node, model, model_bytes)
        self._cache_use(running.node, model, model_bytes)
        self._node_changed(running.node)

    def _cache_use(self, node: str, key: str, model_bytes: int = 0) -> None:
        """A use of a cached model (a replica's start, a download): the least recently used are evicted first."""
        self._cache_used.setdefault(node, {})[key] = next(self._uses)
        if model_bytes:
            sizes = self._cache_bytes.setdefault(node, {})
            sizes[key] = max(sizes.get(key, 0), model_bytes)

    def cache_held_bytes(self, node: str) -> int:
        """The bytes the node's model cache holds (downloads under way included)."""
        return sum(self._cache_bytes.get(node, {}).values())

    def _make_room(self, running: _Running, key: str, model_bytes: int, budget: int) -> str | None:
        """Evict the least recently used models of `running`'s node that no running replica there uses until
        `key` (`model_bytes`) fits the cache's `budget`: None when it fits (the evicted ones named in an Event on
        `running`'s Pod), else why it cannot (and nothing is evicted).

        E.g. budget 100 GB holding a (40 GB, used first), b (30 GB, a running replica's) and c (20 GB): a 45 GB
        download evicts a (10 + 40 + 45 > 100, then 50 + 45 <= 100), never b."""
        node = running.node
        cache = self._cache.setdefault(node, set())
        sizes = self._cache_bytes.setdefault(node, {})
        used_at = self._cache_used.setdefault(node, {})
        held = sum(size for k, size in sizes.items() if k != key)
        if held + model_bytes <= budget:
            return None
        busy = {r.model for r in self._running.values() if r.node == node and r.model and not r.stopping}
        # (an entry of unknown size, 0 bytes, frees nothing: it stays)
        evictable = sorted((k for k in cache if k != key and k not in busy and sizes.get(k, 0) > 0),
                           key=lambda k: (used_at.get(k, -1), k))
        evicted: list[str] = []
        for k in evictable:
            if held + model_bytes <= budget:
                break
            evicted.append(k)
            held -= sizes.get(k, 0)
        if held + model_bytes > budget:
            pinned = sorted(k for k in cache if k in busy)
            return (f"the model cache of node {node} cannot hold {key} ({format_bytes(model_bytes)}): its budget is "
                    f"{format_bytes(budget)} and {format_bytes(self.cache_held_bytes(node))} is held"
                    + (f", {', '.join(pinned)} by running replicas (never evicted)" if pinned else "")
                    + f" (set the Node's annotation {ANNOTATION_MODEL_CACHE_BUDGET} or the pool's modelCacheBytes)")
        freed = sum(sizes.get(k, 0) for k in evicted)
        for k in evicted:
            cache.discard(k)
            sizes.pop(k, None)
            used_at.pop(k, None)
            self._remove_cached(node, k)
        self._event(running, "ModelCacheEvicted", f"evicted {', '.join(evicted)} ({format_bytes(freed)}, least "
                                                  f"recently used) from the model cache of node {node} to fit {key} "
                                                  f"({format_bytes(model_bytes)}) in its {format_bytes(budget)}")
        self._node_changed(node)
        return None

    def _node_changed(self, node: str) -> None:
        self._dirty.add(node)
        self._publish_wake.set()
        self._report_wake.set()

    # ------------------------------------------------------------------------------------------ the nodes' disks

    def node_path(self, node: str, path: str) -> Path:
        """Where node `node`'s absolute `path` (a hostPath) is on this machine."""
        assert self.node_root is not None
        return self.node_root / node / path.lstrip("/")

    def node_cache_dir(self, node: str) -> Path:
        """The node's model cache directory (what the reporter scans)."""
        return self.node_path(node, self.model_cache_dir)

    def _key_dir(self, node: str, key: str) -> Path | None:
        """The model's directory in the node's cache; None for a key that would leave it (kubelet refuses such a
        subPath too)."""
        if key.startswith("/") or ".." in Path(key).parts:
            log.warning("node agent: cache key %r is no directory below the model cache; not on disk", key)
            return None
        return self.node_cache_dir(node) / key

    def _write_partial(self, node: str, key: str) -> None:
        """A download under way: the model's directory without the completion marker (and a stale marker gone,
        as the prefetch's script removes it first)."""
        directory = self._key_dir(node, key)
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        (directory / COMPLETE_MARKER).unlink(missing_ok=True)

    def _write_cached(self, node: str, key: str, model_bytes: int) -> None:
        """A complete download as `hf download` and the prefetch's script leave it: the weights (a sparse file of
        the model's bytes: the size is real, the disk is not used), then the completion marker naming the key."""
        directory = self._key_dir(node, key)
        if directory is None:
            return
        directory.mkdir(parents=True, exist_ok=True)
        weights = directory / "model.safetensors"
        with weights.open("ab") as f:
            f.truncate(max(model_bytes, 0))
        marker = directory / f"{COMPLETE_MARKER}.tmp"
        marker.write_text(json.dumps({"key": key}))
        marker.replace(directory / COMPLETE_MARKER)

    def _remove_cached(self, node: str, key: str) -> None:
        directory = self._key_dir(node, key)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    async def _report_caches(self, namespace: str) -> None:
        """The emulator's stand-in for the DaemonSet: the same reporter, one per node, run by the agent; each scan
        every `report_interval_s`, or at once after the agent changed a node's cache."""
        await self.registered.wait()
        for node in self.nodes:
            self._reporters[node] = Reporter(self.view, node, self.node_cache_dir(node), namespace)
        failed: dict[str, str] = {}  # node -> the last failure, logged once
        while True:
            self._report_wake.clear()
            for node, reporter in self._reporters.items():
                try:
                    await reporter.report_once()
                    failed.pop(node, None)
                except (KubeError, OSError) as e:
                    if failed.get(node) != str(e):
                        log.warning("node agent: model cache record of node %s not written: %s", node, e)
                    failed[node] = str(e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._report_wake.wait(), self.report_interval_s)

    def node_annotations(self, node: str) -> dict[str, str]:
        """What the agent publishes on `node`: its model cache and the host memory its sleeping replicas hold."""
        return {ANNOTATION_MODEL_CACHE: ",".join(sorted(self._cache.get(node, ()))),
                ANNOTATION_HOST_MEMORY_USED: str(self.ledger.host_used(node))}

    async def _publish_nodes(self) -> None:
        """Merge-patch each changed node's annotations (only what changed since the last write); retried after a
        failure, never stopping the agent."""
        await self.registered.wait()
        self._publish_wake.set()
        while True:
            await self._publish_wake.wait()
            self._publish_wake.clear()
            failed = False
            for node in sorted(self._dirty):
                want = self.node_annotations(node)
                if self._published.get(node) != want:
                    try:
                        await self.view.merge_patch(NODES, node, {"metadata": {"annotations": want}})
                    except KubeError as e:
                        if not e.not_found:  # a node that is not registered has nothing to publish on
                            log.warning("node agent: annotations of node %s not published: %s", node, e)
                            failed = True
                            continue
                    self._published[node] = want
                if self.node_annotations(node) == want:
                    self._dirty.discard(node)
            if failed:
                await asyncio.sleep(1.0)
                self._publish_wake.set()

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


def mounts_model_cache(pod: Obj) -> bool:
    """Whether the Pod's (first) container can read its node's model cache: it names its model's directory there
    (`INFER_CTL_MODEL_CACHE_DIR`) and mounts a hostPath volume or a PersistentVolumeClaim (policies'
    modelCacheVolume) at that directory or above it. (The claim's volume is not looked at: kube-scheduler placed
    the Pod only where it is bound and its node affinity matches; which directory it is, the agent's emulated
    cache does not model.)"""
    spec = pod.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    directory = next((str(e.get("value") or "") for e in container.get("env") or ()
                      if e.get("name") == ENV_MODEL_CACHE_DIR), "")
    if not directory:
        return False
    host_volumes = {v.get("name") for v in spec.get("volumes") or ()
                    if v.get("hostPath") or v.get("persistentVolumeClaim")}
    for mount in container.get("volumeMounts") or ():
        path = str(mount.get("mountPath") or "").rstrip("/")
        if mount.get("name") in host_volumes and path and (directory == path or directory.startswith(path + "/")):
            return True
    return False


def _model_bytes(annotations: Mapping[str, Any], *, required: bool, key: str = ANNOTATION_MODEL_BYTES) -> int:
    """The Pod's `infer-ctl.io/model-bytes` (or another byte count, `key`; 0 when absent and not required);
    ValueError naming the problem."""
    text = annotations.get(key)
    if text is None:
        if required:
            raise ValueError(f"annotation {key}: required (the model's size in bytes)")
        return 0
    try:
        return parse_bytes(str(text))
    except QuantityError as e:
        raise ValueError(f"annotation {key}: {e}") from None


def _device_memory(device: Mapping[str, Any]) -> int:
    """A ResourceSlice device's `memory` capacity in bytes (0 when it publishes none)."""
    value = (((device.get("capacity") or {}).get("memory")) or {}).get("value")
    try:
        return parse_bytes(str(value)) if value is not None else 0
    except QuantityError:
        return 0
