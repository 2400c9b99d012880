"""End to end: the whole sandbox with real model-server processes, a front door, and `infer-ctl sandbox up`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.actuate.manifests import ENV_MODEL_CACHE_DIR, MODEL_CACHE_DIR, MODEL_CACHE_VOLUME
from infer_ctl.sandbox.podnet import pod_endpoint
from infer_ctl.sandbox.runtime import Sandbox, load, sandbox_in_thread
from infer_ctl.sandbox.testing import pod
from infer_ctl.sandbox.validation import SchemaValidator
from tests.sandbox.standin_helpers import value

ROOT = Path(__file__).resolve().parents[2]
PODS = "/api/v1/namespaces/default/pods"
IS_PATH = "/apis/infer-ctl.io/v1alpha1/namespaces/default/inferenceservices"
REQUEST = {"model": "model", "prompt": "hi"}  # `testing.pod` serves vLLM's `model`
pytestmark = pytest.mark.slow


def model_server_pods() -> list[int]:
    """Model-server processes descended from this test process (other sandboxes on the machine are not ours)."""
    parents: dict[int, int] = {}
    commands: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            commands[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == os.getpid():
                return True
            pid = parents.get(pid, 0)
        return False

    return [pid for pid, cmd in commands.items() if "infer_ctl.sandbox.modelserver" in cmd and ours(pid)]


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    cluster, catalog = load(ROOT / "deploy/sandbox/small.yaml")
    with sandbox_in_thread(cluster, catalog) as running:
        yield running
    assert model_server_pods() == [], "the node agent left model servers running"


def wait_for(http: httpx.Client, path: str, predicate: Any, timeout_s: float = 20) -> dict[str, Any]:
    """Follow a watch until `predicate(object)` holds (no sleeping and polling)."""
    with http.stream("GET", path, params={"watch": "true", "timeoutSeconds": timeout_s}) as response:
        for line in response.iter_lines():
            event = json.loads(line)
            if event["type"] != "DELETED" and predicate(event["object"]):
                result: dict[str, Any] = event["object"]
                return result
    raise AssertionError(f"condition not reached on {path} in {timeout_s} s")


def is_ready(obj: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def replica(name: str, cold_start_s: float = 0.3, service_time_ms: float = 30) -> dict[str, Any]:
    body = pod(name, labels={"infer-ctl.io/service": "llm-8b", "infer-ctl.io/role": "serving"},
               tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
               nodeSelector={"sandbox.infer-ctl.io/pool": "h100"})
    body["metadata"]["annotations"] = {"sandbox.infer-ctl.io/cold-start-seconds": str(cold_start_s),
                                       "sandbox.infer-ctl.io/service-time-ms": str(service_time_ms),
                                       "infer-ctl.io/model-cache-key": "llama-8b"}
    return body


def test_bound_pods_become_ready_model_servers_behind_one_front_door(sandbox: Sandbox) -> None:
    http = httpx.Client(base_url=sandbox.url, timeout=30)
    crd = yaml.safe_load((ROOT / "crds/inferenceservice.yaml").read_text())
    assert http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd).status_code == 201
    manifest = next(d for d in yaml.safe_load_all((ROOT / "deploy/examples/llm-8b.yaml").read_text())
                    if d and d.get("kind") == "InferenceService")
    manifest["metadata"].update(name="llm-8b", namespace="default")
    assert http.post(IS_PATH, json=manifest).status_code == 201
    for name in ("r0", "r1"):
        assert http.post(PODS, json=replica(name)).status_code == 201
    for name in ("r0", "r1"):
        ready = wait_for(http, f"{PODS}?fieldSelector=metadata.name={name}", is_ready)
        assert ready["spec"]["nodeName"].startswith("h100-")
        assert ready["status"]["phase"] == "Running" and ready["status"]["containerStatuses"][0]["started"]
    service = wait_for(http, IS_PATH, lambda o: "sandbox.infer-ctl.io/url" in o["metadata"].get("annotations", {}))
    door = service["metadata"]["annotations"]["sandbox.infer-ctl.io/url"]
    served = [httpx.post(f"{door}/v1/completions", json=REQUEST, timeout=10) for _ in range(6)]
    assert all(r.status_code == 200 for r in served)
    endpoints = {name: pod_endpoint(http.get(f"{PODS}/{name}").json()) for name in ("r0", "r1")}
    assert {r.headers["X-Infer-Ctl-Endpoint"] for r in served} == set(endpoints.values())
    metrics = httpx.get(f"http://{endpoints['r0']}/metrics").text  # vLLM's own series, its own labels
    assert value(metrics, "vllm:request_success_total", finished_reason="stop", model_name="model", engine="0") > 0
    assert value(metrics, "vllm:e2e_request_latency_seconds_count", model_name="model") > 0
    validator = SchemaValidator()
    for path in (PODS, "/api/v1/namespaces/default/events"):  # what the node agent and scheduler wrote
        for obj in http.get(path).json()["items"]:
            assert validator.validate(obj, field_validation="Strict") == ([], []), obj["metadata"]["name"]


def test_knobs_on_an_inference_service_reach_the_model_servers_of_its_pods(sandbox: Sandbox) -> None:
    # The controller writes the replicas' Pods; a service's manifest sets their model servers' knobs (the demo's
    # chat.yaml its service time and slots). One slot of 400 ms: two requests at once take 0.4 and 0.8 s.
    http = httpx.Client(base_url=sandbox.url, timeout=30)
    crd = yaml.safe_load((ROOT / "crds/inferenceservice.yaml").read_text())
    assert http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd).status_code == 201
    manifest = next(d for d in yaml.safe_load_all((ROOT / "deploy/examples/llm-8b.yaml").read_text())
                    if d and d.get("kind") == "InferenceService")
    manifest["metadata"].update(name="llm-8b", namespace="default", annotations={
        "sandbox.infer-ctl.io/service-time-ms": "400", "sandbox.infer-ctl.io/concurrency": "1"})
    created = http.post(IS_PATH, json=manifest).json()
    body = replica("owned")
    for knob in ("service-time-ms", "cold-start-seconds"):
        del body["metadata"]["annotations"][f"sandbox.infer-ctl.io/{knob}"]
    body["metadata"]["annotations"]["sandbox.infer-ctl.io/cold-start-seconds"] = "0.3"
    body["metadata"]["ownerReferences"] = [{"apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService",
                                            "name": "llm-8b", "uid": created["metadata"]["uid"]}]
    assert http.post(PODS, json=body).status_code == 201
    ready = wait_for(http, f"{PODS}?fieldSelector=metadata.name=owned", is_ready)
    address = pod_endpoint(ready)
    took: list[float] = []

    def call() -> None:
        started = time.monotonic()
        assert httpx.post(f"http://{address}/v1/completions", json=REQUEST, timeout=10).status_code == 200
        took.append(time.monotonic() - started)

    callers = [threading.Thread(target=call) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(10)
    assert sorted(took)[0] >= 0.4 and sorted(took)[1] >= 0.8, took


def test_deleting_a_pod_drains_its_in_flight_request_before_the_process_stops(sandbox: Sandbox) -> None:
    http = httpx.Client(base_url=sandbox.url, timeout=30)
    assert http.post(PODS, json=replica("slow", service_time_ms=1500)).status_code == 201
    ready = wait_for(http, f"{PODS}?fieldSelector=metadata.name=slow", is_ready)
    address = pod_endpoint(ready)
    answers: list[int] = []
    started = threading.Event()

    def call() -> None:
        started.set()
        answers.append(httpx.post(f"http://{address}/v1/completions", json=REQUEST, timeout=10).status_code)

    caller = threading.Thread(target=call)
    caller.start()
    started.wait()
    # The request must be inside the server before the delete; the process is observable only over HTTP.
    for _ in range(100):
        if value(httpx.get(f"http://{address}/metrics").text, "vllm:num_requests_running") == 1:
            break
        time.sleep(0.01)
    rv = http.get(f"{PODS}/slow").json()["metadata"]["resourceVersion"]
    assert http.delete(f"{PODS}/slow").status_code == 200  # graceful: kube-apiserver 1.37 answers 200, not 202
    with http.stream("GET", PODS, params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": 20}) as r:
        events = (json.loads(line) for line in r.iter_lines())
        assert any(e["type"] == "DELETED" and e["object"]["metadata"]["name"] == "slow" for e in events)
    caller.join(10)
    assert answers == [200]


def test_a_pod_on_a_node_with_the_model_cached_starts_faster() -> None:
    cluster, catalog = load(ROOT / "deploy/sandbox/small.yaml")
    with sandbox_in_thread(cluster, catalog) as sandbox:
        http = httpx.Client(base_url=sandbox.url, timeout=30)
        body = replica("cached", cold_start_s=5)
        body["metadata"]["annotations"]["infer-ctl.io/model-cache-key"] = "meta-llama/Llama-3.1-8B-Instruct"
        body["metadata"]["annotations"]["sandbox.infer-ctl.io/warm-start-seconds"] = "0.2"
        # the node's cache mounted, as the controller's replicas mount it (without it the load is from the network)
        main = body["spec"]["containers"][0]
        main["env"] = [{"name": ENV_MODEL_CACHE_DIR,
                        "value": f"{MODEL_CACHE_DIR}/meta-llama/Llama-3.1-8B-Instruct"}]
        main["volumeMounts"] = [{"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_DIR, "readOnly": True}]
        body["spec"]["volumes"] = [{"name": MODEL_CACHE_VOLUME, "hostPath": {"path": MODEL_CACHE_DIR}}]
        http.post(PODS, json=body)
        ready = wait_for(http, f"{PODS}?fieldSelector=metadata.name=cached", is_ready, timeout_s=4)
        assert ready["status"]["containerStatuses"][0]["ready"]


def test_sandbox_up_prints_its_endpoints_installs_the_crd_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "infer_ctl.cli.main", "sandbox", "up",
         "--cluster", str(ROOT / "deploy/sandbox/small.yaml"), "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("Ctrl-C"):
            break
    text = "".join(lines)
    assert "API server:  http://127.0.0.1:" in text and str(kubeconfig) in text
    config = yaml.safe_load(kubeconfig.read_text())
    url = config["clusters"][0]["cluster"]["server"]
    assert httpx.get(f"{url}/api/v1/nodes").json()["items"]
    # the CRD is there: an example applies at once, as the printed next step says
    assert "CRD:         inferenceservices.infer-ctl.io installed" in text and "kubectl get infsvc" in text
    # the gateway's metrics, where a request held for a service at zero shows first
    [gateway] = [line.split()[2] for line in lines if line.strip().startswith("gateway metrics:")]
    assert "infer_ctl_gateway_requests" in httpx.get(gateway).text
    crd = httpx.get(f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/inferenceservices.infer-ctl.io")
    assert {c["type"]: c["status"] for c in crd.json()["status"]["conditions"]}["Established"] == "True"
    example = yaml.safe_load((ROOT / "deploy/examples/llm-8b.yaml").read_text())
    created = httpx.post(f"{url}/apis/infer-ctl.io/v1alpha1/namespaces/default/inferenceservices", json=example)
    assert created.status_code == 201, created.text
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0 and "stopped." in out
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/version")


def test_a_crashed_model_server_is_restarted_and_counted(sandbox: Sandbox) -> None:
    http = httpx.Client(base_url=sandbox.url, timeout=30)
    http.post(PODS, json=replica("crashy", cold_start_s=0.1))
    ready = wait_for(http, f"{PODS}?fieldSelector=metadata.name=crashy", is_ready)
    pid = int(ready["status"]["containerStatuses"][0]["containerID"].removeprefix("sandbox://"))
    os.kill(pid, signal.SIGKILL)
    again = wait_for(http, f"{PODS}?fieldSelector=metadata.name=crashy",
                     lambda o: is_ready(o) and o["status"]["containerStatuses"][0]["restartCount"] == 1)
    assert again["status"]["containerStatuses"][0]["containerID"] != ready["status"]["containerStatuses"][0][
        "containerID"]


def test_sandbox_up_rejects_a_bad_cluster_file_naming_the_field(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from infer_ctl.cli.main import main

    bad = tmp_path / "cluster.yaml"
    bad.write_text("kind: SandboxCluster\nspec:\n  nodePools:\n    - {name: gpu, accelerator: H999}\n")
    assert main(["sandbox", "up", "--cluster", str(bad), "--kubeconfig", str(tmp_path / "kc")]) == 2
    assert "spec.nodePools[0].accelerator: Unsupported value: 'H999'" in capsys.readouterr().err


def test_a_pod_deleted_while_its_model_is_still_loading_stops_at_once(sandbox: Sandbox) -> None:
    http = httpx.Client(base_url=sandbox.url, timeout=30)
    body = replica("early", cold_start_s=30)
    body["spec"]["terminationGracePeriodSeconds"] = 60
    rv = http.post(PODS, json=body).json()["metadata"]["resourceVersion"]
    wait_for(http, f"{PODS}?fieldSelector=metadata.name=early", lambda o: bool(o["spec"].get("nodeName")))
    started = time.monotonic()
    http.delete(f"{PODS}/early")
    with http.stream("GET", PODS, params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": 20}) as r:
        assert any(json.loads(line)["type"] == "DELETED" for line in r.iter_lines())
    assert time.monotonic() - started < 5  # not the 60 s grace period: nothing was in flight
