"""The sleep/wake client against the vLLM stand-in, started with the args and env the controller's Pod template
gives a replica that may sleep (`engine_args`, the profile's sleep env): the calls, the drain of an engine without
`mode`, and how refusals read."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest

from infer_ctl.actuate.engine import EngineClient, refusal
from infer_ctl.actuate.manifests import engine_args
from infer_ctl.config.policies import load_policies
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.core.runtime import ServiceRuntime, service_runtime
from infer_ctl.paths import data_path
from tests.builders import InferenceServiceBuilder
from tests.sandbox.standin_helpers import standin, value

RUNTIMES = load_policies(data_path("policies")).runtimes
SLOW = {"INFER_CTL_SANDBOX_SERVICE_TIME_MS": "800"}


def replica(image: str, *, sleeps: bool = True) -> tuple[ServiceRuntime, list[str], dict[str, str]]:
    """A vLLM service's runtime, and the argv and env its replica's container gets from the Pod template."""
    svc = parse_inference_service(InferenceServiceBuilder().with_("spec.runtime.image", image).build())
    runtime = service_runtime(svc.spec.runtime, RUNTIMES)
    assert runtime is not None
    sleep = runtime.profile.sleep
    assert sleep is not None
    env = dict(sleep.env) if sleeps else {}
    return runtime, engine_args(svc.spec, runtime, sleeps=sleeps), env


async def test_a_recent_vllm_sleeps_with_mode_wait_letting_the_request_in_flight_finish_and_wakes_confirmed() -> None:
    runtime, args, env = replica("vllm/vllm-openai:v0.16.0")
    assert runtime.sleep_version is not None and not runtime.sleep_version.drain_first
    async with standin("vllm", *args, **env, **SLOW) as url, httpx.AsyncClient(timeout=10) as http:
        address = url.removeprefix("http://")
        model = args[args.index("--served-model-name") + 1]
        request = asyncio.create_task(http.post(f"{url}/v1/completions", json={"model": model, "prompt": "x"}))
        await asyncio.sleep(0.2)
        engine = EngineClient(http)
        assert await engine.sleep(address, runtime) == ""
        assert (await request).json()["choices"][0]["finish_reason"] == "stop"  # mode=wait: not aborted
        assert (await http.get(f"{url}/is_sleeping")).json() == {"is_sleeping": True}
        assert await engine.wake(address, runtime, 10.0) == ""
        assert (await http.get(f"{url}/is_sleeping")).json() == {"is_sleeping": False}


async def test_an_older_vllm_without_mode_is_drained_before_its_sleep() -> None:
    runtime, args, env = replica("vllm/vllm-openai:v0.11.0")
    assert runtime.sleep_version is not None and runtime.sleep_version.drain_first
    async with standin("vllm", *args, **env, **SLOW, INFER_CTL_SANDBOX_ENGINE_VERSION="0.11.0") as url, \
            httpx.AsyncClient(timeout=10) as http:
        address = url.removeprefix("http://")
        model = args[args.index("--served-model-name") + 1]
        request = asyncio.create_task(http.post(f"{url}/v1/completions", json={"model": model, "prompt": "x"}))
        await asyncio.sleep(0.2)
        assert (await EngineClient(http).in_flight(address, runtime)).total == 1
        assert await EngineClient(http).sleep(address, runtime) == ""
        answer = await request
        assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] == "stop"
        metrics = (await http.get(f"{url}/metrics")).text
        assert value(metrics, "vllm:request_success_total", finished_reason="abort") == 0


async def test_a_drain_that_outlasts_its_timeout_is_a_failed_sleep_and_the_engine_stays_awake() -> None:
    runtime, args, env = replica("vllm/vllm-openai:v0.11.0")
    assert runtime.profile.sleep is not None
    short = dataclasses.replace(runtime, profile=dataclasses.replace(
        runtime.profile, sleep=dataclasses.replace(runtime.profile.sleep, drain_timeout_s=1.0)))
    waited: list[float] = []

    async def clock(seconds: float) -> None:  # time moved by hand: the drain polls without waiting
        waited.append(seconds)

    async with standin("vllm", *args, **env, INFER_CTL_SANDBOX_SERVICE_TIME_MS="5000",
                       INFER_CTL_SANDBOX_ENGINE_VERSION="0.11.0") as url, httpx.AsyncClient(timeout=10) as http:
        address = url.removeprefix("http://")
        model = args[args.index("--served-model-name") + 1]
        request = asyncio.create_task(http.post(f"{url}/v1/completions", json={"model": model, "prompt": "x"}))
        await asyncio.sleep(0.2)
        why = await EngineClient(http, sleep_s=clock).sleep(address, short)
        assert why == "not drained: still 1 running and 0 waiting after the drain's 1 s"
        assert sum(waited) == 1.0
        assert (await http.get(f"{url}/is_sleeping")).json() == {"is_sleeping": False}
        request.cancel()


async def test_a_replica_started_without_sleep_mode_refuses_the_sleep_as_vllm_does() -> None:
    runtime, args, env = replica("vllm/vllm-openai:v0.16.0", sleeps=False)
    assert "--enable-sleep-mode" not in args and env == {}
    async with standin("vllm", *args) as url, httpx.AsyncClient(timeout=10) as http:
        why = await EngineClient(http).sleep(url.removeprefix("http://"), runtime)
    assert why.startswith("HTTP 404")  # no dev mode: the sleep routes do not exist


@pytest.mark.parametrize(("status", "body", "expected"), [
    pytest.param(500, {"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}},
                 "HTTP 500: CUDA out of memory", id="vLLM's error envelope"),
    pytest.param(404, {"object": "error", "message": "The model `x` does not exist.", "code": 404},
                 "HTTP 404: The model `x` does not exist.", id="older vLLM's envelope"),
    pytest.param(404, {"detail": "Not Found"}, "HTTP 404: Not Found", id="FastAPI's unknown route"),
    pytest.param(503, None, "HTTP 503: busy", id="a body that is not JSON"),
])
def test_a_refusal_reads_as_the_engine_said_it(status: int, body: object, expected: str) -> None:
    answer = httpx.Response(status, json=body) if body is not None else httpx.Response(status, text="busy")
    assert refusal(answer) == expected
