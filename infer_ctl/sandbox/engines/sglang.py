"""SGLang's HTTP server, as `python -m sglang.launch_server` runs it (facts and sources: /work/wt/FACTS-engines.md).

Routes (python/sglang/srt/entrypoints/http_server.py): `GET /health`, `GET /health_generate`, `GET /v1/models`,
`POST /v1/completions`, `POST /v1/chat/completions`, `POST /generate`, `GET /get_model_info`, `GET|POST
/release_memory_occupation`, `GET|POST /resume_memory_occupation`; `GET /metrics` only with `--enable-metrics`.
A release frees memory only with `--enable-memory-saver` (without it the adapter is a no-op: 200, nothing freed);
on a busy server the scheduler's `is_fully_idle()` assertion fails and the server dies with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from infer_ctl.sandbox.engines.batch import Aborted, Batch
from infer_ctl.sandbox.engines.hardware import Hardware, Ledger
from infer_ctl.sandbox.engines.http import ASLEEP_REQUEST, Answer, empty, exposition, ignore, json_answer

DEFAULT_PORT = 30000
# python/sglang/srt/metrics/collector.py (TokenizerMetricsCollector defaults)
TTFT_BUCKETS_S = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS_S = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS_S = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
                 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)
IDLE_ASSERTION = "release_memory_occupation should be called only when server is idle."


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-memory-saver", action="store_true")
    p.add_argument("--log-level", default="info")
    p.add_argument("--api-key", default=None)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--disable-radix-cache", action="store_true")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return parser().parse_args(list(argv))


class SglangEngine:
    def __init__(self, args: argparse.Namespace, hardware: Hardware) -> None:
        self.args = args
        self.hw = hardware
        self.emit: Callable[[str], None] = ignore  # a line on the process's stdout
        self.name: str = args.served_model_name or args.model_path
        slots = min(hardware.concurrency, args.max_running_requests) if args.max_running_requests \
            else hardware.concurrency
        self.batch = Batch(slots)
        self.ledger = Ledger(hardware.agent_url)
        self.released = False
        self.transition = asyncio.Lock()
        self.crashed = asyncio.Event()
        self.registry = CollectorRegistry()
        r = self.registry
        scheduler = {"model_name": self.name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
        tokenizer = {"model_name": self.name, "engine_type": "unified"}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, list(scheduler), registry=r).labels(**scheduler)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, list(tokenizer), registry=r).labels(**tokenizer)

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, list(tokenizer), buckets=buckets, registry=r).labels(**tokenizer)

        self.running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.queued = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.prompt_tokens = counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.")
        self.generation_tokens = counter("sglang:generation_tokens_total", "Number of generation tokens processed.")
        self.requests = counter("sglang:num_requests_total", "Number of requests processed.")
        self.aborted = counter("sglang:num_aborted_requests_total", "Number of requests aborted.")
        self.ttft = histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS_S)
        self.itl = histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS_S)
        self.e2e = histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             E2E_BUCKETS_S)

    def watched(self, method: str, path: str) -> bool:
        return method == "POST" and (path.startswith("/v1/") or path == "/generate")

    async def route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> Answer:
        if path == "/metrics" and method == "GET" and self.args.enable_metrics:
            self.running.set(self.batch.running)
            self.queued.set(self.batch.waiting)
            self.token_usage.set(self.batch.running / self.batch.capacity)
            return exposition(self.registry)
        if path == "/health" and method == "GET":
            return empty()
        if path == "/health_generate" and method == "GET":
            return empty(503 if self.released else 200)
        if path == "/get_model_info" and method == "GET":
            return json_answer(200, {"model_path": self.args.model_path, "tokenizer_path": self.args.tokenizer_path
                                     or self.args.model_path, "is_generation": True})
        if path == "/v1/models" and method == "GET":
            return json_answer(200, {"object": "list", "data": [
                {"id": self.name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                 "root": self.name, "max_model_len": self.args.context_length or 4096}]})
        if path in ("/v1/completions", "/v1/chat/completions", "/generate") and method == "POST":
            if self.released:
                self.emit(ASLEEP_REQUEST)  # the sandbox's record of a request routed to a released engine
            return await self.infer(path, body)
        if path == "/release_memory_occupation" and method in ("GET", "POST"):
            return await self.release()
        if path == "/resume_memory_occupation" and method in ("GET", "POST"):
            return await self.resume()
        return json_answer(404, {"detail": "Not Found"})

    async def infer(self, path: str, body: bytes) -> Answer:
        arrived = time.perf_counter()
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as e:
            return json_answer(400, {"object": "error", "message": str(e), "type": "BadRequestError", "code": 400})
        params = request.get("sampling_params") if path == "/generate" else request
        max_tokens = (params or {}).get("max_new_tokens" if path == "/generate" else "max_tokens")
        generated, service_s = self.hw.work(max_tokens)
        prompt_tokens = max(1, len(json.dumps(request.get("text") or request.get("prompt")
                                              or request.get("messages"))) // 4)
        try:
            timing = await self.batch.run(service_s)
            reason = "length" if max_tokens else "stop"
        except Aborted:
            timing, reason, generated = None, "abort", 0
        except asyncio.CancelledError:
            self.aborted.inc()
            raise
        self.requests.inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated)
        if timing is None:
            self.aborted.inc()
        else:
            step_s = timing.service_s / max(1, generated)
            self.ttft.observe(timing.queue_s + step_s)
            self.itl.observe(step_s)
            self.e2e.observe(time.perf_counter() - arrived)
        text = " ".join(["token"] * min(generated, 64))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                 "total_tokens": prompt_tokens + generated}
        if path == "/generate":
            return json_answer(200, {"text": text, "meta_info": {
                "id": uuid.uuid4().hex, "prompt_tokens": prompt_tokens, "completion_tokens": generated,
                "finish_reason": {"type": reason}, "e2e_latency": time.perf_counter() - arrived}})
        model = request.get("model") or self.name
        if path == "/v1/completions":
            return json_answer(200, {"id": uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
                                     "model": model, "choices": [{"index": 0, "text": text, "logprobs": None,
                                                                  "finish_reason": reason}], "usage": usage})
        return json_answer(200, {"id": uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
                                 "model": model, "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                      "content": text},
                                                              "logprobs": None, "finish_reason": reason}],
                                 "usage": usage})

    async def release(self) -> Answer:
        async with self.transition:
            if self.batch.running or self.batch.waiting:
                # The scheduler's assertion: the exception kills the scheduler, and the server with it.
                print(f"Scheduler hit an exception: AssertionError: {IDLE_ASSERTION}", flush=True)
                self.crashed.set()
                await asyncio.sleep(3600)
            if not self.args.enable_memory_saver or self.released:
                return json_answer(200, None)
            refused = await self.ledger.call("reserve", "host")
            if refused is not None:
                return json_answer(400, {"error": {"message": refused}})
            self.batch.pause()
            await asyncio.sleep(self.hw.sleep_s())
            self.released = True
            await self.ledger.call("release", "device")
        return json_answer(200, None)

    async def resume(self) -> Answer:
        async with self.transition:
            if not self.args.enable_memory_saver or not self.released:
                return json_answer(200, None)
            refused = await self.ledger.call("reserve", "device")
            if refused is not None:
                return json_answer(400, {"error": {"message": f"CUDA out of memory: {refused}"}})
            await asyncio.sleep(self.hw.wake_s())
            self.released = False
            self.batch.resume()
            await self.ledger.call("release", "host")
        return json_answer(200, None)

    async def drain(self) -> None:
        await self.batch.wait_drained()
