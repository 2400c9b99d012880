"""The Pod template end to end, on both backends: an InferenceService of stock vLLM's image whose HF_TOKEN comes from a
Secret, whose VLLM_SERVER_DEV_MODE comes from a ConfigMap key, and which mounts that ConfigMap as a volume. Created
before its Secret exists, its replica waits as kubelet leaves it (CreateContainerConfigError naming the Secret);
once the Secret is there it runs, and the stand-in vLLM process really has the resolved variables: the node agent's
record of what the process was started with holds the token, and the stand-in answers vLLM's dev-mode endpoint
`/is_sleeping` (which vLLM serves only with VLLM_SERVER_DEV_MODE=1) on the replica's own address."""

from __future__ import annotations

import asyncio
import base64
import time
from datetime import UTC, datetime
from typing import Any

import httpx

from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.kube.client import INFERENCE_SERVICES, PODS
from infer_ctl.sandbox.containerenv import CONFIG_MAPS, SECRETS
from infer_ctl.sandbox.kubesandbox import KubeSandbox
from infer_ctl.sandbox.nodeagent import NodeAgent
from infer_ctl.sandbox.podnet import pod_endpoint
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster

TOKEN = "hf_example_token_from_a_secret"


def agent(cluster: Cluster) -> NodeAgent:
    sandbox = cluster.sandbox
    return sandbox.side.agent if isinstance(sandbox, KubeSandbox) else sandbox.agent


def waiting(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return dict((statuses[0].get("state") or {}).get("waiting") or {})


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


async def test_a_replica_gets_its_token_from_a_secret_and_its_settings_from_a_config_map(cluster: Cluster) -> None:
    kube, name = cluster.kube, "tmpl"
    kube.create(CONFIG_MAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": "vllm-settings", "namespace": "default"},
                              "data": {"dev-mode": "1", "chat-template.jinja": "{{ messages }}"}}, "default")
    kube.create(INFERENCE_SERVICES, InferenceServiceBuilder(name)
                .with_("spec.model", {"name": "example/small", "memory": "20Gi"})
                .with_("spec.runtime", {
                    "image": "vllm/vllm-openai:v0.16.0", "coldStartSeconds": 1,
                    "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
                            {"name": "VLLM_SERVER_DEV_MODE", "valueFrom": {"configMapKeyRef": {
                                "name": "vllm-settings", "key": "dev-mode"}}}],
                    "volumes": [{"name": "settings", "configMap": {"name": "vllm-settings"}}],
                    "volumeMounts": [{"name": "settings", "mountPath": "/etc/vllm", "readOnly": True}]})
                .with_("spec.scaling", {"minReplicas": 1, "maxReplicas": 1, "targetRequestsPerReplica": 10,
                                        "forecast": {"enabled": False}}).build(), "default")
    reconciler = Reconciler(kube, Settings(cluster.policies))

    def replicas() -> list[dict[str, Any]]:
        return kube.list(PODS, "default", label_selector=f"infer-ctl.io/service={name}")

    async def until(what: str, check: Any, timeout_s: float = 60) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await reconciler.cycle(kube.get(INFERENCE_SERVICES, name, "default"), datetime.now(UTC))
            found = check()
            if found:
                return found
            await asyncio.sleep(1.0)
        raise AssertionError(f"timed out waiting for {what}: {[p.get('status') for p in replicas()]}")

    try:
        # no Secret yet: the replica waits as kubelet leaves it, naming what is missing
        held = await until("the replica waiting for its Secret", lambda: next(
            (p for p in replicas() if waiting(p).get("reason") == "CreateContainerConfigError"), None))
        assert waiting(held)["message"] == 'secret "hf-token" not found'
        spec = held["spec"]
        (container,) = spec["containers"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["settings"]["configMap"]["name"] == "vllm-settings"  # (kube-apiserver adds defaultMode 420)
        assert {"name": "settings", "mountPath": "/etc/vllm", "readOnly": True} in container["volumeMounts"]
        assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]  # the controller's 2Gi
        assert spec["automountServiceAccountToken"] is False
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"

        kube.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                              "metadata": {"name": "hf-token", "namespace": "default"},
                              "data": {"token": base64.b64encode(TOKEN.encode()).decode()}}, "default")
        pod = await until("a ready replica", lambda: next((p for p in replicas() if is_ready(p)), None))
        started_with = agent(cluster).container_envs[("default", pod["metadata"]["name"])]
        assert started_with["HF_TOKEN"] == TOKEN and started_with["VLLM_SERVER_DEV_MODE"] == "1"
        async with httpx.AsyncClient(timeout=5, trust_env=False) as http:
            answer = await http.get(f"http://{pod_endpoint(pod)}/is_sleeping")
        assert answer.status_code == 200 and answer.json() == {"is_sleeping": False}, answer.text
    finally:
        await reconciler.close()
