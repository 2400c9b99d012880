"""The SGLang stand-in behaves as SGLang's server does where a controller or a client can see it."""

from __future__ import annotations

import asyncio

import httpx

from tests.sandbox.standin_helpers import standin, value


async def test_metrics_exist_only_with_enable_metrics_and_carry_sglang_s_labels() -> None:
    async with standin("sglang", "--model-path", "org/m") as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/metrics")).status_code == 404
    async with standin("sglang", "--model-path", "org/m", "--served-model-name", "llm", "--enable-metrics") as url, \
            httpx.AsyncClient(base_url=url) as http:
        assert (await http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 4}})
                ).json()["meta_info"]["completion_tokens"] == 4
        metrics = (await http.get("/metrics")).text
        assert value(metrics, "sglang:num_requests_total", model_name="llm", engine_type="unified") == 1
        assert value(metrics, "sglang:num_running_reqs", tp_rank="0", pp_rank="0") == 0


async def test_an_idle_server_releases_its_memory_and_a_request_then_waits_for_the_resume() -> None:
    async with standin("sglang", "--model-path", "m", "--enable-memory-saver") as url, \
            httpx.AsyncClient(base_url=url, timeout=10) as http:
        assert (await http.post("/release_memory_occupation", json={})).status_code == 200
        request = asyncio.create_task(http.post("/v1/completions", json={"model": "m", "prompt": "x"}))
        await asyncio.sleep(0.3)
        assert not request.done()
        assert (await http.post("/resume_memory_occupation", json={})).status_code == 200
        assert (await request).status_code == 200


async def test_a_release_on_a_busy_server_kills_it_as_the_scheduler_s_idle_assertion_does() -> None:
    async with standin("sglang", "--model-path", "m", "--enable-memory-saver",
                       INFER_CTL_SANDBOX_SERVICE_TIME_MS="2000") as url, \
            httpx.AsyncClient(base_url=url, timeout=5) as http:
        busy = asyncio.create_task(http.post("/v1/completions", json={"model": "m", "prompt": "x"}))
        await asyncio.sleep(0.3)
        try:
            await http.post("/release_memory_occupation", json={})
            raise AssertionError("the release was answered")
        except httpx.TransportError:
            pass
        busy.cancel()
        await asyncio.sleep(0.3)
        try:
            await http.get("/health")
            raise AssertionError("the server still answers")
        except httpx.TransportError:
            pass
