"""The vLLM stand-in behaves as vLLM's server does where a controller or a client can see it."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import httpx

from tests.sandbox.standin_helpers import standin, value

DEV = {"VLLM_SERVER_DEV_MODE": "1"}
SLOW = {"INFER_CTL_SANDBOX_SERVICE_TIME_MS": "600"}


async def test_it_listens_after_the_load_and_answers_health_models_and_a_completion_with_usage() -> None:
    async with standin("vllm", "org/model", "--served-model-name", "llm", "alias") as url, \
            httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/health")).status_code == 200
        assert [m["id"] for m in (await http.get("/v1/models")).json()["data"]] == ["llm", "alias"]
        answer = (await http.post("/v1/chat/completions", json={"model": "alias", "messages": [
            {"role": "user", "content": "hi"}]})).json()
        assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] > 0
        metrics = (await http.get("/metrics")).text
        assert value(metrics, "vllm:request_success_total", finished_reason="stop", model_name="llm",
                     engine="0") == 1


async def test_a_wrong_model_is_answered_404_with_vllm_s_error_json() -> None:
    async with standin("vllm", "--model", "org/model") as url, httpx.AsyncClient(base_url=url) as http:
        answer = await http.post("/v1/completions", json={"model": "other", "prompt": "x"})
        assert answer.status_code == 404
        assert answer.json() == {"error": {"message": "The model `other` does not exist.", "type": "NotFoundError",
                                           "param": "model", "code": 404}}


async def test_an_unknown_flag_fails_at_start_with_argparse_s_error() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "infer_ctl.sandbox.modelserver", "vllm", "m", "--no-such-flag",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await process.communicate()
    assert process.returncode == 2
    assert b"unrecognized arguments: --no-such-flag" in err


async def test_sleep_routes_exist_only_in_dev_mode_and_sleeping_needs_enable_sleep_mode() -> None:
    async with standin("vllm", "m", "--enable-sleep-mode") as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.post("/sleep?level=1")).status_code == 404
        assert (await http.get("/is_sleeping")).status_code == 404
    async with standin("vllm", "m", **DEV) as url, httpx.AsyncClient(base_url=url) as http:
        refused = await http.post("/sleep?level=1")
        assert refused.status_code == 500 and refused.json()["error"]["type"] == "InternalServerError"
        assert (await http.get("/is_sleeping")).json() == {"is_sleeping": False}


async def test_a_sleep_with_mode_wait_lets_the_request_in_flight_finish() -> None:
    async with standin("vllm", "m", "--enable-sleep-mode", **DEV, **SLOW) as url, \
            httpx.AsyncClient(base_url=url, timeout=10) as http:
        request = asyncio.create_task(http.post("/v1/completions", json={"model": "m", "prompt": "x"}))
        await asyncio.sleep(0.2)
        assert (await http.post("/sleep?level=1&mode=wait")).status_code == 200
        assert (await request).json()["choices"][0]["finish_reason"] == "stop"
        metrics = (await http.get("/metrics")).text
        assert value(metrics, "vllm:engine_sleep_state", sleep_state="weights_offloaded") == 1
        assert value(metrics, "vllm:engine_sleep_state", sleep_state="awake") == 0


async def test_a_sleep_with_the_default_mode_aborts_the_request_in_flight() -> None:
    async with standin("vllm", "m", "--enable-sleep-mode", **DEV, **SLOW) as url, \
            httpx.AsyncClient(base_url=url, timeout=10) as http:
        request = asyncio.create_task(http.post("/v1/completions", json={"model": "m", "prompt": "x"}))
        await asyncio.sleep(0.2)
        assert (await http.post("/sleep?level=1")).status_code == 200
        assert (await request).json()["choices"][0]["finish_reason"] == "abort"
        assert value((await http.get("/metrics")).text, "vllm:request_success_total", finished_reason="abort") == 1


async def test_a_request_sent_while_asleep_waits_for_the_wake_in_recent_releases() -> None:
    async with standin("vllm", "m", "--enable-sleep-mode", **DEV) as url, \
            httpx.AsyncClient(base_url=url, timeout=10) as http:
        await http.post("/sleep?level=1")
        request = asyncio.create_task(http.post("/v1/completions", json={"model": "m", "prompt": "x"}))
        await asyncio.sleep(0.3)
        assert not request.done()
        assert value((await http.get("/metrics")).text, "vllm:num_requests_waiting") == 1
        assert (await http.post("/wake_up")).status_code == 200
        assert (await request).status_code == 200


async def test_a_request_sent_while_asleep_fails_in_releases_before_the_pause_rework() -> None:
    async with standin("vllm", "m", "--enable-sleep-mode", INFER_CTL_SANDBOX_ENGINE_VERSION="0.11.0", **DEV) as url, \
            httpx.AsyncClient(base_url=url, timeout=10) as http:
        await http.post("/sleep?level=1")
        answer = await http.post("/v1/completions", json={"model": "m", "prompt": "x"})
        assert answer.status_code == 500 and answer.json()["error"]["code"] == 500
        assert "vllm:engine_sleep_state" not in (await http.get("/metrics")).text


async def test_a_client_that_goes_away_aborts_its_request_and_frees_its_slot() -> None:
    async with standin("vllm", "m", INFER_CTL_SANDBOX_CONCURRENCY="1", **SLOW) as url, \
            httpx.AsyncClient(base_url=url, timeout=10) as http:
        with_timeout = httpx.AsyncClient(base_url=url, timeout=0.2)
        with contextlib.suppress(httpx.TimeoutException):
            await with_timeout.post("/v1/completions", json={"model": "m", "prompt": "x"})
        await with_timeout.aclose()
        await asyncio.sleep(0.1)
        assert value((await http.get("/metrics")).text, "vllm:num_requests_running") == 0
        assert value((await http.get("/metrics")).text, "vllm:request_success_total", finished_reason="abort") == 1
