"""The sleeping tier end to end on the sandbox: real traffic through the front door (loadgen in its own process),
model servers that sleep and wake over HTTP (`infer_ctl.sandbox.modelserver`: weights moved at the node's
host-to-device bandwidth, memory accounted by the node agent), shared ResourceClaims as warm hosts, and the
controller's cycles in real time.

A service that may sleep (spec.scaling.prewarm.sleep) holds a pool of sleepers on a warm host; a burst wakes them,
the burst passes, and the replicas no longer needed awake go back to sleep where they are (the same Pods, not
removed and loaded again); the next burst wakes them again, serving in seconds where a cold start takes
COLD_START_S. A wake the warm host's device
refuses (409 DeviceMemory: another service's model woke onto it) falls back visibly: an Event, the decision's
message, `explain`, and a replica created in the same cycle.

The burst is run on both backends (the emulator, and the real control plane: kube-apiserver, kube-scheduler
allocating the shared claim, kube-controller-manager); the refused wake on the emulator only (what is under test
there is the controller's fallback against an agent that really refuses, not the API server's behaviour)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.actuate.manifests import ANNOTATION_ASLEEP, ANNOTATION_WARM_HOST, LABEL_WARM_HOST
from infer_ctl.controller.explain import explain
from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, PODS, RESOURCE_CLAIMS, KubeClient
from infer_ctl.sandbox.nodeagent import NodeAgent
from infer_ctl.sandbox.podnet import pod_endpoint
from infer_ctl.sandbox.router import INFLIGHT_METRIC, QUEUE_DEPTH_METRIC
from infer_ctl.sandbox.runtime import Sandbox
from tests.builders import InferenceServiceBuilder, completion
from tests.controller.conftest import ROOT, Cluster
from tests.controller.test_reconciler import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.cluster_file(Path(__file__).with_name("sleeping-cluster.yaml"))]

TARGET_RPS = 10.0  # per replica; a replica serves 20 req/s at most (2 slots of 100 ms)
COLD_START_S = 20.0
WINDOW_S = 45  # scale-down stabilization: the awake replicas, then the sleepers, are held this long
BURST_RPS = 35.0  # 4 replicas' worth


def sleepy_service(name: str, *, memory: str = "20Gi", max_replicas: int = 4, window_s: int = WINDOW_S, pool: int = 0
                   ) -> dict[str, Any]:
    """Its replicas take memory shares of the cluster's H100s (`Shared`): awake on a warm host too, several to a
    GPU (three of 20 GiB in an H100's 79.6 GiB), which is what makes a warm host worth a GPU."""
    return (InferenceServiceBuilder(name)
            .with_("spec.model", {"name": f"example/{name}", "memory": memory})
            .with_("spec.accelerator", {"products": ["H100-80GB"], "sharing": "Shared"})
            .with_("spec.scaling.maxReplicas", max_replicas)
            .with_("spec.scaling.targetRequestsPerReplica", TARGET_RPS)
            .with_("spec.scaling.scaleDownStabilizationSeconds", window_s)
            .with_("spec.scaling.forecast", {"enabled": False})
            .with_("spec.scaling.prewarm", {"sleep": True, "sleepingReplicas": pool})
            # the burst guard sizes for the requests waiting at the front door at once (not only for the rate the
            # serving replicas answer): a replica at its SLO holds 10 x 0.3 = 3 in flight
            .with_("spec.slo", {"latencyP95Ms": 300})
            .with_("spec.runtime.coldStartSeconds", COLD_START_S).build())


@dataclass
class Cycles:
    """The controller's cycles for some services, once a second in the background, with what each reported."""

    kube: KubeClient
    reconciler: Reconciler
    names: tuple[str, ...]
    history: list[tuple[float, str, dict[str, Any], str]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # the replicas the cycles removed, in order
    paused: set[str] = field(default_factory=set)  # services whose cycles are not run (their controller is away)
    started: float = field(default_factory=time.monotonic)
    _task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            for name in self.names:
                if name in self.paused:
                    continue
                body = self.kube.get(INFERENCE_SERVICES, name, "default")
                assert body is not None
                result = await self.reconciler.cycle(body, datetime.now(UTC))
                scaling: dict[str, Any] = next((c for c in result.status.get("conditions") or ()
                                                if c["type"] == "Scaling"), {})
                moves = {k: v for k, v in vars_of(result.actions).items() if v}
                self.removed.extend(result.actions.remove)
                self.history.append((time.monotonic() - self.started, name, result.status,
                                     f"{scaling.get('message', '')} {moves or ''}"))
            await asyncio.sleep(1.0)

    def __enter__(self) -> Cycles:
        self._task = asyncio.ensure_future(self.run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()

    def table(self, name: str) -> str:
        return "\n".join(f"{t:6.1f} s  {s.get('replicas')}  desired {s.get('desired')}  {m}"
                         for t, n, s, m in self.history if n == name)

    async def until(self, what: str, check: Callable[[], Any], timeout_s: float, name: str = "") -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._task is not None
            if self._task.done():
                self._task.result()  # a failed cycle fails the test with its error
            if value := check():
                return value
            await asyncio.sleep(0.2)
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}:\n{self.table(name)}")


def vars_of(actions: Any) -> dict[str, Any]:
    return {f: getattr(actions, f) for f in actions.__dataclass_fields__}


def pods(kube: KubeClient, service: str) -> list[dict[str, Any]]:
    return [p for p in kube.list(PODS, "default", label_selector=f"infer-ctl.io/service={service}")
            if not p["metadata"].get("deletionTimestamp")]


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def serving(kube: KubeClient, service: str) -> set[str]:
    return {p["metadata"]["name"] for p in pods(kube, service)
            if is_ready(p) and p["metadata"]["labels"].get("infer-ctl.io/role") == "serving"}


def asleep(kube: KubeClient, service: str) -> set[str]:
    """Replicas held asleep whose model server says it sleeps (a sleep lets the requests in flight finish first)."""
    out = set()
    with httpx.Client(timeout=2) as http:
        for p in pods(kube, service):
            annotations = p["metadata"].get("annotations") or {}
            if is_ready(p) and annotations.get(ANNOTATION_ASLEEP) == "true" and pod_endpoint(p) \
                    and http.get(f"http://{pod_endpoint(p)}/is_sleeping").json()["is_sleeping"]:
                out.add(p["metadata"]["name"])
    return out


def servers_asleep(kube: KubeClient, service: str, names: set[str]) -> set[str]:
    """Of `names`, the replicas whose model server says it sleeps, whatever their labels say."""
    out = set()
    with httpx.Client(timeout=2) as http:
        for p in pods(kube, service):
            address = pod_endpoint(p)
            if p["metadata"]["name"] in names and address and \
                    http.get(f"http://{address}/is_sleeping").json()["is_sleeping"]:
                out.add(p["metadata"]["name"])
    return out


def loadgen(url: str, shape: str, service: str) -> subprocess.Popen[bytes]:
    """Requests to `service`'s front door for its model (`sleepy_service`'s served name)."""
    return subprocess.Popen([sys.executable, "-m", "loadgen", f"{url}/v1/completions", "--body",
                             completion(f"example/{service}"),
                             "--shape", shape, "--no-progress", "--max-error-ratio", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(process: subprocess.Popen[bytes]) -> None:
    """At once (a graceful stop waits for the requests in flight, and the test's loop, cycles included, would wait)."""
    process.kill()
    process.wait()


def at_the_door(metrics_url: str, service: str) -> float:
    """Requests the front door holds or has forwarded and not yet answered for `service`."""
    text = httpx.get(metrics_url, timeout=2).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith((INFLIGHT_METRIC, QUEUE_DEPTH_METRIC)) and f'service="{service}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def front_door(kube: KubeClient, name: str) -> str:
    def url() -> str | None:
        meta = (kube.get(INFERENCE_SERVICES, name, "default") or {}).get("metadata", {})
        return (meta.get("annotations") or {}).get("sandbox.infer-ctl.io/url")

    return str(wait_for("front door", url))


def agent_of(cluster: Cluster) -> NodeAgent:
    sandbox = cluster.sandbox
    return sandbox.agent if isinstance(sandbox, Sandbox) else sandbox.side.agent


def setup(cluster: Cluster, *services: dict[str, Any]) -> tuple[KubeClient, Reconciler]:
    sandbox = cluster.sandbox
    agent = agent_of(cluster)
    agent.default_concurrency, agent.default_service_time_ms = 2, 100.0
    for svc in services:
        cluster.kube.create(INFERENCE_SERVICES, svc, "default")
    return cluster.kube, Reconciler(cluster.kube, Settings(cluster.policies,
                                                           gateway_metrics_url=sandbox.router.metrics_url))


async def held_asleep(cycles: Cycles, kube: KubeClient, name: str, url: str, sleepers: int) -> set[str]:
    """The service's pool of `sleepers` (spec.scaling.prewarm.sleepingReplicas) made on a warm host; a burst of
    BURST_RPS until it serves 4 (the sleepers woken among them); then a trickle until the sleepers are asleep
    again, where they were: the same Pods (a replica no longer needed awake sleeps where it is, not removed and
    loaded again). Their names."""
    await cycles.until("the first replica", lambda: serving(kube, name), 60, name)
    pool: set[str] = await cycles.until(f"{sleepers} sleepers", lambda: (s := asleep(kube, name))
                                        and len(s) >= sleepers and s, 3 * COLD_START_S + 30, name)
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(kube, name) if p["metadata"]["name"] in pool}
    burst = loadgen(url, f"{BURST_RPS:g}@300s", name)
    try:
        await cycles.until("4 serving for the burst, the sleepers among them",
                           lambda: len(s := serving(kube, name)) >= 4 and pool <= s, 90, name)
    finally:
        stop(burst)
    trickle = loadgen(url, "3@600s", name)
    try:
        await cycles.until("the sleepers asleep again", lambda: pool <= asleep(kube, name),
                           3 * WINDOW_S + 3 * COLD_START_S + 30, name)
    finally:
        stop(trickle)
    again = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(kube, name) if p["metadata"]["name"] in pool}
    assert again == uids, f"asleep again, not made again: {again} != {uids}\n{cycles.table(name)}"
    return pool


@pytest.mark.parametrize("cluster", ["emulator", "kube"], indirect=True)
async def test_a_burst_is_served_by_woken_sleepers_in_seconds_not_by_cold_starts(cluster: Cluster) -> None:
    kube, reconciler = setup(cluster, sleepy_service("nap", pool=2))
    url = front_door(kube, "nap")
    try:
        with Cycles(kube, reconciler, ("nap",)) as cycles:
            sleepers = await held_asleep(cycles, kube, "nap", url, sleepers=2)
            # the sleepers sit on one warm host: a shared claim (one H100 holds three 20 GiB shares awake)
            hosts = {str(p["metadata"]["annotations"][ANNOTATION_WARM_HOST]) for p in pods(kube, "nap")
                     if p["metadata"]["name"] in sleepers}
            assert len(hosts) == 1, hosts
            claim = kube.get(RESOURCE_CLAIMS, next(iter(hosts)), "default")
            assert claim is not None and claim["metadata"]["labels"][LABEL_WARM_HOST] == "true"
            assert sleepers <= {r["name"] for r in claim["status"]["reservedFor"]}
            # the next cycle's status counts them
            await cycles.until("status.replicas.sleeping", lambda: cycles.history[-1][2]["replicas"]["sleeping"]
                               >= len(sleepers), 10, "nap")

            burst = loadgen(url, f"{BURST_RPS:g}@60s", "nap")
            metrics_url = cluster.sandbox.router.metrics_url
            try:
                # the burst begins when requests wait at the front door (the loadgen process takes a while to start)
                await cycles.until("the burst at the front door", lambda: at_the_door(metrics_url, "nap") >= 3, 30,
                                   "nap")
                started = time.monotonic()
                # the sleepers when the burst arrives
                sleepers = asleep(kube, "nap")
                assert len(sleepers) >= 2, cycles.table("nap")
                uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(kube, "nap")
                        if p["metadata"]["name"] in sleepers}
                # and the window may let one go in the very cycle that first sees the burst (its rate still one
                # replica's worth): its name may then be taken by a new replica, so only the ones kept count
                mark = len(cycles.removed)

                def kept() -> set[str]:
                    return sleepers - set(cycles.removed[mark:])

                woken = await cycles.until("the sleepers serving", lambda: (s := serving(kube, "nap")) and
                                           kept() <= s and s, 30, "nap")
                took = time.monotonic() - started
                sleepers = kept()
                uids = {n: u for n, u in uids.items() if n in sleepers}
                assert sleepers, f"every sleeper was let go as the burst came:\n{cycles.table('nap')}"
                # and they stay awake: the cycle that woke them, and the next ones, do not put them back to sleep
                # (the cycle that woke them once did, from the Pods it had read before the wake: serving replicas
                # whose model slept, every request refused)
                seen = len(cycles.history)
                await cycles.until("two more cycles", lambda: len(cycles.history) >= seen + 2, 30, "nap")
                relapsed = servers_asleep(kube, "nap", sleepers)
                assert not relapsed, f"woken sleepers asleep again while serving: {sorted(relapsed)}"
            finally:
                stop(burst)
    finally:
        await reconciler.close()
    table = cycles.table("nap")
    assert sleepers <= woken, f"the sleepers {sorted(sleepers)} were not woken ({sorted(woken)}):\n{table}"
    # woken, not made again: the Pods serving under the sleepers' names are the sleepers' own
    now_serving = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(kube, "nap")
                   if p["metadata"]["name"] in sleepers}
    assert now_serving == uids, f"replicas made again for the burst: {now_serving} != {uids}\n{table}"
    # a cycle sees the burst in its scrape (a second or two), the wake moves 21.5 GB at 12 GB/s (1.8 s), and
    # the front door sees the serving label: seconds, where a new replica would take the cold start
    assert took < COLD_START_S / 2, f"{took:.1f} s from the burst to the sleepers serving:\n{table}"
    print(f"\nfrom the burst to {len(sleepers)} woken sleepers serving: {took:.1f} s (cold start {COLD_START_S:g} s)")
    # through two sleeps and a wake under load, no request reached a sleeping engine (each left routing first)
    assert not agent_of(cluster).asleep_requests, dict(agent_of(cluster).asleep_requests)


@pytest.mark.parametrize("cluster", ["emulator", "kube"], indirect=True)
async def test_a_fixed_sleeping_pool_takes_a_burst_nobody_forecast(cluster: Cluster) -> None:
    """spec.scaling.prewarm.sleepingReplicas: the sleepers are held from the start, with no burst before to
    remember (the window's tier would hold none): the first, unannounced burst wakes them in seconds."""
    svc = sleepy_service("pool")
    svc["spec"]["scaling"]["prewarm"] = {"sleep": True, "sleepingReplicas": 2}
    kube, reconciler = setup(cluster, svc)
    url = front_door(kube, "pool")
    try:
        with Cycles(kube, reconciler, ("pool",)) as cycles:
            await cycles.until("the first replica", lambda: serving(kube, "pool"), 60, "pool")
            sleepers = await cycles.until("2 sleepers", lambda: (s := asleep(kube, "pool")) and len(s) >= 2 and s,
                                          3 * COLD_START_S + 30, "pool")
            assert len(serving(kube, "pool")) == 1, cycles.table("pool")  # nothing awake beyond the need
            uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(kube, "pool")
                    if p["metadata"]["name"] in sleepers}
            burst = loadgen(url, f"{BURST_RPS:g}@60s", "pool")
            try:
                await cycles.until("the burst at the front door",
                                   lambda: at_the_door(cluster.sandbox.router.metrics_url, "pool") >= 3, 30, "pool")
                started = time.monotonic()
                await cycles.until("the sleepers serving", lambda: sleepers <= serving(kube, "pool"), 30, "pool")
                took = time.monotonic() - started
            finally:
                stop(burst)
    finally:
        await reconciler.close()
    table = cycles.table("pool")
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(kube, "pool")
            if p["metadata"]["name"] in sleepers} == uids, f"woken, not made again:\n{table}"
    assert took < COLD_START_S / 2, f"{took:.1f} s from the burst to the sleepers serving:\n{table}"
    print(f"\nan unannounced burst to {len(sleepers)} woken sleepers of the pool serving: {took:.1f} s "
          f"(cold start {COLD_START_S:g} s)")


@pytest.mark.parametrize("cluster", ["emulator"], indirect=True)
async def test_a_wake_the_warm_host_refuses_falls_back_to_a_new_replica_visibly(cluster: Cluster) -> None:
    # Two services with large models on memory shares and a pool of one sleeper each: big's 35 GiB (two fit awake
    # on an H100's 79.6 GiB: its sleeper gets a warm host of its own making) and other's 45 GiB (one fits: it makes
    # no warm host, and its sleeper joins big's). Each could wake there while the other sleeps. The other service's
    # sleeper is woken behind the controller's back, so that 34.6 GiB are left when the controller wakes big's:
    # the agent refuses (409 DeviceMemory).
    kube, reconciler = setup(cluster, sleepy_service("big", memory="35Gi", max_replicas=2, pool=1),
                             sleepy_service("other", memory="45Gi", max_replicas=2, pool=1))
    url = front_door(kube, "big")
    try:
        with Cycles(kube, reconciler, ("big", "other")) as cycles:
            await cycles.until("first replicas", lambda: serving(kube, "big") and serving(kube, "other"), 60)
            await cycles.until("a sleeper each", lambda: asleep(kube, "big") and asleep(kube, "other"),
                               3 * COLD_START_S + 60, "big")
            (mine,) = asleep(kube, "big")
            (theirs,) = asleep(kube, "other")
            by_name = {p["metadata"]["name"]: p for p in pods(kube, "big") + pods(kube, "other")}
            host = by_name[mine]["metadata"]["annotations"][ANNOTATION_WARM_HOST]
            assert by_name[theirs]["metadata"]["annotations"][ANNOTATION_WARM_HOST] == host
            # from here only big's cycles run: other's would put its woken replica back to sleep (it has no load
            # beyond its one replica), freeing the memory before big's burst is seen, and the wake would not be
            # refused
            cycles.paused.add("other")
            async with httpx.AsyncClient(timeout=10) as http:
                address = pod_endpoint(by_name[theirs])
                assert (await http.post(f"http://{address}/wake_up")).status_code == 200
            before = {p["metadata"]["uid"] for p in pods(kube, "big")}
            burst = loadgen(url, "18@60s", "big")
            try:
                await cycles.until("2 serving for big", lambda: len(serving(kube, "big")) >= 2, 60, "big")
            finally:
                stop(burst)
    finally:
        await reconciler.close()
    table = cycles.table("big")
    created = {p["metadata"]["name"] for p in pods(kube, "big") if p["metadata"]["uid"] not in before}
    assert created and mine not in serving(kube, "big"), table
    notes = [str(e.get("note") or e.get("message") or "") for e in kube.list(EVENTS, "default")
             if e.get("reason") == "WakeRefused"]
    assert len(notes) == 1 and mine in notes[0] and "DeviceMemory" in notes[0], notes
    # the refusal in the engine's own words: vLLM's failed wake (500), its message from the device's ledger
    assert any(f"the wake of {mine} was refused (HTTP 500: CUDA out of memory while waking up: DeviceMemory" in m
               and "created instead" in m
               for _, n, _, m in cycles.history if n == "big"), table
    findings = explain(kube, cluster.policies, "default", "big")
    assert any(f.subject == mine and "DeviceMemory" in f.message for f in findings), findings


async def test_the_sleeping_example_holds_stock_vllm_replicas_asleep_through_their_own_sleep_mode(
        cluster: Cluster) -> None:
    """deploy/examples/sleeping-vllm.yaml as shipped (its cold start shortened): its sleepers run stock vLLM with
    dev mode and --enable-sleep-mode, which only the Pod template gives them, and their servers say they sleep."""
    body = yaml.safe_load((ROOT / "deploy/examples/sleeping-vllm.yaml").read_text())
    body["spec"]["runtime"]["coldStartSeconds"] = 2
    kube, reconciler = setup(cluster, body)
    name = body["metadata"]["name"]
    try:
        with Cycles(kube, reconciler, (name,)) as cycles:
            sleepers = await cycles.until("2 sleepers asleep", lambda: (s := asleep(kube, name)) and len(s) >= 2
                                          and s, 60, name)
            await cycles.until("1 serving", lambda: serving(kube, name), 30, name)
    finally:
        await reconciler.close()
    for pod in pods(kube, name):
        if pod["metadata"]["name"] in sleepers:
            (container,) = pod["spec"]["containers"]
            assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in container["env"]
            assert "--enable-sleep-mode" in container["args"]
