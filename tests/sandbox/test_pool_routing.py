"""The front door's endpoint picker for a service with an InferencePool (infer_ctl/sandbox/router.py): the pool's
selector and target ports give the endpoints, and the choice reads the engines' queue and KV-cache gauges as GIE's
default scorers weigh them, plus the door's own requests in flight. The same door without a pool keeps choosing the
least-outstanding serving Pod."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import aiohttp.web
import pytest

from infer_ctl.actuate.pool import endpoint_picker, inference_pool
from infer_ctl.config.policies import load_policies
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.kube.client import INFERENCE_SERVICES
from infer_ctl.sandbox.ports import free_port
from infer_ctl.sandbox.router import (
    EndpointLoad,
    FrontDoor,
    read_gauges,
    score_endpoints,
)
from tests.builders import InferenceServiceBuilder

RUNTIMES = load_policies().runtimes


@pytest.mark.parametrize(("loads", "best"), [
    ({"a": EndpointLoad(0, 0.2, 1), "b": EndpointLoad(4, 0.9, 0)}, "a"),  # the docstring's worked example
    ({"a": EndpointLoad(3, 0.1, 0), "b": EndpointLoad(0, 0.1, 0)}, "b"),
    ({"a": EndpointLoad(2, 0.95, 0), "b": EndpointLoad(2, 0.30, 0)}, "b"),
    ({"a": EndpointLoad(0, 0.5, 6), "b": EndpointLoad(0, 0.5, 1)}, "b"),
    ({"a": EndpointLoad(None, None, 0), "b": EndpointLoad(5, 0.9, 0)}, "a"),
    ({"a": EndpointLoad(None, None, 0), "b": EndpointLoad(0, 0.0, 0)}, "b"),
], ids=["a short queue and free KV cache beat one request in flight",
        "the shortest queue wins when the rest is equal",
        "the freer KV cache wins when the queues are equal",
        "the door's own requests in flight break a tie of stale metrics",
        "an endpoint not read yet is neutral, better than a loaded one",
        "an endpoint not read yet is neutral, worse than an idle one"])
def test_the_endpoint_picker_scores_queue_kv_cache_and_requests_in_flight(loads: dict[str, EndpointLoad],
                                                                          best: str) -> None:
    scores = score_endpoints(loads)
    assert max(scores, key=lambda e: scores[e]) == best
    assert len(set(scores.values())) == len(scores)  # a strict winner, not a tie


def test_the_scores_are_the_three_scorers_summed() -> None:
    scores = score_endpoints({"a": EndpointLoad(0, 0.2, 1), "b": EndpointLoad(4, 0.9, 0)})
    assert scores == pytest.approx({"a": 1 + 0.8 + 0, "b": 0 + 0.1 + 1})
    # the spread counts an idle endpoint in: one busy endpoint alone scores 0 on queue and requests in flight
    assert score_endpoints({"only": EndpointLoad(7, 0.25, 3)}) == pytest.approx({"only": 0 + 0.75 + 0})
    assert score_endpoints({"a": EndpointLoad(0, 0.0, 0), "b": EndpointLoad(0, 0.0, 0)}) == {"a": 3.0, "b": 3.0}


VLLM_METRICS = """# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 3.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.42
vllm:num_requests_running{engine="0",model_name="llama"} 5.0
"""


def test_the_gauges_are_read_by_exact_name_from_the_exposition() -> None:
    assert read_gauges(VLLM_METRICS, ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")) == {
        "vllm:num_requests_waiting": 3.0, "vllm:kv_cache_usage_perc": 0.42}
    assert read_gauges(VLLM_METRICS, ("sglang:num_queue_reqs",)) == {}


# ------------------------------------------------------------------------------------------------ a door over fakes


def ready_pod(name: str, ip: str, labels: dict[str, str], container_port: int = 8000) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"containers": [{"name": "model-server", "ports": [{"name": "http",
                                                                         "containerPort": container_port}]}]},
            "status": {"podIP": ip, "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}


SERVING = {"infer-ctl.io/service": "llm", "infer-ctl.io/role": "serving"}


@dataclass
class FakeView:
    """The few ClusterView reads a front door makes."""

    pod_list: list[dict[str, Any]]
    services: Any = INFERENCE_SERVICES

    def pods(self, *, nodes: Collection[str] | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        return [p for p in self.pod_list if namespace is None or p["metadata"]["namespace"] == namespace]

    def inference_services(self) -> list[dict[str, Any]]:
        return [InferenceServiceBuilder("llm").with_("metadata.uid", "u-llm").build()]


@dataclass
class FakePools:
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    listeners: list[Callable[[], None]] = field(default_factory=list)


def pool(port: int, **extra_labels: str) -> dict[str, Any]:
    svc = parse_inference_service(InferenceServiceBuilder("llm").with_("metadata.uid", "u-llm").build())
    made = inference_pool(svc, port, endpoint_picker("llm"))
    made["spec"]["selector"]["matchLabels"].update(extra_labels)
    return made


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_without_a_pool_the_door_picks_the_least_outstanding_serving_pod(
        session: aiohttp.ClientSession) -> None:
    view = FakeView([ready_pod("r0", "10.0.0.1", SERVING), ready_pod("r1", "10.0.0.2", SERVING)])
    door = FrontDoor(view, "default", "llm", session, pools=FakePools(), runtimes=RUNTIMES)  # type: ignore[arg-type]
    door.outstanding = {"10.0.0.1:8000": 2, "10.0.0.2:8000": 0}
    assert door.endpoints() == (["10.0.0.1:8000", "10.0.0.2:8000"], False)
    assert door.pick() == "10.0.0.2:8000"
    assert door.pool_picks == 0


async def test_with_a_pool_the_door_takes_its_selector_and_target_port_and_the_shorter_queue(
        session: aiohttp.ClientSession) -> None:
    standby = {**SERVING, "infer-ctl.io/role": "standby"}
    view = FakeView([ready_pod("r0", "10.0.0.1", {**SERVING, "tier": "a"}),
                     ready_pod("r1", "10.0.0.2", {**SERVING, "tier": "b"}),
                     ready_pod("r2", "10.0.0.3", {**SERVING, "tier": "b"}),
                     ready_pod("r3", "10.0.0.4", standby)])
    pools = FakePools({("default", "llm"): pool(9000, tier="b")})
    door = FrontDoor(view, "default", "llm", session, pools=pools, runtimes=RUNTIMES)  # type: ignore[arg-type]
    try:
        # the pool's selector and port, not the service's labels and the container's port
        assert door.endpoints() == (["10.0.0.2:9000", "10.0.0.3:9000"], True)
        now = asyncio.get_running_loop().time()
        door.readings = {"10.0.0.2:9000": (6.0, 0.5, now), "10.0.0.3:9000": (1.0, 0.5, now)}
        assert door.pick() == "10.0.0.3:9000"
        assert door.pool_picks == 1
        # a reading older than the picker trusts is no reading: both neutral, so the door's own load decides
        door.readings = {"10.0.0.2:9000": (6.0, 0.5, now - 60), "10.0.0.3:9000": (1.0, 0.5, now - 60)}
        door.outstanding = {"10.0.0.3:9000": 1}
        assert door.pick() == "10.0.0.2:9000"
        # a pool of that name somebody else owns is not the service's: the door routes by labels
        pools.objects[("default", "llm")]["metadata"]["ownerReferences"] = []
        assert door.endpoints()[1] is False
    finally:
        await door.stop()


async def metrics_server(host: str, port: int, waiting: float, kv: float) -> aiohttp.web.AppRunner:
    async def handle(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text=f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
                                         f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n')

    app = aiohttp.web.Application()
    app.router.add_get("/metrics", handle)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, host, port).start()
    return runner


async def test_the_door_reads_each_pool_endpoints_metrics_in_the_background_and_routes_to_the_idle_one(
        session: aiohttp.ClientSession) -> None:
    port = free_port()
    busy, idle = await metrics_server("127.0.0.2", port, 8, 0.9), await metrics_server("127.0.0.3", port, 0, 0.1)
    view = FakeView([ready_pod("r0", "127.0.0.2", SERVING), ready_pod("r1", "127.0.0.3", SERVING)])
    door = FrontDoor(view, "default", "llm", session,  # type: ignore[arg-type]
                     pools=FakePools({("default", "llm"): pool(port)}), runtimes=RUNTIMES)
    try:
        door.pick()  # the first pooled request starts the reading
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while len(door.readings) < 2:
            assert loop.time() < deadline, f"the endpoints' metrics were not read: {door.readings}"
            await asyncio.sleep(0.02)
        assert door.readings[f"127.0.0.2:{port}"][:2] == (8.0, 0.9)
        assert door.readings[f"127.0.0.3:{port}"][:2] == (0.0, 0.1)
        assert {door.pick() for _ in range(5)} == {f"127.0.0.3:{port}"}
    finally:
        await door.stop()
        await busy.cleanup()
        await idle.cleanup()
