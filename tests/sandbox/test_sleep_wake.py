"""Warm tiers in the sandbox, for real: the node
agent's memory ledger on a shared ResourceClaim and a node's host-memory budget, prefetch into a node's model
cache, the annotations the agent publishes on its Nodes, and the front door holding requests for a replica.

Model sizes are small and bandwidths high, so that each move takes a fraction of a second and its duration is
still measurable against bytes / bandwidth."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.actuate.manifests import ENV_MODEL_CACHE_DIR, MODEL_CACHE_DIR, MODEL_CACHE_VOLUME
from infer_ctl.config.cluster import parse_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.kube.labels import (
    ANNOTATION_CACHE_KEY,
    ANNOTATION_H2D_GBPS,
    ANNOTATION_HOST_MEMORY_BYTES,
    ANNOTATION_HOST_MEMORY_USED,
    ANNOTATION_MODEL_BYTES,
    ANNOTATION_MODEL_CACHE,
    ANNOTATION_NETWORK_GBPS,
)
from infer_ctl.sandbox.podnet import pod_endpoint
from infer_ctl.sandbox.router import ANNOTATION_URL
from infer_ctl.sandbox.runtime import Sandbox
from infer_ctl.sandbox.store import Event, Obj
from infer_ctl.sandbox.testing import pod

ROOT = Path(__file__).resolve().parents[2]
CATALOG = load_policies(ROOT / "policies").catalog
GB = 10**9
REQUEST = {"model": "model", "prompt": "hi"}  # the replicas serve vLLM's `model`
L4_MEMORY = 23034 * 2**20  # the catalog's L4: 24.2 GB, so one 16 GB model fits awake and two do not
pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------------------ one model server


def sample(metrics: str, name: str) -> float:
    """The value of the one series `name` (any labels) in a Prometheus text exposition."""
    values = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if re.match(rf"{re.escape(name)}(\{{|\s)", line)]
    assert len(values) == 1, (name, values)
    return values[0]


async def timed(call: Any) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = await call
    return response, time.perf_counter() - started


# The stand-in alone (sleep and wake, modes, requests while asleep, disconnects) is tested against vLLM's
# interface in test_standin_vllm.py and test_standin_sglang.py; what follows runs it under the node agent.


def tiny_cluster(**l4: Any) -> Any:
    doc = {"apiVersion": "sandbox.infer-ctl.io/v1alpha1", "kind": "SandboxCluster", "metadata": {"name": "t"},
           "spec": {"nodePools": [{"name": "l4", "count": 1, "accelerator": "L4", "gpus": 1, "cpu": "16",
                                   "memory": "64Gi", "modelCache": ["cached-model"], **l4}]}}
    return parse_cluster(doc, CATALOG)


@asynccontextmanager
async def sandbox(**l4: Any) -> AsyncIterator[Sandbox]:
    running = Sandbox(tiny_cluster(**l4), CATALOG)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def create(box: Sandbox, obj: dict[str, Any], namespace: str | None = "default") -> Obj:
    rt = box.store.type_for_kind(obj.get("apiVersion", "v1"), obj.get("kind", "Pod"))
    created, _ = box.store.create(rt, namespace, obj, validate=True)
    return created


def get(box: Sandbox, kind: str, name: str, namespace: str | None = "default") -> Obj | None:
    group, version = {"Pod": ("", "v1"), "Node": ("", "v1"), "ResourceClaim": ("resource.k8s.io", "v1")}[kind]
    return box.store.find(box.store.type(group, version, kind.lower() + "s"), namespace, name)


async def until(box: Sandbox, predicate: Callable[[], Any], timeout_s: float = 10, what: str = "") -> Any:
    """Wait (bounded) until `predicate()` is truthy, checking again on every change of the store."""
    woken = asyncio.Event()

    def on_event(_: Event) -> None:
        woken.set()

    box.store.subscribe(on_event)
    try:
        async with asyncio.timeout(timeout_s):
            while not (value := predicate()):
                woken.clear()
                await woken.wait()
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what or predicate}") from None
    return value


def is_ready(obj: Obj | None) -> bool:
    return obj is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                   for c in (obj.get("status") or {}).get("conditions") or [])


def ready_pod(box: Sandbox, name: str) -> Callable[[], Obj | None]:
    return lambda: ((p := get(box, "Pod", name)) is not None and is_ready(p) and p) or None


def endpoint(box: Sandbox, name: str) -> str:
    """The replica's podIP:port, as the front door names the endpoint that answered."""
    found = get(box, "Pod", name)
    assert found is not None
    return str(pod_endpoint(found))


def address(pod_obj: Obj) -> str:
    return f"http://{pod_endpoint(pod_obj)}"


def replica(name: str, *, claim: str | None = None, model_bytes: int = 16 * GB,
            cache_key: str = "llm-16g", cold_start_s: float = 0.2, **spec: Any) -> dict[str, Any]:
    """A vLLM replica with sleep mode on (it loads on its device, as every engine does: none starts asleep)."""
    body = pod(name, labels={"infer-ctl.io/service": "llm", "infer-ctl.io/role": "standby"},
               claims={"gpu": claim} if claim else None,
               tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
               nodeSelector={"sandbox.infer-ctl.io/pool": "l4"}, terminationGracePeriodSeconds=1,
               args=("model", "--enable-sleep-mode"), **spec)
    body["spec"]["containers"][0]["env"] = [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}]  # the sleep routes
    body["metadata"]["annotations"] = {
        "sandbox.infer-ctl.io/cold-start-seconds": str(cold_start_s), "sandbox.infer-ctl.io/service-time-ms": "5",
        ANNOTATION_CACHE_KEY: cache_key, ANNOTATION_MODEL_BYTES: str(model_bytes),
        ANNOTATION_H2D_GBPS: "200", "sandbox.infer-ctl.io/d2h-gbps": "200"}
    return body


async def loaded_asleep(box: Sandbox, http: httpx.AsyncClient, name: str) -> Obj:
    """Wait until the replica is ready (loaded on its device), then put it to sleep, as the controller does."""
    ready = await until(box, ready_pod(box, name), what=f"{name} loaded")
    assert (await http.post(f"{address(ready)}/sleep", params={"level": "1"})).status_code == 200
    return ready


def shared_claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}


def container(pod_obj: Obj) -> dict[str, Any]:
    statuses = (pod_obj.get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


async def test_a_wake_is_refused_while_another_awake_model_fills_the_device_of_their_shared_claim() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=10) as http:
        create(box, shared_claim("warm-host"))
        # one after the other: each loads on the device (16 of its 24 GB) before it sleeps
        create(box, replica("a", claim="warm-host"))
        a = await loaded_asleep(box, http, "a")
        create(box, replica("b", claim="warm-host"))
        b = await loaded_asleep(box, http, "b")
        # The emulator's scheduler put both on the one device of the claim, reserved for both.
        claim = get(box, "ResourceClaim", "warm-host")
        assert claim is not None
        assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["a", "b"]
        assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == ["gpu-0"]
        assert a["spec"]["nodeName"] == b["spec"]["nodeName"] == "l4-0"

        assert (await http.post(f"{address(a)}/wake_up")).status_code == 200
        refused = await http.post(f"{address(b)}/wake_up")
        assert refused.status_code == 500  # as vLLM answers a wake that fails, its error JSON saying why
        message = refused.json()["error"]["message"]
        assert "out of memory" in message and "gpu.nvidia.com/l4-0/gpu-0" in message and "default/a" in message
        assert (await http.get(f"{address(b)}/is_sleeping")).json() == {"is_sleeping": True}
        # a request sent to a sleeping engine (vLLM >= 0.16 holds it until a wake) is on the agent's record
        assert not box.agent.asleep_requests
        with pytest.raises(httpx.TimeoutException):
            await http.post(f"{address(b)}/v1/completions", json=REQUEST, timeout=0.5)
        assert box.agent.asleep_requests == {("default", "b"): 1}

        assert (await http.post(f"{address(a)}/sleep", params={"level": "1"})).status_code == 200
        assert (await http.post(f"{address(b)}/wake_up")).status_code == 200  # the device is free again
        served = await http.post(f"{address(b)}/v1/completions", json=REQUEST)
        assert served.status_code == 200
        assert box.agent.ledger.device_used("gpu.nvidia.com/l4-0/gpu-0") == 16 * GB
        assert box.agent.ledger.host_used("l4-0") == 16 * GB  # a, asleep


async def test_a_start_on_a_device_another_awake_model_fills_exits_out_of_memory_and_restarts_once_it_fits() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=10) as http:
        create(box, shared_claim("warm-host"))
        create(box, replica("first", claim="warm-host"))
        first = await until(box, ready_pod(box, "first"), what="first loaded")

        create(box, replica("never", claim="warm-host", restartPolicy="Never"))
        failed = await until(box, lambda: (p := get(box, "Pod", "never")) and p["status"].get("phase") == "Failed"
                             and p, what="never Failed")
        terminated = container(failed)["state"]["terminated"]
        assert (terminated["reason"], terminated["exitCode"]) == ("Error", 1)
        assert "CUDA out of memory" in terminated["message"] and "default/first" in terminated["message"]

        create(box, replica("again", claim="warm-host"))
        looping = await until(box, lambda: (p := get(box, "Pod", "again")) and
                              container(p).get("lastState", {}).get("terminated") and p, what="again restarting")
        status = container(looping)
        assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff" and status["restartCount"] >= 1
        assert looping["status"]["phase"] == "Running"

        assert (await http.post(f"{address(first)}/sleep", params={"level": "1"})).status_code == 200
        await until(box, ready_pod(box, "again"), timeout_s=15, what="again loaded once first slept")


async def test_a_sleep_over_the_nodes_host_memory_budget_is_refused_and_the_replica_stays_awake() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=10) as http:
        box.store.patch(box.store.type("", "v1", "nodes"), None, "l4-0", "application/merge-patch+json",
                        {"metadata": {"annotations": {ANNOTATION_HOST_MEMORY_BYTES: str(20 * GB)}}})
        create(box, shared_claim("warm-host"))
        create(box, replica("first", claim="warm-host"))
        await loaded_asleep(box, http, "first")
        await until(box, lambda: (n := get(box, "Node", "l4-0", None)) and (n["metadata"].get("annotations") or {})
                    .get(ANNOTATION_HOST_MEMORY_USED) == str(16 * GB), what="host memory published")
        create(box, replica("second", claim="warm-host"))
        second = await until(box, ready_pod(box, "second"), what="second loaded")
        refused = await http.post(f"{address(second)}/sleep", params={"level": "1"})
        assert refused.status_code == 500, refused.text  # vLLM's answer to a sleep that fails
        assert "host memory of node l4-0" in refused.json()["error"]["message"]
        assert (await http.get(f"{address(second)}/is_sleeping")).json() == {"is_sleeping": False}
        served = await http.post(f"{address(second)}/v1/completions", json=REQUEST)
        assert served.status_code == 200


async def test_a_prefetch_pod_fills_the_nodes_cache_and_the_next_start_there_is_warm() -> None:
    async with sandbox() as box:
        await until(box, lambda: (n := get(box, "Node", "l4-0", None)) and (n["metadata"].get("annotations") or {})
                    .get(ANNOTATION_MODEL_CACHE) == "cached-model", what="the cluster file's cache published")
        prefetch = pod("fetch-llm", labels={"infer-ctl.io/role": "prefetch"}, node_name="l4-0", restartPolicy="Never")
        prefetch["metadata"]["annotations"] = {ANNOTATION_CACHE_KEY: "llm-16g", ANNOTATION_MODEL_BYTES: str(GB),
                                               ANNOTATION_NETWORK_GBPS: "5"}  # 0.2 s
        started = time.perf_counter()
        create(box, prefetch)
        done = await until(box, lambda: (p := get(box, "Pod", "fetch-llm")) and
                           p["status"].get("phase") == "Succeeded" and p, what="the prefetch Succeeded")
        assert time.perf_counter() - started >= 0.2
        terminated = container(done)["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
        node = await until(box, lambda: (n := get(box, "Node", "l4-0", None)) and "llm-16g" in (
            n["metadata"].get("annotations") or {}).get(ANNOTATION_MODEL_CACHE, "") and n, what="cache published")
        assert node["metadata"]["annotations"][ANNOTATION_MODEL_CACHE] == "cached-model,llm-16g"

        # Cold start 30 s, warm start 0.2 s: only a warm start (the node holds the model and the Pod mounts the
        # node's cache, as the controller's replicas do) is ready within the 5 s waited for.
        warm = replica("warm", cold_start_s=30, asleep=False)
        warm["metadata"]["annotations"]["sandbox.infer-ctl.io/warm-start-seconds"] = "0.2"
        main = warm["spec"]["containers"][0]
        main["env"] = [{"name": ENV_MODEL_CACHE_DIR, "value": f"{MODEL_CACHE_DIR}/llm-16g"}]
        main["volumeMounts"] = [{"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_DIR, "readOnly": True}]
        warm["spec"]["volumes"] = [{"name": MODEL_CACHE_VOLUME, "hostPath": {"path": MODEL_CACHE_DIR}}]
        create(box, warm)
        await until(box, ready_pod(box, "warm"), timeout_s=5, what="a warm start")


async def test_node_annotations_are_patched_only_when_what_they_say_changes() -> None:
    async with sandbox() as box:
        patches: list[dict[str, str]] = []

        def on_event(event: Event) -> None:
            if event.key == ("", "nodes") and event.type == "MODIFIED":
                patches.append(dict(event.obj["metadata"].get("annotations") or {}))

        await until(box, lambda: (n := get(box, "Node", "l4-0", None)) and
                    ANNOTATION_HOST_MEMORY_USED in (n["metadata"].get("annotations") or {}), what="first publish")
        box.store.subscribe(on_event)
        # A model of no declared size, cached already: starting, waking and sleeping it changes nothing published.
        quiet = replica("quiet", cache_key="cached-model", model_bytes=0)
        create(box, quiet)
        ready = await until(box, ready_pod(box, "quiet"), what="quiet ready")
        async with httpx.AsyncClient(timeout=10) as http:
            assert (await http.post(f"{address(ready)}/sleep")).status_code == 200
            assert (await http.post(f"{address(ready)}/wake_up")).status_code == 200
            create(box, replica("sized", cache_key="cached-model", model_bytes=GB))
            await loaded_asleep(box, http, "sized")
        await until(box, lambda: patches, what="a patch for the sized sleeper")
        assert patches[0][ANNOTATION_HOST_MEMORY_USED] == str(GB)
        assert patches[0][ANNOTATION_MODEL_CACHE] == "cached-model"
        await asyncio.sleep(0.3)
        assert len(patches) == 1, patches


async def test_a_bad_model_bytes_annotation_is_a_config_error_naming_it() -> None:
    async with sandbox() as box:
        bad = replica("bad")
        bad["metadata"]["annotations"][ANNOTATION_MODEL_BYTES] = "lots"
        create(box, bad)
        waiting = await until(box, lambda: (p := get(box, "Pod", "bad")) and
                              container(p).get("state", {}).get("waiting") and p, what="a config error")
        state = container(waiting)["state"]["waiting"]
        assert state["reason"] == "CreateContainerConfigError"
        assert state["message"].startswith(f"annotation {ANNOTATION_MODEL_BYTES}: ") and "lots" in state["message"]


# ------------------------------------------------------------------------------------------ the front door


async def install_service(box: Sandbox, name: str, *, scale_to_zero: bool = False) -> str:
    """The InferenceService CRD and one service (that scales to zero, if asked); the URL of its front door."""
    crd = yaml.safe_load((ROOT / "crds/inferenceservice.yaml").read_text())
    rt = box.store.type("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    if box.store.find(rt, None, crd["metadata"]["name"]) is None:
        box.store.create(rt, None, crd)
    manifest = next(d for d in yaml.safe_load_all((ROOT / "deploy/examples/llm-8b.yaml").read_text())
                    if d and d.get("kind") == "InferenceService")
    manifest["metadata"].update(name=name, namespace="default")
    if scale_to_zero:
        manifest["spec"]["scaling"].update(minReplicas=0, scaleToZero={"enabled": True})
    create(box, manifest)
    service_rt = box.store.type_for_kind(manifest["apiVersion"], "InferenceService")
    found = await until(box, lambda: (s := box.store.find(service_rt, "default", name)) and
                        (s["metadata"].get("annotations") or {}).get(ANNOTATION_URL), what="the front door")
    return str(found)


def gateway(box: Sandbox, text: str, name: str, service: str) -> float:
    return sample("\n".join(line for line in text.splitlines() if f'service="{service}"' in line), name)


async def test_the_front_door_holds_requests_until_a_replica_is_ready_and_refuses_at_once_without_any() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=10) as http:
        box.router.hold_s = 5.0
        url = await install_service(box, "llm")
        empty, empty_s = await timed(http.post(f"{url}/v1/completions", json=REQUEST))
        assert empty.status_code == 503 and empty_s < 0.5  # no Pod at all: as a Service without endpoints

        serving = replica("r0", asleep=False, model_bytes=0, cold_start_s=1.0)
        serving["metadata"]["labels"]["infer-ctl.io/role"] = "serving"
        create(box, serving)
        held = asyncio.ensure_future(timed(http.post(f"{url}/v1/completions", json=REQUEST)))
        async with asyncio.timeout(5):
            while gateway(box, (await http.get(box.router.metrics_url)).text,
                          "infer_ctl_gateway_queue_depth", "llm") < 1:
                await asyncio.sleep(0.02)
        answer, answer_s = await held
        assert answer.status_code == 200 and answer.headers["X-Infer-Ctl-Endpoint"] == endpoint(box, "r0")
        assert answer_s >= 0.5  # waited for the 1 s load
        metrics = (await http.get(box.router.metrics_url)).text
        assert gateway(box, metrics, "infer_ctl_gateway_queue_depth", "llm") == 0
        assert gateway(box, metrics, "infer_ctl_gateway_inflight", "llm") == 0
        # the latency histogram has the answered request, its time held included; the refusal is counted by code
        duration = "infer_ctl_gateway_request_duration_seconds"
        assert gateway(box, metrics, f"{duration}_count", "llm") == 1
        assert 0.5 <= gateway(box, metrics, f"{duration}_sum", "llm") <= answer_s
        assert [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                if line.startswith("infer_ctl_gateway_requests_total{") and 'service="llm"' in line
                and 'code="503"' in line] == [1.0]
        # 100 x the reference tokens at 5 ms: half a second at the replica, counted in flight meanwhile.
        slow = asyncio.ensure_future(http.post(f"{url}/v1/completions", json={**REQUEST, "max_tokens": 256 * 100}))
        async with asyncio.timeout(5):
            while gateway(box, (await http.get(box.router.metrics_url)).text,
                          "infer_ctl_gateway_inflight", "llm") < 1:
                await asyncio.sleep(0.02)
        assert (await slow).status_code == 200
        assert gateway(box, (await http.get(box.router.metrics_url)).text, "infer_ctl_gateway_inflight", "llm") == 0


async def test_the_front_door_answers_503_with_retry_after_when_no_replica_serves_within_the_bound() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=10) as http:
        box.router.hold_s = 0.5
        url = await install_service(box, "llm")
        create(box, replica("sleeper"))  # on its way (a sleeping standby), but never relabelled serving
        await until(box, ready_pod(box, "sleeper"), what="the sleeper")
        answer, answer_s = await timed(http.post(f"{url}/v1/completions", json=REQUEST))
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
        assert 0.5 <= answer_s < 0.5 + 0.5


def closed_by_client(text: str, service: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("infer_ctl_gateway_requests_total{") and f'service="{service}"' in line
               and 'code="499"' in line)


async def test_a_request_whose_client_goes_away_leaves_the_front_door_at_once_counted_as_499(
        caplog: pytest.LogCaptureFixture) -> None:
    """A client that gives up (its timeout) while its request is held for an endpoint, or while a replica works on
    it: the request leaves the queue, or its request to the replica is closed, then and there, not when an
    endpoint comes or the answer does; counted as 499 (a miss), never logged as a server error."""
    async with sandbox() as box, httpx.AsyncClient(timeout=10) as http:
        box.router.hold_s = 5.0
        url = await install_service(box, "llm")
        create(box, replica("sleeper"))  # on its way (a sleeping standby), never serving: requests are held
        await until(box, ready_pod(box, "sleeper"), what="the sleeper")
        door = box.router.doors[("default", "llm")]
        async with httpx.AsyncClient(timeout=0.3) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await impatient.post(f"{url}/v1/completions", json={**REQUEST, "prompt": "held"})
        async with asyncio.timeout(1.0):  # well within the 5 s it could be held
            while door.held or closed_by_client((await http.get(box.router.metrics_url)).text, "llm") < 1:
                await asyncio.sleep(0.02)
        assert door.forwarded == 0 and door.abandoned == 1

        serving = replica("r0", asleep=False, model_bytes=0, cold_start_s=0.2)
        serving["metadata"]["labels"]["infer-ctl.io/role"] = "serving"
        create(box, serving)
        await until(box, ready_pod(box, "r0"), what="the serving replica")
        # 2,000 x the reference tokens at 5 ms: 10 s at the replica, far past the client's 0.3 s
        async with httpx.AsyncClient(timeout=0.3) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await impatient.post(f"{url}/v1/completions", json={**REQUEST, "max_tokens": 256 * 2000})
        async with asyncio.timeout(1.0):
            while door.forwarded or gateway(box, (await http.get(box.router.metrics_url)).text,
                                            "infer_ctl_gateway_inflight", "llm"):
                await asyncio.sleep(0.02)
        metrics = (await http.get(box.router.metrics_url)).text
        assert closed_by_client(metrics, "llm") == 2 and door.abandoned == 2
        assert gateway(box, metrics, "infer_ctl_gateway_queue_depth", "llm") == 0
        answer = await http.post(f"{url}/v1/completions", json=REQUEST)  # the door still serves
        assert answer.status_code == 200 and answer.headers["X-Infer-Ctl-Endpoint"] == endpoint(box, "r0")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_request_held_when_the_front_door_stops_is_not_counted_as_its_client_s_doing() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=10) as http:
        box.router.hold_s = 30.0
        url = await install_service(box, "llm")
        create(box, replica("sleeper"))  # on its way, never serving: the request is held
        await until(box, ready_pod(box, "sleeper"), what="the sleeper")
        door = box.router.doors[("default", "llm")]
        held = asyncio.ensure_future(http.post(f"{url}/v1/completions", json={**REQUEST, "prompt": "held"}))
        async with asyncio.timeout(5):
            while not door.held:
                await asyncio.sleep(0.02)
        await door.stop()
        with pytest.raises(httpx.HTTPError):  # its connection closed with no answer
            await held
        assert door.abandoned == 0
        assert closed_by_client((await http.get(box.router.metrics_url)).text, "llm") == 0


async def test_the_front_door_holds_a_request_for_a_service_at_zero_until_its_wake_brings_a_replica() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=10) as http:
        url = await install_service(box, "lazy", scale_to_zero=True)
        held = asyncio.ensure_future(timed(http.post(f"{url}/v1/completions", json=REQUEST)))
        # no Pod at all, but the service wakes on requests: held, and shown in the queue depth at once (the
        # counter only counts it when it is answered)
        async with asyncio.timeout(5):
            while gateway(box, (await http.get(box.router.metrics_url)).text,
                          "infer_ctl_gateway_queue_depth", "lazy") < 1:
                await asyncio.sleep(0.02)
        counted = [float(line.rsplit(" ", 1)[1]) for line in (await http.get(box.router.metrics_url)).text.splitlines()
                   if line.startswith("infer_ctl_gateway_requests_total{") and 'service="lazy"' in line]
        assert counted and sum(counted) == 0
        await asyncio.sleep(1.0)  # the controller's detection, longer than nothing
        serving = replica("r0", asleep=False, model_bytes=0, cold_start_s=1.0)
        serving["metadata"]["labels"].update({"infer-ctl.io/role": "serving", "infer-ctl.io/service": "lazy"})
        create(box, serving)
        answer, answer_s = await held
        assert answer.status_code == 200 and answer.headers["X-Infer-Ctl-Endpoint"] == endpoint(box, "r0")
        assert answer_s >= 1.5  # held through the second before the wake and the 1 s load
        assert gateway(box, (await http.get(box.router.metrics_url)).text, "infer_ctl_gateway_queue_depth",
                       "lazy") == 0


async def test_a_request_for_a_service_at_zero_is_answered_503_when_no_replica_comes_within_the_wake_bound() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=10) as http:
        box.router.wake_hold_s = 0.5
        url = await install_service(box, "lazy", scale_to_zero=True)
        answer, answer_s = await timed(http.post(f"{url}/v1/completions", json=REQUEST))
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
        assert 0.5 <= answer_s < 0.5 + 0.5
