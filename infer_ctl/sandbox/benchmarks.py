"""Sandbox benchmarks (run by hand; they print figures): `python -m infer_ctl.sandbox.benchmarks [pods|api|watch]`.

Each starts `infer-ctl sandbox up` as a separate process (so the load generator does not share the server's
interpreter) and stops it afterwards.

- pods:  100 model-server pods (cold start 0) created -> bound -> Ready, wall time (target <= 10 s).
- api:   open-loop 200 requests/s of mixed get / list (label selector) / merge patch for 10 s; p50/p99 (<= 20 ms).
- watch: 500 writes at 50/s while a watch is open; delay from sending the write to receiving its event (p99 <= 50 ms).
- dra:   the scheduler alone (in-process) on deploy/sandbox/large.yaml (60 nodes, 1,600 devices): 100 pods with
         claims from templates (whole H100 pairs and dynamic-MIG 1g.10gb slices) in one cycle, then one more pod.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import numpy as np

from infer_ctl.config.cluster import load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.paths import data_path
from infer_ctl.sandbox.scheduler import Scheduler
from infer_ctl.sandbox.store import Store
from infer_ctl.sandbox.testing import pod

NS = "/api/v1/namespaces/default"


@contextlib.contextmanager
def sandbox_process(cluster: Path) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        process = subprocess.Popen(
            [sys.executable, "-m", "infer_ctl.cli.main", "sandbox", "up", "--cluster", str(cluster),
             "--kubeconfig", f"{tmp}/kubeconfig"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert process.stdout is not None
        url = ""
        for line in process.stdout:
            if "API server:" in line:
                url = line.split()[-1]
            if line.startswith("Ctrl-C"):
                break
        try:
            yield url
        finally:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=60)


def percentiles(values_s: list[float]) -> str:
    ms = np.array(values_s) * 1000
    return (f"n={len(ms)} p50={np.percentile(ms, 50):.2f} ms p90={np.percentile(ms, 90):.2f} ms "
            f"p99={np.percentile(ms, 99):.2f} ms max={ms.max():.2f} ms")


def bench_pods(url: str, count: int = 100) -> None:
    http = httpx.Client(base_url=url, timeout=30)
    rv = http.get(f"{NS}/pods").json()["metadata"]["resourceVersion"]
    start = time.perf_counter()
    for i in range(count):
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"bench-{i}", "labels": {"bench": "pods"},
                             "annotations": {"sandbox.infer-ctl.io/cold-start-seconds": "0"}},
                "spec": {"containers": [{"name": "server", "image": "model-server", "resources": {
                    "requests": {"cpu": "100m", "memory": "256Mi"}}}],
                         "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}
        assert http.post(f"{NS}/pods", json=body).status_code == 201
    created = time.perf_counter() - start
    bound: dict[str, float] = {}
    ready: dict[str, float] = {}
    with http.stream("GET", f"{NS}/pods", params={"watch": "true", "resourceVersion": rv,
                                                  "labelSelector": "bench=pods", "timeoutSeconds": 60}) as r:
        for line in r.iter_lines():
            obj = json.loads(line)["object"]
            name = obj["metadata"]["name"]
            if obj["spec"].get("nodeName"):
                bound.setdefault(name, time.perf_counter() - start)
            if any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"].get("conditions", [])):
                ready.setdefault(name, time.perf_counter() - start)
            if len(ready) == count:
                break
    print(f"pods: {count} created in {created:.2f} s, all bound after {max(bound.values()):.2f} s, "
          f"all Ready after {max(ready.values()):.2f} s (target <= 10 s)")
    http.request("DELETE", f"{NS}/pods", params={"labelSelector": "bench=pods"})


async def _api(url: str, rate_rps: float, duration_s: float) -> None:
    # aiohttp rather than httpx as the load generator: httpx's async client costs several ms of CPU per request,
    # which on two shared cores made the generator, not the server, the bottleneck.
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(base_url=url, connector=connector) as http:
        for i in range(50):
            await http.post(f"{NS}/configmaps", json={"metadata": {"name": f"cm-{i}", "labels": {
                "app": "bench" if i % 2 else "other"}}, "data": {"k": "v"}})
        latencies: dict[str, list[float]] = {"get": [], "list": [], "patch": []}
        errors = 0
        merge = {"Content-Type": "application/merge-patch+json"}

        async def one(i: int) -> None:
            nonlocal errors
            kind = ("get", "list", "patch")[i % 3]
            t0 = time.perf_counter()
            if kind == "get":
                request = http.get(f"{NS}/configmaps/cm-{i % 50}")
            elif kind == "list":
                request = http.get(f"{NS}/configmaps", params={"labelSelector": "app=bench"})
            else:
                request = http.patch(f"{NS}/configmaps/cm-{i % 50}", data=json.dumps({"data": {"i": str(i)}}),
                                     headers=merge)
            async with request as response:
                await response.read()
                if response.status >= 400:
                    errors += 1
            latencies[kind].append(time.perf_counter() - t0)

        total = int(rate_rps * duration_s)
        begin = time.perf_counter()
        tasks = []
        for i in range(total):
            delay = begin + i / rate_rps - time.perf_counter()  # open loop: send on schedule, never wait
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - begin
        every = [v for values in latencies.values() for v in values]
        print(f"api: {total} requests in {elapsed:.1f} s ({total / elapsed:.0f} req/s), {errors} errors; "
              f"all {percentiles(every)} (target p99 <= 20 ms)")
        for kind, values in latencies.items():
            print(f"  {kind:5s} {percentiles(values)}")


async def _watch(url: str, writes: int, rate_rps: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await http.post(f"{NS}/configmaps", json={"metadata": {"name": "watched"}, "data": {}})
        rv = (await http.get(f"{NS}/configmaps/watched")).json()["metadata"]["resourceVersion"]
        sent: dict[str, float] = {}
        delays: list[float] = []

        async def reader() -> None:
            params = {"watch": "true", "resourceVersion": rv, "fieldSelector": "metadata.name=watched",
                      "timeoutSeconds": str(int(writes / rate_rps) + 30)}
            async with http.stream("GET", f"{NS}/configmaps", params=params) as response:
                async for line in response.aiter_lines():
                    received = time.perf_counter()
                    seq = json.loads(line)["object"].get("data", {}).get("seq")
                    if seq in sent:
                        delays.append(received - sent[seq])
                    if len(delays) == writes:
                        return

        task = asyncio.create_task(reader())
        await asyncio.sleep(0.2)
        async with httpx.AsyncClient(base_url=url, timeout=30) as writer:
            begin = time.perf_counter()
            for i in range(writes):
                delay = begin + i / rate_rps - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                sent[str(i)] = time.perf_counter()
                await writer.patch(f"{NS}/configmaps/watched", json={"data": {"seq": str(i)}},
                                   headers={"Content-Type": "application/merge-patch+json"})
        await asyncio.wait_for(task, 30)
        print(f"watch: delivery delay (write sent -> event received) {percentiles(delays)} (target p99 <= 50 ms)")


def bench_dra() -> None:
    store = Store()
    for obj in load_cluster(data_path("deploy/sandbox/large.yaml"), load_policies().catalog).objects():
        store.create(store.type_for_kind(obj["apiVersion"], obj["kind"]), None, obj, keep_status=True)
    scheduler = Scheduler(store)
    templates = store.type("resource.k8s.io", "v1", "resourceclaimtemplates")
    pods = store.type("", "v1", "pods")
    profile = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    store.create(templates, "default", {"metadata": {"name": "mig"}, "spec": {"spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {
            "expression": profile}}]}}]}}}})
    store.create(templates, "default", {"metadata": {"name": "pair"}, "spec": {"spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}})
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    for i in range(100):
        store.create(pods, "default", pod(f"p{i}", claim_templates={"gpu": "mig" if i % 2 else "pair"},
                                          tolerations=toleration))
    start = time.perf_counter()
    bound = scheduler.cycle()
    first = time.perf_counter() - start
    store.create(pods, "default", pod("one-more", claim_templates={"gpu": "mig"}, tolerations=toleration))
    start = time.perf_counter()
    scheduler.cycle()
    print(f"dra: large.yaml, {bound} pods with claims bound in one cycle in {first:.2f} s; "
          f"the next single-pod cycle {1000 * (time.perf_counter() - start):.0f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infer_ctl.sandbox.benchmarks")
    parser.add_argument("which", nargs="*", default=["pods", "api", "watch", "dra"],
                        choices=["pods", "api", "watch", "dra"])
    parser.add_argument("--cluster", type=Path, default=data_path("deploy/sandbox/small.yaml"))
    parser.add_argument("--rate", type=float, default=200.0, help="api: requests per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="api: duration")
    args = parser.parse_args(argv)
    for which in args.which:
        if which == "dra":
            bench_dra()
            continue
        with sandbox_process(args.cluster) as url:
            if which == "pods":
                bench_pods(url)
            elif which == "api":
                asyncio.run(_api(url, args.rate, args.seconds))
            else:
                asyncio.run(_watch(url, 500, 50.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
