"""`infer-ctl demo`: the README's main job, the whole loop on the local sandbox.

It starts the sandbox (deploy/sandbox/small.yaml: H100, A100-with-MIG and L4 nodes), a real Prometheus when
Debian's `prometheus` is installed (else the controller scrapes the replicas directly), and the controller;
applies the demo's InferenceServices (deploy/demo/); drives the `chat` service through its front door with
loadgen, as a separate process, on the classic step profile 50 -> 500 -> 2 requests/s; prints a live table
(rate, forecast, replicas serving / standby / loading, the decision's reason); and ends with a summary and a
PNG plot. Everything it started stops at the end or on Ctrl-C.

`--duration` scales the three steps (default 6 minutes: 1.2 min, 2.4 min, 2.4 min: the drop lasts long enough to
show the scale-down after the stabilization window); `--rate-scale` scales the
rates, for slow machines. The demo compresses hours into minutes, and the controller's forecast grid with them:
10 s buckets instead of the default 60 s (`FORECAST_STEP_S`), or the forecast's upper bound would still hold
the peak's bucket when the demo ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer_ctl.cli.extras import missing, require
from infer_ctl.paths import data_path

DEMO_SERVICES = data_path("deploy/demo/chat.yaml")
CLUSTER = data_path("deploy/sandbox/small.yaml")
STEPS = ((50.0, 0.2), (500.0, 0.4), (2.0, 0.4))  # (req/s, share of the duration)
TICK_S = 2.0
FORECAST_STEP_S = 10.0  # the forecast grid on the demo's compressed timeline


def register(sub: Any) -> None:
    parser = sub.add_parser("demo", help="run the local demo on the sandbox", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=360.0, metavar="S",
                        help="length of the traffic profile in seconds (default 360)")
    parser.add_argument("--rate-scale", type=float, default=1.0, metavar="X",
                        help="multiply the profile's rates (default 1: 50 -> 500 -> 2 req/s)")
    parser.add_argument("--no-prometheus", action="store_true",
                        help="let the controller scrape the replicas directly instead of starting Prometheus")
    parser.add_argument("--out", type=Path, default=Path(".demo"),
                        help="folder for the kubeconfig, loadgen's timeline, the summary and the plot")
    parser.add_argument("--policies", type=Path, default=None, help="policies folder")
    parser.add_argument("--control-plane", choices=("emulator", "kube"), default="emulator",
                        help="emulator (default): the project's fast embedded API server and scheduler; kube: the "
                             "real kube-apiserver, kube-scheduler and kube-controller-manager 1.37 (built from "
                             "their Go modules on first use), with the node agent as kubelet and DRA driver")
    parser.set_defaults(func=run)


@dataclass
class Sample:
    t_s: float
    observed_rps: float
    forecast_rps: float
    serving: int
    standby: int
    loading: int
    desired: int
    reason: str


@dataclass
class Recorder:
    samples: list[Sample] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def run(args: argparse.Namespace) -> int:
    require("sandbox", "the demo (it runs on the local sandbox)")
    import yaml

    from infer_ctl.config.policies import load_policies
    from infer_ctl.controller.operator import OperatorConfig
    from infer_ctl.controller.operator import run as run_operator
    from infer_ctl.controller.reconciler import Settings
    from infer_ctl.engine.step import EngineConfig
    from infer_ctl.kube.client import INFERENCE_SERVICES, PODS, KubeClient
    from infer_ctl.kube.inferenceservice import CRD_PATH
    from infer_ctl.kube.pods import replica_pods
    from infer_ctl.sandbox.cluster import load_cluster
    from infer_ctl.sandbox.prometheus import LocalPrometheus, PrometheusError, find_prometheus
    from infer_ctl.sandbox.runtime import sandbox_in_thread
    from infer_ctl.sandbox.threaded import LoopThread

    if args.duration < 30:
        print("infer-ctl demo: --duration must be at least 30 seconds", file=sys.stderr)
        return 2
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    policies = load_policies(args.policies)
    cluster = load_cluster(CLUSTER, policies.catalog)
    services = [d for d in yaml.safe_load_all(DEMO_SERVICES.read_text()) if d]
    kubeconfig = out / "kubeconfig"
    stop = threading.Event()
    with contextlib.ExitStack() as stack:
        sandbox: Any
        if args.control_plane == "kube":
            from infer_ctl.sandbox.kubesandbox import kube_sandbox_in_thread

            print("starting the real control plane and the node agent (deploy/sandbox/small.yaml) ...",
                  flush=True)
            sandbox = stack.enter_context(kube_sandbox_in_thread(cluster, policies.catalog, kubeconfig=kubeconfig))
            kube = KubeClient.from_config(str(kubeconfig))
            stack.callback(kube.close)
        else:
            print("starting the sandbox (deploy/sandbox/small.yaml) ...", flush=True)
            sandbox = stack.enter_context(sandbox_in_thread(cluster, policies.catalog, kubeconfig=kubeconfig))
            kube = KubeClient.from_config(str(kubeconfig))
            stack.callback(kube.close)
            kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                         body=yaml.safe_load(CRD_PATH.read_text()))
        prometheus = None
        if not args.no_prometheus:
            if find_prometheus() is None:
                print("prometheus is not installed: the controller scrapes replicas directly "
                      "(apt-get install prometheus for the full demo)", flush=True)
            else:
                try:
                    prometheus = LocalPrometheus(out / "prometheus", scrape_interval_s=1.0)
                    prometheus.start()
                    stack.callback(prometheus.stop)
                except PrometheusError as exc:
                    print(f"Prometheus did not start ({exc}); the controller scrapes replicas directly", flush=True)
                    prometheus = None
        settings = Settings(policies, prometheus_url=prometheus.url if prometheus else None,
                            engine_config=EngineConfig(history_step_s=FORECAST_STEP_S))
        operator_loop = LoopThread("controller")
        operator_stop = threading.Event()
        import asyncio

        future = asyncio.run_coroutine_threadsafe(
            run_operator(OperatorConfig(settings, kubeconfig=str(kubeconfig), namespaces=("default",)),
                         stop_flag=operator_stop), operator_loop.loop)

        def stop_operator() -> None:
            operator_stop.set()
            with contextlib.suppress(Exception):
                future.result(timeout=30)
            operator_loop.stop()

        stack.callback(stop_operator)
        print(f"  API server  {sandbox.url}   (KUBECONFIG={kubeconfig})", flush=True)
        print(f"  metrics     {'Prometheus ' + prometheus.url if prometheus else 'direct scrape of replicas'}",
              flush=True)
        print(f"  forecast    {FORECAST_STEP_S:g} s buckets (the demo's compressed timeline; the controller's "
              "default is 60 s)", flush=True)
        for obj in services:
            kube.create(INFERENCE_SERVICES, obj, "default")
            print(f"  applied     InferenceService default/{obj['metadata']['name']}", flush=True)

        url = _wait_for_front_door(kube, "chat", INFERENCE_SERVICES)
        print(f"  front door  {url}", flush=True)
        _wait_ready(kube, PODS, "chat")
        shape = ",".join(f"{rate * args.rate_scale:g}@{args.duration * share:g}s" for rate, share in STEPS)
        timeline = out / "loadgen-timeline.csv"
        cmd = [sys.executable, "-m", "loadgen", f"{url}/v1/completions", "--shape", shape, "--json",
               "--body", '{"prompt": "Hello", "stream": false}',
               "--timeline", str(timeline), "--no-progress", "--max-error-ratio", "1", "--timeout", "10s"]
        print(f"traffic: loadgen --shape {shape} (open loop, a separate process)\n", flush=True)
        loadgen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stack.callback(_terminate, loadgen)
        recorder = Recorder()
        started = time.monotonic()
        print(f"{'time':>5}  {'rate':>7}  {'forecast':>8}  {'serving':>7}  {'standby':>7}  {'loading':>7}  "
              f"decision", flush=True)
        try:
            while loadgen.poll() is None and not stop.is_set():
                if prometheus is not None:
                    pods = replica_pods(kube.list(PODS, "default"))
                    prometheus.set_targets(p.address for p in pods if p.address)
                _tick(kube, INFERENCE_SERVICES, recorder, time.monotonic() - started)
                time.sleep(TICK_S)
        except KeyboardInterrupt:
            print("\ninterrupted: stopping everything the demo started", flush=True)
            return 130
        summary_text, _ = loadgen.communicate(timeout=30)
        summary = _loadgen_summary(summary_text)
        _print_summary(summary, recorder, out)
        # loadgen's t = 0 is when it began sending (after its start-up), on the same monotonic clock.
        offset_s = float(summary.get("started_monotonic_s", started)) - started
        if missing("plot"):
            print(f"\ntimeline: {timeline}   (no plot: it needs infer-ctl's 'plot' extra, "
                  "pip install 'infer-ctl[plot]')", flush=True)
        else:
            _plot(recorder, timeline, out / "demo.png", offset_s)
            print(f"\nplot: {out / 'demo.png'}   timeline: {timeline}", flush=True)
    return 0


def _wait_for_front_door(kube: Any, name: str, resource: Any, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        obj = kube.get(resource, name, "default") or {}
        url = ((obj.get("metadata") or {}).get("annotations") or {}).get("sandbox.infer-ctl.io/url")
        if url:
            return str(url)
        time.sleep(0.2)  # the sandbox's router opens the door on its own loop
    raise RuntimeError(f"no front door for {name} within {timeout_s:.0f} s")


def _wait_ready(kube: Any, pods: Any, name: str, timeout_s: float = 120.0) -> None:
    from infer_ctl.core.api import ReplicaState
    from infer_ctl.kube.pods import replica_pods

    print("  waiting for the first replica to load ...", flush=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replicas = replica_pods(kube.list(pods, "default", label_selector=f"infer-ctl.io/service={name}"))
        if any(r.state is ReplicaState.SERVING for r in replicas):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{name}: no replica became ready within {timeout_s:.0f} s")


def _tick(kube: Any, resource: Any, recorder: Recorder, t_s: float) -> None:
    obj = kube.get(resource, "chat", "default") or {}
    status = obj.get("status") or {}
    replicas = status.get("replicas") or {}
    desired = status.get("desired") or {}
    forecast = status.get("forecast") or {}
    decision = status.get("lastDecision") or {}
    scaling: dict[str, Any] = next((c for c in status.get("conditions") or () if c.get("type") == "Scaling"), {})
    observed = float(status.get("observedRps", "nan"))
    sample = Sample(t_s, observed, float(forecast.get("upperRps", "nan")), int(replicas.get("serving", 0)),
                    int(replicas.get("standby", 0)), int(replicas.get("loading", 0)),
                    int(desired.get("serving", 0)) + int(desired.get("standby", 0)),
                    str(scaling.get("reason") or decision.get("reason") or ""))
    recorder.samples.append(sample)
    # this cycle's reason and message (the Scaling condition); lastDecision keeps the last change's
    note = str(scaling.get("message") or (decision.get("message", "") if decision else ""))
    rate = "-" if math.isnan(sample.observed_rps) else f"{sample.observed_rps:.0f}/s"
    fc = "-" if math.isnan(sample.forecast_rps) else f"{sample.forecast_rps:.0f}/s"
    print(f"{t_s:5.0f}  {rate:>7}  {fc:>8}  {sample.serving:>7}  {sample.standby:>7}  {sample.loading:>7}  "
          f"{sample.reason}: {note[:70]}", flush=True)


def _terminate(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _loadgen_summary(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return {}


def _print_summary(summary: dict[str, Any], recorder: Recorder, out: Path) -> None:
    peak = max((s.serving for s in recorder.samples), default=0)
    replica_seconds = sum((s.serving + s.standby + s.loading) * TICK_S for s in recorder.samples)
    print("\nsummary", flush=True)
    if summary:
        print(f"  traffic   target {summary.get('target_rps', 0):.1f} req/s, achieved "
              f"{summary.get('achieved_rps', 0):.1f} req/s; {summary.get('ok', 0)} ok, {summary.get('errors', 0)} "
              "errors", flush=True)
        print(f"  latency   p50 {summary.get('p50_ms', 0):.0f} ms, p95 {summary.get('p95_ms', 0):.0f} ms, "
              f"p99 {summary.get('p99_ms', 0):.0f} ms (from the scheduled send time)", flush=True)
    print(f"  replicas  peak {peak} serving; {replica_seconds / 3600:.2f} GPU-hours used (loading included)",
          flush=True)
    (out / "summary.json").write_text(json.dumps({"loadgen": summary, "peak_serving": peak,
                                                  "gpu_hours": replica_seconds / 3600}, indent=2))


def _plot(recorder: Recorder, timeline: Path, path: Path, offset_s: float = 0.0) -> None:
    """Two panels: requests/s (target, answered, the controller's observed rate and upper forecast) above
    replicas (serving, serving + standby, loading, desired). `offset_s`: loadgen's t = 0 on the demo's clock."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    if timeline.exists():
        with timeline.open() as f:
            rows = list(csv.DictReader(f))
        x = [float(r["t_s"]) + offset_s for r in rows]
        top.plot(x, [float(r["target"]) for r in rows], color="0.6", label="offered (loadgen target)")
        top.plot(x, [float(r["ok"]) for r in rows], color="tab:green", label="answered")
    t = [s.t_s for s in recorder.samples]
    top.plot(t, [s.observed_rps for s in recorder.samples], color="tab:blue", label="observed by the controller")
    top.plot(t, [s.forecast_rps for s in recorder.samples], color="tab:red", linestyle="--",
             label="forecast (upper quantile)")
    top.set_ylabel("requests/s")
    top.legend(loc="upper right")
    bottom.step(t, [s.serving for s in recorder.samples], where="post", color="tab:blue", label="serving (ready)")
    bottom.step(t, [s.serving + s.standby for s in recorder.samples], where="post", color="tab:cyan",
                linestyle="--", label="serving + standby")
    bottom.step(t, [s.loading for s in recorder.samples], where="post", color="tab:orange", label="loading")
    bottom.step(t, [s.desired for s in recorder.samples], where="post", color="black", linestyle=":",
                label="desired")
    bottom.set_ylabel("replicas")
    bottom.set_xlabel("seconds since the traffic started")
    bottom.legend(loc="upper right")
    top.set_title("infer-ctl demo: the chat service through the 50 -> 500 -> 2 req/s step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
