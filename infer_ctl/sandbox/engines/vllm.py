"""vLLM's OpenAI-compatible server, as `vllm serve` runs it (facts and sources: /work/wt/FACTS-engines.md).

Routes: `GET /health`, `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`, `GET /metrics`; with
`VLLM_SERVER_DEV_MODE=1` also `POST /sleep?level=&mode=`, `POST /wake_up?tags=`, `GET /is_sleeping`
(vllm/entrypoints/serve/sleep/api_router.py). Sleeping needs `--enable-sleep-mode` (else the engine fails the
call: 500). From 0.16.0 (`MODE_SINCE`) a sleep pauses the scheduler first, aborting the requests in flight
(`mode=abort`, the default) or letting them finish (`mode=wait`), and a request sent while asleep waits for the
wake; before, a sleep does not wait and a request on a sleeping engine fails (500).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from infer_ctl.sandbox.engines.batch import Aborted, Batch, Timing
from infer_ctl.sandbox.engines.hardware import Hardware, Ledger, at_least
from infer_ctl.sandbox.engines.http import ASLEEP_REQUEST, Answer, empty, exposition, ignore, json_answer

DEFAULT_PORT = 8000
MODE_SINCE = (0, 16, 0)  # vllm PR #34528 (merged 2026-02-13): sleep(level, mode) pauses the scheduler first
SLEEP_STATE_SINCE = (0, 16, 0)  # vllm:engine_sleep_state came with the same rework
# vllm/v1/metrics/loggers.py (PrometheusStatLogger)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                             120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # vllm/v1/engine/__init__.py
FINISHED_REASONS_BEFORE_0_11 = ("stop", "length", "abort")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")


def parser() -> argparse.ArgumentParser:
    """`vllm serve`'s flags that a Pod template uses; any other flag is an error, as vLLM's argparse makes it."""
    p = argparse.ArgumentParser(prog="vllm serve")
    p.add_argument("model_tag", nargs="?", default=None, help="the model (overrides --model)")
    p.add_argument("--model", default=None)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--enable-sleep-mode", action="store_true")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", "-q", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--download-dir", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--revision", default=None)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--swap-space", type=float, default=4)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--disable-log-requests", action="store_true")
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--uvicorn-log-level", default="info")
    p.add_argument("--api-key", default=None)
    p.add_argument("--generation-config", default="auto")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    args = parser().parse_args(list(argv))
    if args.model_tag is not None:
        args.model = args.model_tag
    if not args.model:
        parser().error("a model is required: `vllm serve MODEL` or --model MODEL")
    return args


def _error(status: int, message: str, kind: str, param: str | None = None) -> Answer:
    """vLLM's ErrorResponse (vllm/entrypoints/openai/protocol.py)."""
    return json_answer(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})


class VllmEngine:
    def __init__(self, args: argparse.Namespace, hardware: Hardware, env: dict[str, str]) -> None:
        self.args = args
        self.hw = hardware
        self.emit: Callable[[str], None] = ignore  # a line on the process's stdout
        self.names: list[str] = list(args.served_model_name or [args.model])
        self.dev_mode = env.get("VLLM_SERVER_DEV_MODE", "").lower() in ("1", "true")
        self.has_mode = at_least(hardware.engine_version, MODE_SINCE)
        slots = min(hardware.concurrency, args.max_num_seqs) if args.max_num_seqs else hardware.concurrency
        self.batch = Batch(slots)
        self.ledger = Ledger(hardware.agent_url)
        self.sleep_level = 0  # 0 awake, 1 weights in host memory, 2 discarded
        self.transition = asyncio.Lock()
        self.created = int(time.time())
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        values = {"model_name": self.names[0], "engine": "0"}
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                             labels, registry=r).labels(**values)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                             labels, registry=r).labels(**values)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                              labels, registry=r).labels(**values)
        self.sleep_state: dict[str, Gauge] = {}
        if at_least(hardware.engine_version, SLEEP_STATE_SINCE):
            family = Gauge("vllm:engine_sleep_state", "Engine sleep state; awake = 0 means engine is sleeping; "
                           "awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; "
                           "discard_all = 1 means sleep level 2.", [*labels, "sleep_state"], registry=r)
            self.sleep_state = {s: family.labels(**values, sleep_state=s) for s in SLEEP_STATES}
        for name, doc in (("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
                          ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
                          ("vllm:num_preemptions", "Cumulative number of preemption from the engine.")):
            Counter(name, doc, labels, registry=r).labels(**values)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels,
                                     registry=r).labels(**values)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels,
                                         registry=r).labels(**values)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*labels, "finished_reason"], registry=r)
        reasons = FINISHED_REASONS if at_least(hardware.engine_version, (0, 11)) else FINISHED_REASONS_BEFORE_0_11
        self.success = {reason: success.labels(**values, finished_reason=reason) for reason in reasons}

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**values)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS_S)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS_S)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS_S)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self._set_sleep_level(0)  # an engine loads awake: none starts asleep

    # ------------------------------------------------------------------------------------------ HTTP

    def watched(self, method: str, path: str) -> bool:
        return method == "POST" and path.startswith("/v1/")

    async def route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> Answer:
        if path == "/metrics" and method == "GET":
            self.running.set(self.batch.running)
            self.waiting.set(self.batch.waiting)
            self.kv_usage.set(self.batch.running / self.batch.capacity)
            return exposition(self.registry)
        if path == "/health" and method == "GET":
            return empty()
        if path == "/v1/models" and method == "GET":
            return json_answer(200, {"object": "list", "data": [self._model_card(n) for n in self.names]})
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            return await self.infer(path, body)
        if self.dev_mode and (method, path) == ("POST", "/sleep"):
            return await self.sleep(query)
        if self.dev_mode and (method, path) == ("POST", "/wake_up"):
            return await self.wake_up()
        if self.dev_mode and (method, path) == ("GET", "/is_sleeping"):
            return json_answer(200, {"is_sleeping": self.sleep_level > 0})
        known = {"/metrics", "/health", "/v1/models", "/v1/completions", "/v1/chat/completions"}
        if self.dev_mode:
            known |= {"/sleep", "/wake_up", "/is_sleeping"}
        if path in known:
            return json_answer(405, {"detail": "Method Not Allowed"})
        return json_answer(404, {"detail": "Not Found"})

    def _model_card(self, name: str) -> dict[str, object]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "vllm", "root": self.args.model,
                "parent": None, "max_model_len": self.args.max_model_len or 4096, "permission": []}

    # ------------------------------------------------------------------------------------------ requests

    async def infer(self, path: str, body: bytes) -> Answer:
        arrived = time.perf_counter()
        if self.sleep_level:
            self.emit(ASLEEP_REQUEST)  # the sandbox's record of a request routed to a sleeping engine
        try:
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as e:
            return _error(400, f"Invalid JSON body: {e}", "BadRequestError")
        model = request.get("model")
        if model not in self.names:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if self.sleep_level and not self.has_mode:
            return self._failed("the engine is sleeping: its weights are not on the device")
        max_tokens = request.get("max_tokens") or request.get("max_completion_tokens")
        generated, service_s = self.hw.work(max_tokens)
        text = json.dumps(request.get("prompt") if path == "/v1/completions" else request.get("messages"))
        prompt_tokens = max(1, len(text) // 4)
        try:
            timing = await self.batch.run(service_s)
            reason = "length" if max_tokens else "stop"
        except Aborted:
            if not self.has_mode:
                return self._failed("the engine went to sleep under the request")
            timing, reason, generated = None, "abort", 0
        except asyncio.CancelledError:
            self.success["abort"].inc()  # its client went away: vLLM aborts the request
            raise
        self._observe(arrived, timing, prompt_tokens, generated, reason)
        return json_answer(200, self._completion(path, model, prompt_tokens, generated, reason))

    def _observe(self, arrived: float, timing: Timing | None, prompt_tokens: int, generated: int,
                 reason: str) -> None:
        self.success[reason].inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generated)
        if timing is None:
            return
        # One forward pass of prefill then `generated` decode steps spread over the service time.
        step_s = timing.service_s / max(1, generated)
        self.queue.observe(timing.queue_s)
        self.ttft.observe(timing.queue_s + step_s)
        self.itl.observe(step_s)  # vLLM observes each gap; one observation of their mean keeps the CPU low
        self.prefill.observe(step_s)
        self.decode.observe(timing.service_s - step_s)
        self.inference.observe(timing.service_s)
        self.e2e.observe(time.perf_counter() - arrived)

    def _completion(self, path: str, model: str, prompt_tokens: int, generated: int, reason: str) -> dict[str, object]:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                 "total_tokens": prompt_tokens + generated}
        text = " ".join(["token"] * min(generated, 64))
        if path == "/v1/completions":
            return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                    "model": model, "choices": [{"index": 0, "text": text, "logprobs": None,
                                                 "finish_reason": reason, "stop_reason": None}], "usage": usage}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                             "logprobs": None, "finish_reason": reason, "stop_reason": None}],
                "usage": usage}

    def _failed(self, message: str) -> Answer:
        self.success.get("error", self.success["abort"]).inc()
        return _error(500, message, "InternalServerError")

    # ------------------------------------------------------------------------------------------ sleep and wake

    def _set_sleep_level(self, level: int) -> None:
        self.sleep_level = level
        for state, gauge in self.sleep_state.items():
            gauge.set(1 if SLEEP_STATES[level] == state else 0)
        if level and self.has_mode:
            self.batch.pause()  # recent engines park requests sent while asleep until the wake
        elif not level:
            self.batch.resume()

    async def sleep(self, query: dict[str, list[str]]) -> Answer:
        level_text = (query.get("level") or ["1"])[0]
        mode = (query.get("mode") or ["abort"])[0] if self.has_mode else "abort"
        try:
            level = int(level_text)
        except ValueError:
            return _error(500, f"invalid literal for int() with base 10: {level_text!r}", "InternalServerError")
        if not self.args.enable_sleep_mode:
            return _error(500, "Sleep mode is not enabled in the model config", "InternalServerError")
        if mode not in ("abort", "wait", "keep"):
            return _error(500, f"Invalid pause mode: {mode!r}", "InternalServerError")
        async with self.transition:
            if self.sleep_level:
                return empty()
            if level == 1:
                refused = await self.ledger.call("reserve", "host")
                if refused is not None:
                    return _error(500, refused, "InternalServerError")
            if self.has_mode:
                self.batch.pause()
                if mode == "abort":
                    self.batch.abort_all()
                elif mode == "wait":
                    await self.batch.wait_drained()
            else:
                self.batch.abort_all()  # an old engine offloads under its running requests: they fail
            await asyncio.sleep(self.hw.sleep_s() if level == 1 else 0)
            self._set_sleep_level(min(level, 2) or 1)
            await self.ledger.call("release", "device")
        return empty()

    async def wake_up(self) -> Answer:
        async with self.transition:
            if not self.sleep_level:
                return empty()
            refused = await self.ledger.call("reserve", "device")
            if refused is not None:
                return _error(500, f"CUDA out of memory while waking up: {refused}", "InternalServerError")
            await asyncio.sleep(self.hw.wake_s())
            was = self.sleep_level
            self._set_sleep_level(0)
            if was == 1:
                await self.ledger.call("release", "host")
        return empty()

    async def drain(self) -> None:
        """SIGTERM: in-flight requests finish (within the grace), as uvicorn's graceful shutdown lets them."""
        await self.batch.wait_drained()
