"""Stock engines end to end: an InferenceService of vLLM's image and one of SGLang's, with the shipped policies
(every query from the engine's runtime profile, no query of the test's own), run by the node agent as the
stand-ins of their images (the Pod template the controller wrote is what runs: the engine's args, port and
probes), under a load above one replica's capacity through the front door. The controller reads the engine's own
counter and gauges from each replica's /metrics and scales up; every request is answered."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from infer_ctl.controller.reconciler import Reconciler, Settings
from infer_ctl.kube.client import INFERENCE_SERVICES, PODS
from tests.builders import InferenceServiceBuilder, completion
from tests.controller.conftest import ROOT, Cluster
from tests.controller.test_reconciler import wait_for

MODEL = "example/small"


@pytest.mark.parametrize(("image", "port"), [("vllm/vllm-openai:v0.16.0", 8000), ("lmsysorg/sglang:v0.5.2", 30000)],
                         ids=["vLLM", "SGLang"])
async def test_a_stock_engine_behind_the_front_door_is_scaled_from_its_own_metrics(cluster: Cluster, image: str,
                                                                                   port: int) -> None:
    kube = cluster.kube
    name = "engine"
    kube.create(INFERENCE_SERVICES, InferenceServiceBuilder(name)
                .with_("metadata.annotations", {"sandbox.infer-ctl.io/service-time-ms": "100",
                                                "sandbox.infer-ctl.io/concurrency": "2"})
                .with_("spec.model", {"name": MODEL, "memory": "20Gi"})
                .with_("spec.runtime", {"image": image, "coldStartSeconds": 1})
                .with_("spec.scaling.maxReplicas", 4).with_("spec.scaling.targetRequestsPerReplica", 10)
                .with_("spec.scaling.forecast", {"enabled": False})
                # every objective read off the engine's own histograms (the shipped latencyHistogram: engine)
                .with_("spec.slo", {"latencyP95Ms": 5000, "timeToFirstTokenP95Ms": 2000,
                                    "interTokenLatencyP95Ms": 1000}).build(),
                "default")
    reconciler = Reconciler(kube, Settings(cluster.policies))
    history: list[tuple[float, int, float, str]] = []
    slo: dict[str, Any] = {}

    async def cycle(started: float) -> None:
        result = await reconciler.cycle(kube.get(INFERENCE_SERVICES, name, "default"), datetime.now(UTC))
        slo.update(result.status.get("slo") or {})
        desired = (result.status.get("desired") or {}).get("serving", 0)
        history.append((time.monotonic() - started, int(desired), result.output.observed_rps,
                        result.output.decision.message))

    def ready_serving() -> list[dict[str, object]]:
        return [p for p in kube.list(PODS, "default", label_selector=f"infer-ctl.io/service={name},"
                                                                     "infer-ctl.io/role=serving")
                if any(c["type"] == "Ready" and c["status"] == "True"
                       for c in (p.get("status") or {}).get("conditions") or ())]

    started = time.monotonic()
    try:
        while not ready_serving():
            assert time.monotonic() - started < 60, history
            await cycle(started)
            await asyncio.sleep(1.0)
        (first,) = ready_serving()
        container = first["spec"]["containers"][0]  # type: ignore[index]
        assert container["ports"][0]["containerPort"] == port  # the engine's default, from its profile
        url = wait_for("the front door", lambda: ((kube.get(INFERENCE_SERVICES, name, "default") or {}).get(
            "metadata", {}).get("annotations") or {}).get("sandbox.infer-ctl.io/url"))
        # 40 req/s at replicas that answer 20/s each, for 20 s
        loadgen = subprocess.Popen([sys.executable, "-m", "loadgen", f"{url}/v1/completions", "--body",
                                    completion(MODEL), "--shape", "40@20s", "--json", "--no-progress",
                                    "--max-error-ratio", "1", "--timeout", "30s"],
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        loaded = time.monotonic()
        while time.monotonic() - loaded < 20:
            await cycle(started)
            await asyncio.sleep(1.0)
        out, _ = loadgen.communicate(timeout=60)
    finally:
        await reconciler.close()
    table = "\n".join(f"{t:5.1f} s  {n} serving  {rps:5.1f} rps  {m}" for t, n, rps, m in history)
    summary = json.loads(out.strip().splitlines()[-1])
    assert max(n for _, n, _, _ in history) >= 3, table  # 40 req/s over a target of 10 a replica, within max 4
    assert max(rps for _, _, rps, _ in history if not math.isnan(rps)) >= 20, table  # read off the engine's own counter
    assert len(ready_serving()) >= 2, table
    assert summary["errors"] == 0 and summary["ok"] == summary["sent"], summary
    # the objectives' shares, scraped from the replicas' own histograms (the stand-ins' first token and steps take
    # ~100 ms here, their queue under 2 s)
    engine = "vllm" if image.startswith("vllm/") else "sglang"
    ttft, itl = slo["timeToFirstToken"], slo["interTokenLatency"]
    assert str(slo["message"]).startswith(f"{engine}:e2e_request_latency_seconds_bucket scraped from the "
                                          "replicas"), slo
    assert int(slo["requests"]) >= summary["ok"] // 2 and float(slo["attainment"]) >= 0.5, slo
    assert str(ttft["message"]).startswith(f"{engine}:time_to_first_token_seconds_bucket scraped from the "
                                           "replicas"), ttft
    assert str(itl["message"]).startswith(f"{engine}:inter_token_latency_seconds_bucket scraped from the "
                                          "replicas"), itl
    assert int(ttft["requests"]) >= summary["ok"] // 2 and float(ttft["attainment"]) >= 0.5, ttft
    assert int(itl["intervals"]) > 0 and float(itl["attainment"]) >= 0.9, itl


async def test_the_sglang_example_is_scaled_from_sglang_s_own_metrics(cluster: Cluster) -> None:
    """deploy/examples/sglang-qwen-7b.yaml (its cold start shortened, its load the test's): the controller starts
    SGLang's launcher with --enable-metrics and scales it from sglang:num_requests_total under 30 req/s."""
    body = yaml.safe_load((ROOT / "deploy/examples/sglang-qwen-7b.yaml").read_text())
    body["metadata"]["annotations"] = {"sandbox.infer-ctl.io/service-time-ms": "100",
                                       "sandbox.infer-ctl.io/concurrency": "2"}
    body["spec"]["runtime"]["coldStartSeconds"] = 1
    body["spec"]["scaling"].update(targetRequestsPerReplica=10, maxReplicas=4, forecast={"enabled": False})
    kube = cluster.kube
    kube.create(INFERENCE_SERVICES, body, "default")
    name, model = body["metadata"]["name"], body["spec"]["model"]["name"]
    reconciler = Reconciler(kube, Settings(cluster.policies))
    desired: list[int] = []
    try:
        async def cycle() -> None:
            result = await reconciler.cycle(kube.get(INFERENCE_SERVICES, name, "default"), datetime.now(UTC))
            desired.append(int((result.status.get("desired") or {}).get("serving", 0)))

        url = None
        deadline = time.monotonic() + 60
        while url is None:
            assert time.monotonic() < deadline, desired
            await cycle()
            url = ((kube.get(INFERENCE_SERVICES, name, "default") or {}).get("metadata", {}).get("annotations")
                   or {}).get("sandbox.infer-ctl.io/url")
            await asyncio.sleep(1.0)
        (pod, *_) = kube.list(PODS, "default", label_selector=f"infer-ctl.io/service={name}")
        container = pod["spec"]["containers"][0]
        assert container["command"] == ["python3", "-m", "sglang.launch_server"]
        assert "--enable-metrics" in container["args"] and container["ports"][0]["containerPort"] == 30000
        loadgen = subprocess.Popen([sys.executable, "-m", "loadgen", f"{url}/v1/completions", "--body",
                                    completion(model), "--shape", "30@15s", "--no-progress", "--max-error-ratio",
                                    "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            loaded = time.monotonic()
            while time.monotonic() - loaded < 15 and max(desired) < 3:
                await cycle()
                await asyncio.sleep(1.0)
        finally:
            loadgen.kill()
            loadgen.wait(10)
    finally:
        await reconciler.close()
    assert max(desired) >= 3, desired  # 30 req/s over a target of 10 a replica
