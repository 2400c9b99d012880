"""The warm pool end to end on the sandbox (`warmPoolGPUs`): a latency-critical service whose replica takes an
H100 whole (`chat`: one awake, a pool of two sleepers) and no other service lends it GPUs. With a warm pool of two,
the controller makes two warm hosts (shared claims of a whole GPU each) and puts one of chat's sleepers on each;
an unannounced burst wakes them in seconds, and once it has passed they go back to sleep there (not made again,
no new host). Without the pool (the default) chat holds no sleeper: a host made for one whole-GPU replica would
cost what a standby does.

Real traffic through the front door, model servers that sleep and wake over HTTP with the node agent's device
and host memory ledgers, the controller's cycles in real time; on the emulator and on the real control plane
(kube-scheduler allocating the shared claims)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest

from infer_ctl.actuate.manifests import ANNOTATION_WARM_HOST
from infer_ctl.controller.explain import explain
from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.kube.client import INFERENCE_SERVICES, KubeClient
from infer_ctl.sandbox.runtime import Sandbox
from tests.controller.conftest import Cluster
from tests.controller.test_sleeping import Cycles, asleep, at_the_door, front_door, loadgen, pods, serving, stop
from tests.controller.test_yield import COLD_START_S, service, uids

pytestmark = [pytest.mark.slow, pytest.mark.cluster_file(Path(__file__).with_name("yield-cluster.yaml"))]


def hosts_of(kube: KubeClient, names: set[str]) -> set[str]:
    return {p["metadata"]["annotations"].get(ANNOTATION_WARM_HOST, "") for p in pods(kube, "chat")
            if p["metadata"]["name"] in names}


@pytest.mark.parametrize("cluster", ["emulator", "kube"], indirect=True)
async def test_a_burst_wakes_sleepers_on_the_warm_pool_s_gpus_and_they_sleep_there_again(cluster: Cluster) -> None:
    chat = service("chat", "20Gi", minReplicas=1, maxReplicas=3, prewarm={"sleep": True, "sleepingReplicas": 2},
                   scaleDownStabilizationSeconds=20)
    chat["spec"]["slo"] = {"latencyP95Ms": 300}
    sandbox = cluster.sandbox
    agent = sandbox.agent if isinstance(sandbox, Sandbox) else sandbox.side.agent
    agent.default_concurrency, agent.default_service_time_ms = 2, 100.0
    kube = cluster.kube
    kube.create(INFERENCE_SERVICES, chat, "default")
    policies = replace(cluster.policies, scaling=replace(cluster.policies.scaling, warm_pool_gpus=2))
    reconciler = Reconciler(kube, Settings(policies, gateway_metrics_url=sandbox.router.metrics_url))
    url = front_door(kube, "chat")
    try:
        with Cycles(kube, reconciler, ("chat",)) as cycles:
            sleepers = await cycles.until("chat's 2 sleepers", lambda: (s := asleep(kube, "chat")) and len(s) == 2
                                          and s, 3 * COLD_START_S + 30, "chat")
            warm = hosts_of(kube, sleepers)
            assert len(warm) == 2 and "" not in warm, warm  # one sleeper on each of the pool's two hosts
            said = {f.subject: f.message for f in explain(kube, policies, "default", "chat") if f.layer == "sleeping"}
            assert set(said) == sleepers and all("woken only for load already here" in m for m in said.values()), said
            awake = serving(kube, "chat")
            assert len(awake) == 1 and hosts_of(kube, awake) == {""}, awake  # the awake one on a GPU of its own
            before = uids(kube, "chat", sleepers)

            burst = loadgen(url, "28@60s", "chat")  # 3 replicas' worth
            try:
                await cycles.until("the burst at the front door",
                                   lambda: at_the_door(sandbox.router.metrics_url, "chat") >= 3, 30, "chat")
                started = time.monotonic()
                await cycles.until("chat's sleepers serving", lambda: sleepers <= serving(kube, "chat"), 30, "chat")
                took = time.monotonic() - started
            finally:
                stop(burst)
            # the burst has passed: the woken replicas sleep on the pool's hosts again
            await cycles.until("chat's sleepers back", lambda: asleep(kube, "chat") == sleepers,
                               60 + 2 * COLD_START_S, "chat")
            after = uids(kube, "chat", sleepers)
            assert hosts_of(kube, sleepers) == warm
            assert len(serving(kube, "chat")) == 1
    finally:
        await reconciler.close()
    table = cycles.table("chat")
    assert after == before, f"chat's sleepers made again:\n{table}"
    assert took < COLD_START_S, f"{took:.1f} s from the burst to chat's sleepers serving:\n{table}"
    print(f"\nfrom chat's burst to its 2 sleepers serving on the warm pool's GPUs: {took:.1f} s "
          f"(cold start {COLD_START_S:g} s)")


@pytest.mark.parametrize("cluster", ["emulator"], indirect=True)
async def test_without_a_warm_pool_a_whole_gpu_service_holds_no_sleeper(cluster: Cluster) -> None:
    chat = service("chat", "20Gi", minReplicas=1, maxReplicas=3, prewarm={"sleep": True, "sleepingReplicas": 2})
    kube = cluster.kube
    kube.create(INFERENCE_SERVICES, chat, "default")
    reconciler = Reconciler(kube, Settings(cluster.policies, gateway_metrics_url=cluster.sandbox.router.metrics_url))
    try:
        with Cycles(kube, reconciler, ("chat",)) as cycles:
            await cycles.until("chat serving", lambda: serving(kube, "chat"), 3 * COLD_START_S + 30, "chat")
            await asyncio.sleep(5)  # cycles once a second
            assert not asleep(kube, "chat") and len(pods(kube, "chat")) == 1, cycles.table("chat")
    finally:
        await reconciler.close()


@pytest.mark.parametrize("cluster", ["emulator", "kube"], indirect=True)
async def test_one_pool_host_holds_two_services_sleepers_and_the_first_burst_takes_it(cluster: Cluster) -> None:
    # two whole-GPU services, one awake each, a pool of one: both services' sleepers wait on the one pool host;
    # a burst of `a` wakes its sleeper there, and `b`'s sleeper is then told to wait for that GPU
    a = service("a", "20Gi", minReplicas=1, maxReplicas=2, prewarm={"sleep": True, "sleepingReplicas": 1})
    b = service("b", "20Gi", minReplicas=1, maxReplicas=2, prewarm={"sleep": True, "sleepingReplicas": 1})
    a["spec"]["slo"] = {"latencyP95Ms": 300}
    sandbox = cluster.sandbox
    agent = sandbox.agent if isinstance(sandbox, Sandbox) else sandbox.side.agent
    agent.default_concurrency, agent.default_service_time_ms = 2, 100.0
    kube = cluster.kube
    for svc in (a, b):
        kube.create(INFERENCE_SERVICES, svc, "default")
    policies = replace(cluster.policies, scaling=replace(cluster.policies.scaling, warm_pool_gpus=1))
    reconciler = Reconciler(kube, Settings(policies, gateway_metrics_url=sandbox.router.metrics_url))
    url = front_door(kube, "a")
    try:
        with Cycles(kube, reconciler, ("a", "b")) as cycles:
            slept_a = await cycles.until("a's sleeper", lambda: asleep(kube, "a"), 3 * COLD_START_S + 30, "a")
            slept_b = await cycles.until("b's sleeper", lambda: asleep(kube, "b"), 3 * COLD_START_S + 30, "b")
            both = pods(kube, "a") + pods(kube, "b")
            host = {p["metadata"]["annotations"].get(ANNOTATION_WARM_HOST, "") for p in both
                    if p["metadata"]["name"] in slept_a | slept_b}
            assert len(host) == 1 and "" not in host, host  # the pool's one host, shared
            burst = loadgen(url, "18@60s", "a")  # 2 replicas' worth of a
            try:
                await cycles.until("a's sleeper serving", lambda: slept_a <= serving(kube, "a"), 30, "a")
                said = {f.subject: f.message for f in explain(kube, policies, "default", "b") if f.layer == "sleeping"}
                assert set(said) == slept_b, (said, cycles.table("b"))  # kept: it wakes once a sleeps
                assert all("(of a) holds awake now" in m for m in said.values()), said
                assert asleep(kube, "b") == slept_b  # not woken: the GPU is a's now
            finally:
                stop(burst)
    finally:
        await reconciler.close()
