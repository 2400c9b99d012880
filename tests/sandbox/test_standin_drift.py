"""Each name, label, bucket and route a stand-in exports, with the upstream file it comes from: a stand-in whose
/metrics or routes differ from this table fails here, so a drift from the engine shows (and so does a change of
the table without its source)."""

from __future__ import annotations

import httpx

from tests.sandbox.standin_helpers import families, standin

VLLM_LOGGERS = "vllm-project/vllm: vllm/v1/metrics/loggers.py (PrometheusStatLogger)"
VLLM_SLEEP = "vllm-project/vllm: vllm/entrypoints/serve/sleep/api_router.py (dev/sleep/ in the newest tree)"
VLLM_SERVER = "vllm-project/vllm: vllm/entrypoints/openai/api_server.py"
SGLANG_COLLECTOR = "sgl-project/sglang: python/sglang/srt/metrics/collector.py"
SGLANG_HTTP = "sgl-project/sglang: python/sglang/srt/entrypoints/http_server.py"

VLLM_TIMES = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
              960.0, 1920.0, 7680.0)
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ENGINE = {"model_name", "engine"}
# name -> (type, labels, buckets, source)
VLLM_METRICS: dict[str, tuple[str, set[str], tuple[float, ...], str]] = {
    "vllm:num_requests_running": ("gauge", ENGINE, (), VLLM_LOGGERS),
    "vllm:num_requests_waiting": ("gauge", ENGINE, (), VLLM_LOGGERS),
    "vllm:kv_cache_usage_perc": ("gauge", ENGINE, (), VLLM_LOGGERS),
    "vllm:engine_sleep_state": ("gauge", ENGINE | {"sleep_state"}, (), VLLM_LOGGERS),
    "vllm:prefix_cache_queries_total": ("counter", ENGINE, (), VLLM_LOGGERS),
    "vllm:prefix_cache_hits_total": ("counter", ENGINE, (), VLLM_LOGGERS),
    "vllm:num_preemptions_total": ("counter", ENGINE, (), VLLM_LOGGERS),
    "vllm:prompt_tokens_total": ("counter", ENGINE, (), VLLM_LOGGERS),
    "vllm:generation_tokens_total": ("counter", ENGINE, (), VLLM_LOGGERS),
    "vllm:request_success_total": ("counter", ENGINE | {"finished_reason"}, (), VLLM_LOGGERS),
    "vllm:time_to_first_token_seconds": ("histogram", ENGINE, (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
        160.0, 640.0, 2560.0), VLLM_LOGGERS),
    "vllm:inter_token_latency_seconds": ("histogram", ENGINE, VLLM_ITL, VLLM_LOGGERS),
    "vllm:e2e_request_latency_seconds": ("histogram", ENGINE, VLLM_TIMES, VLLM_LOGGERS),
    "vllm:request_queue_time_seconds": ("histogram", ENGINE, VLLM_TIMES, VLLM_LOGGERS),
    "vllm:request_inference_time_seconds": ("histogram", ENGINE, VLLM_TIMES, VLLM_LOGGERS),
    "vllm:request_prefill_time_seconds": ("histogram", ENGINE, VLLM_TIMES, VLLM_LOGGERS),
    "vllm:request_decode_time_seconds": ("histogram", ENGINE, VLLM_TIMES, VLLM_LOGGERS),
}
# (method, path, status of an empty request in dev mode) -> source
VLLM_ROUTES = {
    ("GET", "/health", 200): VLLM_SERVER,
    ("GET", "/v1/models", 200): VLLM_SERVER,
    ("GET", "/metrics", 200): VLLM_SERVER,
    ("GET", "/is_sleeping", 200): VLLM_SLEEP,
    ("POST", "/wake_up", 200): VLLM_SLEEP,
    ("POST", "/sleep", 200): VLLM_SLEEP,
}

SCHEDULER = {"model_name", "engine_type", "tp_rank", "pp_rank"}
TOKENIZER = {"model_name", "engine_type"}
SGLANG_METRICS: dict[str, tuple[str, set[str], tuple[float, ...], str]] = {
    "sglang:num_running_reqs": ("gauge", SCHEDULER, (), SGLANG_COLLECTOR),
    "sglang:num_queue_reqs": ("gauge", SCHEDULER, (), SGLANG_COLLECTOR),
    "sglang:token_usage": ("gauge", SCHEDULER, (), SGLANG_COLLECTOR),
    "sglang:num_used_tokens": ("gauge", SCHEDULER, (), SGLANG_COLLECTOR),
    "sglang:gen_throughput": ("gauge", SCHEDULER, (), SGLANG_COLLECTOR),
    "sglang:cache_hit_rate": ("gauge", SCHEDULER, (), SGLANG_COLLECTOR),
    "sglang:prompt_tokens_total": ("counter", TOKENIZER, (), SGLANG_COLLECTOR),
    "sglang:generation_tokens_total": ("counter", TOKENIZER, (), SGLANG_COLLECTOR),
    "sglang:num_requests_total": ("counter", TOKENIZER, (), SGLANG_COLLECTOR),
    "sglang:num_aborted_requests_total": ("counter", TOKENIZER, (), SGLANG_COLLECTOR),
    "sglang:time_to_first_token_seconds": ("histogram", TOKENIZER, (
        0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400), SGLANG_COLLECTOR),
    "sglang:e2e_request_latency_seconds": ("histogram", TOKENIZER, (
        0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400),
        SGLANG_COLLECTOR),
    "sglang:inter_token_latency_seconds": ("histogram", TOKENIZER, (
        0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.200,
        0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0), SGLANG_COLLECTOR),
}
SGLANG_ROUTES = {
    ("GET", "/health", 200): SGLANG_HTTP,
    ("GET", "/health_generate", 200): SGLANG_HTTP,
    ("GET", "/v1/models", 200): SGLANG_HTTP,
    ("GET", "/get_model_info", 200): SGLANG_HTTP,
    ("GET", "/metrics", 200): SGLANG_HTTP,
    ("POST", "/resume_memory_occupation", 200): SGLANG_HTTP,
    ("POST", "/release_memory_occupation", 200): SGLANG_HTTP,
}


def exported(text: str) -> dict[str, tuple[str, set[str], tuple[float, ...]]]:
    """The exposition's families, without prometheus_client's `_created` companions (the engines use the same
    client library, so they carry them too)."""
    return {name: (str(f["type"]), set(f["labels"]), tuple(f["buckets"]))  # type: ignore[call-overload]
            for name, f in families(text).items() if not name.endswith("_created")}


def table(metrics: dict[str, tuple[str, set[str], tuple[float, ...], str]]
          ) -> dict[str, tuple[str, set[str], tuple[float, ...]]]:
    return {name: (kind, labels, tuple(float(b) for b in buckets))
            for name, (kind, labels, buckets, source) in metrics.items() if source}


async def test_the_vllm_stand_in_exports_exactly_the_names_labels_buckets_and_routes_of_its_table() -> None:
    async with standin("vllm", "m", "--enable-sleep-mode", VLLM_SERVER_DEV_MODE="1") as url, \
            httpx.AsyncClient(base_url=url) as http:
        assert exported((await http.get("/metrics")).text) == table(VLLM_METRICS)
        for method, path, status in VLLM_ROUTES:
            assert (await http.request(method, path)).status_code == status, (method, path)


async def test_the_sglang_stand_in_exports_exactly_the_names_labels_buckets_and_routes_of_its_table() -> None:
    async with standin("sglang", "--model-path", "m", "--enable-metrics", "--enable-memory-saver") as url, \
            httpx.AsyncClient(base_url=url) as http:
        assert exported((await http.get("/metrics")).text) == table(SGLANG_METRICS)
        for method, path, status in SGLANG_ROUTES:
            assert (await http.request(method, path, json={})).status_code == status, (method, path)
