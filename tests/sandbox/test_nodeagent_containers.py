"""The node agent runs what the Pod says (issue 43 part 5), with a tiny server of the tests' own given through the
image table (tests/sandbox/tinyserver.py), on the emulator: the container's env from Secrets, ConfigMaps and
fieldRefs (a missing key: CreateContainerConfigError and an Event, as kubelet), a loopback address per Pod (two
Pods of one node both on port 8000), Ready from the readiness probe, a restart on failed liveness probes, the front
door routing to `<podIP>:<port>` and retrying a 503, and Prometheus' targets labelled as a PodMonitor labels them.
(The built-in vLLM/SGLang entries go through the stand-in's zygote: tested once the stand-in's branch is merged.)"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from infer_ctl.config.cluster import parse_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.sandbox.images import ImageEntry, ImageTable
from infer_ctl.sandbox.prometheus import LocalPrometheus, Target, find_prometheus, pod_targets
from infer_ctl.sandbox.router import FrontDoor
from infer_ctl.sandbox.runtime import Sandbox
from infer_ctl.sandbox.store import Obj
from infer_ctl.sandbox.view import StoreView
from tests.sandbox.test_sleep_wake import until as store_until

ROOT = Path(__file__).resolve().parents[2]
CATALOG = load_policies(ROOT / "policies").catalog
TINY = str(Path(__file__).with_name("tinyserver.py"))
IMAGES = ImageTable.with_builtins((ImageEntry("example.com/tiny*", (sys.executable, TINY)),))
NODE = "l4-0"
pytestmark = pytest.mark.slow


@asynccontextmanager
async def sandbox() -> AsyncIterator[Sandbox]:
    doc = {"apiVersion": "sandbox.infer-ctl.io/v1alpha1", "kind": "SandboxCluster", "metadata": {"name": "t"},
           "spec": {"nodePools": [{"name": "l4", "count": 1, "accelerator": "L4", "gpus": 1, "cpu": "16",
                                   "memory": "64Gi"}]}}
    box = Sandbox(parse_cluster(doc, CATALOG), CATALOG, images=IMAGES)
    await box.start()
    try:
        yield box
    finally:
        await box.stop()


def tiny_pod(name: str, *, env: list[dict[str, Any]] = (), probes: dict[str, Any] | None = None,  # type: ignore[assignment]
             service: str = "tiny", **container: Any) -> dict[str, Any]:
    """A Pod of the tiny image on the node, bound at its own address (`$(POD_IP)` from a fieldRef, as in a
    cluster's manifests), port 8000 named http."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default",
                         "labels": {"infer-ctl.io/service": service, "infer-ctl.io/role": "serving"}},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1, "containers": [{
                "name": "server", "image": "example.com/tiny:1", "args": ["--host", "$(POD_IP)", "--port", "8000"],
                "ports": [{"name": "http", "containerPort": 8000}],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, *env],
                **(probes or {}), **container}]}}


def probe(path: str = "/health", *, period_s: int = 1, failures: int = 1, **more: Any) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period_s, "failureThreshold": failures,
            "timeoutSeconds": 1, **more}


def create(box: Sandbox, obj: dict[str, Any]) -> Obj:
    rt = box.store.type_for_kind(obj.get("apiVersion", "v1"), obj["kind"])
    created, _ = box.store.create(rt, "default", obj, validate=True)
    return created


def get_pod(box: Sandbox, name: str) -> Obj:
    found = box.store.find(box.store.type("", "v1", "pods"), "default", name)
    assert found is not None
    return found


def condition(pod: Obj, kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def container_status(pod: Obj) -> dict[str, Any]:
    return dict(((pod.get("status") or {}).get("containerStatuses") or [{}])[0])


def events(box: Sandbox, pod: str) -> list[tuple[str, str]]:
    rt = box.store.type("", "v1", "events")
    return [(e["reason"], e["message"]) for e in box.store.list_objects(rt, "default")
            if e["involvedObject"]["name"] == pod]


async def until(box: Sandbox, predicate: Callable[[], Any], timeout_s: float = 15, what: str = "") -> Any:
    return await store_until(box, predicate, timeout_s, what)


def pod_where(box: Sandbox, name: str, test: Callable[[Obj], Any]) -> Callable[[], Obj | None]:
    def check() -> Obj | None:
        pod = get_pod(box, name)
        return pod if test(pod) else None

    return check


def ready(box: Sandbox, name: str) -> Callable[[], Obj | None]:
    return pod_where(box, name, lambda p: condition(p, "Ready"))


def url(pod: Obj, path: str = "") -> str:
    return f"http://{pod['status']['podIP']}:8000{path}"


async def test_a_pods_env_gets_values_from_its_secret_config_map_and_fields_and_the_simulated_hardware() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=5, trust_env=False) as http:
        create(box, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "default"},
                     "data": {"token": base64.b64encode(b"hf_secret").decode()}})
        create(box, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg", "namespace": "default"},
                     "data": {"MODE": "fast", "LEVEL": "3"}})
        create(box, tiny_pod("p", env=[
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "GREETING", "value": "hello $(POD_NAME)"}],
            envFrom=[{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
            readinessProbe=probe()))
        pod = await until(box, ready(box, "p"), what="p ready")
        env = (await http.get(url(pod, "/env"))).json()
        assert {k: env[k] for k in ("HF_TOKEN", "GREETING", "CFG_MODE", "CFG_LEVEL", "POD_IP")} == {
            "HF_TOKEN": "hf_secret", "GREETING": "hello p", "CFG_MODE": "fast", "CFG_LEVEL": "3",
            "POD_IP": pod["status"]["podIP"]}
        assert env["INFER_CTL_SANDBOX_ACCELERATOR"] == "L4"
        assert env["INFER_CTL_SANDBOX_POD"] == "p" and env["INFER_CTL_SANDBOX_DRAIN_S"] == "1"
        assert env["INFER_CTL_SANDBOX_ENGINE_VERSION"] == "1"
        assert env["INFER_CTL_SANDBOX_AGENT_URL"].endswith(f"/v1/pods/{pod['metadata']['uid']}")
        assert (await http.get(url(pod, "/argv"))).json()[1:] == ["--host", pod["status"]["podIP"], "--port", "8000"]


async def test_a_missing_secret_key_leaves_the_container_waiting_with_create_container_config_error() -> None:
    async with sandbox() as box:
        create(box, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": "default"},
                     "data": {"other": base64.b64encode(b"x").decode()}})
        create(box, tiny_pod("p", env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
            "name": "hf", "key": "token"}}}]))
        pod = await until(box, pod_where(box, "p", lambda p: container_status(p).get("state", {}).get("waiting")),
                          what="the container waiting")
        waiting = container_status(pod)["state"]["waiting"]
        assert waiting == {"reason": "CreateContainerConfigError",
                           "message": "couldn't find key token in Secret default/hf"}
        assert not condition(pod, "Ready")
        await until(box, lambda: ("Failed", "Error: couldn't find key token in Secret default/hf") in events(box, "p"),
                    what="kubelet's Event naming the key")


async def test_two_pods_on_one_node_both_listen_on_port_8000_each_on_its_own_pod_ip() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=5, trust_env=False) as http:
        for name in ("a", "b"):
            create(box, tiny_pod(name, readinessProbe=probe()))
        a = await until(box, ready(box, "a"), what="a ready")
        b = await until(box, ready(box, "b"), what="b ready")
        ips = [ipaddress.IPv4Address(p["status"]["podIP"]) for p in (a, b)]
        assert ips[0] != ips[1] and all(ip in ipaddress.IPv4Network("127.0.0.0/8") for ip in ips)
        assert ipaddress.IPv4Address("127.0.0.1") not in ips
        assert [p["status"]["podIPs"] for p in (a, b)] == [[{"ip": str(ip)}] for ip in ips]
        assert "sandbox.infer-ctl.io/address" not in (a["metadata"].get("annotations") or {})
        assert [(await http.get(url(p, "/v1/models"))).json()["pod"] for p in (a, b)] == ["a", "b"]


async def test_a_pod_is_ready_only_once_its_readiness_probe_answers_and_at_once_without_one() -> None:
    async with sandbox() as box:
        create(box, tiny_pod("slow", env=[{"name": "TINY_DELAY_S", "value": "3"}], readinessProbe=probe()))
        create(box, tiny_pod("plain", env=[{"name": "TINY_DELAY_S", "value": "30"}]))
        running = await until(box, pod_where(box, "slow", lambda p: "running" in container_status(p).get("state", {})),
                              what="slow running")
        assert not condition(running, "Ready") and not condition(running, "ContainersReady")
        await until(box, ready(box, "plain"), timeout_s=5, what="plain ready with no readiness probe (kubelet)")
        pod = await until(box, ready(box, "slow"), what="slow ready once it listens")
        assert condition(pod, "ContainersReady") and container_status(pod)["ready"] is True


async def test_failed_liveness_probes_restart_the_container() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=5, trust_env=False) as http:
        with tempfile.TemporaryDirectory() as tmp:
            flag = Path(tmp) / "fail"
            create(box, tiny_pod("p", env=[{"name": "TINY_FAIL_FILE", "value": str(flag)}],
                                 livenessProbe=probe(failures=2), readinessProbe=probe()))
            pod = await until(box, ready(box, "p"), what="p ready")
            first = (await http.get(url(pod, "/env"))).json()
            assert first["POD_NAME"] == "p"
            flag.touch()  # /health answers 500 from now on
            restarted = await until(box, pod_where(box, "p", lambda p: container_status(p).get("restartCount", 0) >= 1),
                                    what="a restart")
            await until(box, lambda: any(reason == "Killing" and "failed liveness probe" in message
                                         for reason, message in events(box, "p")), what="the Killing Event")
            assert any(reason == "Unhealthy" for reason, _ in events(box, "p"))
            assert restarted["status"]["podIP"] == pod["status"]["podIP"]  # a restart keeps the Pod's address


async def test_the_front_door_routes_to_pod_ip_and_port_and_retries_a_503_on_another_endpoint() -> None:
    async with sandbox() as box, aiohttp.ClientSession(trust_env=False) as session:
        create(box, tiny_pod("good", readinessProbe=probe()))
        create(box, tiny_pod("busy", env=[{"name": "TINY_STATUS", "value": "503"}], readinessProbe=probe()))
        good = await until(box, ready(box, "good"), what="good ready")
        busy = await until(box, ready(box, "busy"), what="busy ready")
        door = FrontDoor(StoreView(box.store), "default", "tiny", session)
        await door.start()
        try:
            answers = []
            for _ in range(6):
                async with session.post(f"{door.url}/v1/completions", json={}) as answer:
                    answers.append((answer.status, answer.headers["X-Infer-Ctl-Endpoint"], await answer.json()))
        finally:
            await door.stop()
        assert {a[0] for a in answers} == {200}
        assert {a[1] for a in answers} == {f"{good['status']['podIP']}:8000"}
        assert {a[2]["pod"] for a in answers} == {"good"}
        assert door.retried >= 1  # least outstanding, round-robin: the busy one was tried and its 503 retried
        assert f"{busy['status']['podIP']}:8000" in door.outstanding


async def test_prometheus_scrapes_each_replica_at_its_pod_ip_with_namespace_pod_and_service_labels(
        tmp_path: Path) -> None:
    async with sandbox() as box:
        create(box, tiny_pod("a", readinessProbe=probe()))
        a = await until(box, ready(box, "a"), what="a ready")
        targets = pod_targets(box.store.list_objects(box.store.type("", "v1", "pods"), "default"))
        assert targets == [Target(f"{a['status']['podIP']}:8000",
                                  (("namespace", "default"), ("pod", "a"), ("service", "tiny")))]
        if find_prometheus() is None:
            pytest.skip("Debian's prometheus is not installed")
        prometheus = LocalPrometheus(tmp_path / "prom", scrape_interval_s=0.5)
        await asyncio.to_thread(prometheus.start, targets=targets)
        try:
            async with asyncio.timeout(20), httpx.AsyncClient(timeout=5, trust_env=False) as http:
                while True:
                    answer = (await http.get(f"{prometheus.url}/api/v1/targets")).json()
                    active = answer["data"]["activeTargets"]
                    if active:
                        break
                    await asyncio.sleep(0.2)  # Prometheus reads its file_sd on its own refresh interval
        finally:
            prometheus.stop()
        assert [(t["labels"]["namespace"], t["labels"]["pod"], t["labels"]["service"], t["scrapeUrl"])
                for t in active] == [("default", "a", "tiny", f"http://{a['status']['podIP']}:8000/metrics")]
