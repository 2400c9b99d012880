"""What kubelet does with the rest of a Pod template, as the node agent emulates it on the emulator: a Secret or
ConfigMap volume whose object is missing holds the container in ContainerCreating with a FailedMount Event until it
exists, other volumes are accepted; a resourceFieldRef reads the container's resources; the preStop hook runs
before SIGTERM within the grace period; the env a container was started with is on record."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.sandbox.test_nodeagent_containers import (
    container_status,
    create,
    events,
    pod_where,
    probe,
    ready,
    sandbox,
    tiny_pod,
    until,
    url,
)

pytestmark = pytest.mark.slow


async def test_a_missing_config_map_volume_holds_the_container_until_it_exists() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=5, trust_env=False) as http:
        pod = tiny_pod("p", readinessProbe=probe(), volumeMounts=[{"name": "tpl", "mountPath": "/etc/tpl"},
                                                                 {"name": "scratch", "mountPath": "/scratch"},
                                                                 {"name": "shm", "mountPath": "/dev/shm"}])
        pod["spec"]["volumes"] = [{"name": "tpl", "configMap": {"name": "chat-template"}},
                                  {"name": "scratch", "emptyDir": {}},
                                  {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
                                  {"name": "maybe", "secret": {"secretName": "absent", "optional": True}}]
        create(box, pod)
        waiting = await until(box, pod_where(box, "p", lambda p: container_status(p).get("state", {}).get(
            "waiting")), what="the container waiting")
        assert container_status(waiting)["state"]["waiting"]["reason"] == "ContainerCreating"
        await until(box, lambda: ("FailedMount", 'MountVolume.SetUp failed for volume "tpl" : configmap '
                                                 '"chat-template" not found') in events(box, "p"),
                    what="kubelet's FailedMount Event")
        create(box, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chat-template",
                                                                          "namespace": "default"},
                     "data": {"template.jinja": "{{ messages }}"}})
        started = await until(box, ready(box, "p"), timeout_s=30, what="p ready once its ConfigMap exists")
        assert (await http.get(url(started, "/env"))).json()["POD_NAME"] == "p"


async def test_a_resource_field_ref_reads_the_container_s_limit_in_the_divisor_s_unit() -> None:
    async with sandbox() as box, httpx.AsyncClient(timeout=5, trust_env=False) as http:
        create(box, tiny_pod("p", readinessProbe=probe(), env=[
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}}],
            resources={"requests": {"cpu": "1500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}))
        pod = await until(box, ready(box, "p"), what="p ready")
        env = (await http.get(url(pod, "/env"))).json()
        assert (env["MEM_MI"], env["CPU"]) == ("2048", "2")  # 1.5 CPUs rounded up, as kubelet writes them
        assert box.agent.container_envs[("default", "p")]["MEM_MI"] == "2048"


async def test_a_pre_stop_sleep_runs_before_sigterm_within_the_grace_period() -> None:
    async with sandbox() as box:
        pods = box.store.type("", "v1", "pods")
        for name, hook in (("plain", None), ("hooked", {"preStop": {"sleep": {"seconds": 2}}})):
            pod = tiny_pod(name, readinessProbe=probe(), **({"lifecycle": hook} if hook else {}))
            pod["spec"]["terminationGracePeriodSeconds"] = 30
            create(box, pod)
            await until(box, ready(box, name), what=f"{name} ready")
        took = {}
        for name in ("plain", "hooked"):
            began = time.monotonic()
            box.store.delete(pods, "default", name)
            await until(box, lambda n=name: box.store.find(pods, "default", n) is None, timeout_s=30,
                        what=f"{name} gone")
            took[name] = time.monotonic() - began
        assert took["plain"] < 1.5 and 2 <= took["hooked"] < 5, took


async def test_an_exec_pre_stop_hook_is_said_not_to_run() -> None:
    async with sandbox() as box:
        pod = tiny_pod("p", readinessProbe=probe(), lifecycle={"preStop": {"exec": {"command": ["sleep", "5"]}}})
        pod["spec"]["terminationGracePeriodSeconds"] = 30
        create(box, pod)
        await until(box, ready(box, "p"), what="p ready")
        box.store.delete(box.store.type("", "v1", "pods"), "default", "p")
        await until(box, lambda: any(reason == "FailedPreStopHook" for reason, _ in events(box, "p")),
                    what="the Event saying exec hooks do not run")
