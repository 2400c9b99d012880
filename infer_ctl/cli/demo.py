"""`infer-ctl demo`: the README's main job, the whole loop on the local sandbox.

It starts the sandbox (deploy/sandbox/small.yaml: H100, A100-with-MIG and L4 nodes), a real Prometheus when
Debian's `prometheus` is installed (else the controller scrapes the replicas directly, and says so), and the
controller; applies the demo's InferenceServices (deploy/demo/); and drives the `chat` service through its front
door with loadgen, as a separate process, through a compressed day (infer_ctl/cli/demoday.py's table):

    early morning 50 req/s, a morning ramp to 300 (predictable: the days before had it), the day, the evening,
    the night, then an unannounced step up to 500 and down to 2;

and the `summarize` service, with a second loadgen, at a steady rate all day: its GPUs hold chat's pool of
sleepers (it yields to sleepers), so the step wakes them there, and its summary says what that cost it.

The days before are backfilled into Prometheus before it starts (`promtool tsdb create-blocks-from
openmetrics`), and the controller's seasonal forecast runs on the compressed day (`EngineConfig.day_s`, 10 s
buckets): it knows the morning ramp from its first minute and starts replicas a cold start ahead of it, while
the unannounced step is met by the burst guard as it comes. A live view shows what the controller sees and
decides (in place on a terminal, a line per change elsewhere); the end is a summary per phase (latency p50/p95
against the SLO, errors, replicas) and a plot (`.demo/demo.png`). Everything it started stops at the end or on
Ctrl-C. The controller's log is in `.demo/controller.log`.

`--duration` is the length of the day (default 360 s, rounded to the 10 s buckets); `--rate-scale` scales the
rates and, with them, each replica's capacity (the model server's slots, at the same latency), so that a lighter
run on a slow machine needs the same replicas and shows the same day.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from infer_ctl.cli.demoday import DEFAULT_DAY_S, HISTORY_DAYS, Day, Phase
from infer_ctl.cli.extras import missing, require
from infer_ctl.cli.live import LiveView, ServiceView
from infer_ctl.paths import data_path

DEMO_SERVICES = data_path("deploy/demo/chat.yaml")
CLUSTER = data_path("deploy/sandbox/small.yaml")
DRIVEN = "chat"  # the service loadgen drives through the day; the others stay at their minimum
# a steady background service, driven by a second loadgen at this rate (x --rate-scale) all day: the GPUs it
# serves on are lent to chat's sleepers (prewarm.yieldToSleepers)
BACKGROUND = "summarize"
BACKGROUND_RPS = 30.0
TICK_S = 1.0
FORECAST_STEP_S = 10.0  # the forecast grid on the demo's compressed timeline (the controller's default is 60 s)
SERVICE_TIME = "sandbox.infer-ctl.io/service-time-ms"
CONCURRENCY = "sandbox.infer-ctl.io/concurrency"
HISTORY_SEED = 17
# the day starts this long after the history is written, beyond the first replicas' cold start: the time the
# controller takes to start them and the scheduler to bind them (about 8 s on a shared 2-core machine; a later
# start begins the day where it then is)
SETUP_ALLOWANCE_S = 15.0
BURST_WINDOW_S = 30.0  # an unannounced step's replicas are counted until this long after it ends


def register(sub: Any) -> None:
    parser = sub.add_parser("demo", help="run the local demo on the sandbox", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=DEFAULT_DAY_S, metavar="S",
                        help=f"length of the compressed day in seconds (default {DEFAULT_DAY_S:g}; at least 30)")
    parser.add_argument("--rate-scale", type=float, default=1.0, metavar="X",
                        help="multiply the day's rates, and each replica's capacity with them (default 1)")
    parser.add_argument("--no-prometheus", action="store_true",
                        help="let the controller scrape the replicas directly (no history: no forecast of the ramp)")
    parser.add_argument("--out", type=Path, default=Path(".demo"),
                        help="folder for the kubeconfig, the timelines (loadgen's, the controller's), its log, the "
                             "summary and the plot")
    parser.add_argument("--policies", type=Path, default=None, help="policies folder")
    parser.add_argument("--without-sleepers", action="store_true",
                        help="the same day without the sleeping tier: chat keeps no pool of sleepers and summarize "
                             "lends no GPU (the 'before' of the README's table)")
    parser.add_argument("--control-plane", choices=("emulator", "kube"), default="emulator",
                        help="emulator (default): the project's fast embedded API server and scheduler; kube: the "
                             "real kube-apiserver, kube-scheduler and kube-controller-manager 1.37 (built from "
                             "their Go modules on first use), with the node agent as kubelet and DRA driver")
    parser.set_defaults(func=run)


@dataclass
class Sample:
    """One poll of the driven service: the controller's status and the Pods' states."""

    t_s: float  # seconds of the day
    observed_rps: float
    forecast_rps: float
    desired_serving: int
    desired_standby: int
    states: dict[str, int]
    reason: str
    gpus: float = 0.0  # GPUs the service's Pods hold: the claims they reference, a warm host's shared (held_gpus)

    def count(self, state: str) -> int:
        return self.states.get(state, 0)


@dataclass
class Recorder:
    samples: list[Sample] = field(default_factory=list)

    def within(self, start_s: float, end_s: float) -> list[Sample]:
        return [s for s in self.samples if start_s <= s.t_s < end_s]


def run(args: argparse.Namespace) -> int:
    require("sandbox", "the demo (it runs on the local sandbox)")
    if not args.duration >= 30:
        print("infer-ctl demo: --duration must be at least 30 seconds", file=sys.stderr)
        return 2
    if not 0 < args.rate_scale < math.inf:
        print("infer-ctl demo: --rate-scale must be a number > 0", file=sys.stderr)
        return 2
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    _log_to(out / "controller.log")
    day = Day.build(max(30.0, round(args.duration / FORECAST_STEP_S) * FORECAST_STEP_S), args.rate_scale)
    try:
        return _Demo(args, out, day).run()
    except KeyboardInterrupt:
        print("\ninterrupted: stopped everything the demo started", flush=True)
        return 130


def _log_to(path: Path) -> None:
    """The controller, the sandbox and kopf log into a file: the live view keeps the terminal."""
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for chatty in ("aiohttp.access", "httpx"):  # a line per HTTP request: the demo polls every second
        logging.getLogger(chatty).setLevel(logging.WARNING)


class _Demo:
    def __init__(self, args: argparse.Namespace, out: Path, day: Day) -> None:
        import yaml

        from infer_ctl.config.cluster import load_cluster
        from infer_ctl.config.policies import load_policies
        from infer_ctl.sandbox.router import front_door_policies

        self.args, self.out, self.day = args, out, day
        # the chat service's 250 ms objective is read at the sandbox's front door (what its clients see; vLLM's
        # own end-to-end histogram starts at 0.3 s), as a platform team points latencyHistogram at its gateway
        self.policies = front_door_policies(load_policies(args.policies))
        self.cluster = load_cluster(CLUSTER, self.policies.catalog)
        self.services = [d for d in yaml.safe_load_all(DEMO_SERVICES.read_text()) if d]
        if args.without_sleepers:
            for svc in self.services:
                without_sleepers(svc)
        driven = next(s for s in self.services if s["metadata"]["name"] == DRIVEN)
        scale_capacity(driven, args.rate_scale)
        for svc in self.services:
            if svc["metadata"]["name"] == BACKGROUND:
                scale_capacity(svc, args.rate_scale)
        self.slo_ms = float(((driven.get("spec") or {}).get("slo") or {}).get("latencyP95Ms") or math.nan)
        self.gateway_metrics: str | None = None  # the sandbox's front doors' /metrics (set when it starts)
        self.measured: dict[str, Any] = {}  # the driven service's status.slo, as the last poll read it
        self.sandbox: Any = None  # the running sandbox (its node agent counts requests to sleeping engines)
        self.cold_start_s = float(driven["spec"]["runtime"].get("coldStartSeconds") or 60.0)
        self.kubeconfig = out / "kubeconfig"
        self.recorder = Recorder()
        self.background: dict[str, Any] = {}  # the background service's figures, once summarized

    def run(self) -> int:
        with contextlib.ExitStack() as stack:
            kube = self._start_sandbox(stack)
            prometheus = self._start_prometheus(stack)
            self._start_controller(stack, prometheus.url if prometheus else None)
            from infer_ctl.kube.client import INFERENCE_SERVICES

            for obj in self.services:
                kube.create(INFERENCE_SERVICES, obj, "default")
                print(f"  applied     InferenceService default/{obj['metadata']['name']}", flush=True)
            url = _wait_for_front_door(kube, DRIVEN)
            print(f"  front door  {url}", flush=True)
            print(f"  waiting for the first replicas to load (a cold start: {self.cold_start_s:g} s) ...", flush=True)
            _wait_ready(kube, DRIVEN, timeout_s=self.cold_start_s + 120)
            offset_s = self._wait_for_the_day()
            return self._drive(stack, kube, prometheus, url, offset_s)
        return 0  # pragma: no cover (the with block returns)

    # ------------------------------------------------------------------------------------------ set-up

    def _start_sandbox(self, stack: contextlib.ExitStack) -> Any:
        import yaml

        from infer_ctl.kube.client import KubeClient
        from infer_ctl.kube.inferenceservice import CRD_PATH
        from infer_ctl.sandbox.runtime import sandbox_in_thread

        sandbox: Any
        if self.args.control_plane == "kube":
            from infer_ctl.sandbox.kubesandbox import kube_sandbox_in_thread

            print("starting the real control plane and the node agent (deploy/sandbox/small.yaml) ...", flush=True)
            sandbox = stack.enter_context(kube_sandbox_in_thread(self.cluster, self.policies.catalog,
                                                                 kubeconfig=self.kubeconfig))
            kube = KubeClient.from_config(str(self.kubeconfig))
            stack.callback(kube.close)
        else:
            print("starting the sandbox (deploy/sandbox/small.yaml) ...", flush=True)
            sandbox = stack.enter_context(sandbox_in_thread(self.cluster, self.policies.catalog,
                                                            kubeconfig=self.kubeconfig))
            kube = KubeClient.from_config(str(self.kubeconfig))
            stack.callback(kube.close)
            kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                         body=yaml.safe_load(CRD_PATH.read_text()))
        self.sandbox = sandbox
        print(f"  API server  {sandbox.url}   (KUBECONFIG={self.kubeconfig})", flush=True)
        # the front doors' /metrics: a Prometheus target beside the replicas (their latency at the door, their
        # refusals, the requests they hold), or the controller's own scrape without Prometheus
        self.gateway_metrics = str(sandbox.endpoints()["gateway-metrics"])
        return kube

    def _start_prometheus(self, stack: contextlib.ExitStack) -> Any:
        """Prometheus with the days before today backfilled, or None (then the controller scrapes replicas
        directly, and its forecast starts with no history: the demo says so)."""
        import numpy as np

        from infer_ctl.sandbox.prometheus import LocalPrometheus, PrometheusError, find_prometheus

        without = ("the controller scrapes the replicas directly, and its forecast starts with no history: the "
                   "morning ramp is met by the burst guard as it comes, not ahead of it")
        self.day0 = math.nan  # wall-clock start of today (NaN: when the first replica is ready)
        if self.args.no_prometheus:
            print(f"  metrics     no Prometheus (--no-prometheus): {without}", flush=True)
            return None
        if find_prometheus() is None:
            print(f"  metrics     NO PROMETHEUS: Debian's prometheus is not installed, so {without}. ./run installs "
                  "it; or: apt-get install prometheus", flush=True)
            return None
        workdir = self.out / "prometheus"
        shutil.rmtree(workdir, ignore_errors=True)  # a previous run's data would pass for history
        prometheus = LocalPrometheus(workdir, scrape_interval_s=1.0)
        now = time.time()
        self.day0 = now + self.cold_start_s + SETUP_ALLOWANCE_S
        # the driven service's history as its engine's finished-requests counter (what its rate query reads)
        driven = next(s for s in self.services if s["metadata"]["name"] == DRIVEN)
        runtime = driven["spec"]["runtime"]
        profile = self.policies.runtimes.resolve(runtime.get("engine", ""), runtime["image"])
        assert profile is not None, f"no runtime profile for {DRIVEN}'s engine"
        labels = (f'namespace="default",service="{DRIVEN}",pod="history",model_name="{driven["spec"]["model"]["name"]}"'
                  ',engine="0",finished_reason="stop"')
        try:
            prometheus.backfill(self.day.history_openmetrics(self.day0, now, labels,
                                                             np.random.default_rng(HISTORY_SEED),
                                                             metric=profile.metrics.requests))
            prometheus.start()
        except PrometheusError as exc:
            prometheus.stop()
            print(f"  metrics     Prometheus did not start ({exc}): {without}", flush=True)
            self.day0 = math.nan
            return None
        stack.callback(prometheus.stop)
        print(f"  metrics     Prometheus {prometheus.url}, with the {HISTORY_DAYS} days before today backfilled "
              f"({DRIVEN}'s request counter, `promtool tsdb create-blocks-from openmetrics`)", flush=True)
        return prometheus

    def _start_controller(self, stack: contextlib.ExitStack, prometheus_url: str | None) -> None:
        import asyncio

        from infer_ctl.controller.operator import OperatorConfig
        from infer_ctl.controller.operator import run as run_operator
        from infer_ctl.controller.reconciler import Settings
        from infer_ctl.engine.step import EngineConfig
        from infer_ctl.sandbox.threaded import LoopThread

        engine = EngineConfig(history_step_s=FORECAST_STEP_S, day_s=self.day.day_s, season_step_s=FORECAST_STEP_S)
        settings = Settings(self.policies, prometheus_url=prometheus_url, engine_config=engine,
                            gateway_metrics_url=self.gateway_metrics)
        operator_loop = LoopThread("controller")
        operator_stop = threading.Event()
        future = asyncio.run_coroutine_threadsafe(
            run_operator(OperatorConfig(settings, kubeconfig=str(self.kubeconfig), namespaces=("default",)),
                         stop_flag=operator_stop), operator_loop.loop)

        def stop_operator() -> None:
            operator_stop.set()
            with contextlib.suppress(Exception):
                future.result(timeout=30)
            operator_loop.stop()

        stack.callback(stop_operator)
        print(f"  controller  a day of {self.day.day_s:g} s, forecast on {FORECAST_STEP_S:g} s buckets with a daily "
              f"season of {self.day.day_s:g} s; log: {self.out / 'controller.log'}", flush=True)

    def _wait_for_the_day(self) -> float:
        """Wait for the planned start of today (the history's days end there); returns how far into the day the
        traffic starts (0 unless the set-up took longer than planned)."""
        if math.isnan(self.day0):
            self.day0 = time.time()
            return 0.0
        wait = self.day0 - time.time()
        if wait > 0:
            print(f"  the day starts in {wait:.0f} s (where the backfilled days end)", flush=True)
            time.sleep(wait)  # nothing to poll: the day starts at a time chosen before the set-up
            return 0.0
        print(f"  the set-up took {-wait:.0f} s longer than planned: the day starts {-wait:.0f} s in", flush=True)
        return -wait

    # ------------------------------------------------------------------------------------------ the day

    def _drive(self, stack: contextlib.ExitStack, kube: Any, prometheus: Any, url: str, offset_s: float) -> int:
        from infer_ctl.kube.client import PODS
        from infer_ctl.sandbox.prometheus import pod_targets

        timeline = self.out / "loadgen-timeline.csv"
        shape = self.day.shape(offset_s)
        cmd = [sys.executable, "-m", "loadgen", f"{url}/v1/completions", "--shape", shape, "--json",
               "--phases", self.day.phase_starts(offset_s), "--body", _body(self.services, DRIVEN, "Hello"),
               "--timeline", str(timeline), "--no-progress", "--max-error-ratio", "1", "--timeout", "10s"]
        print(f"traffic: loadgen --shape {shape}\n         (open loop, a separate process; the day: "
              f"{self.day.describe()} req/s)\n", flush=True)
        day0_mono = time.monotonic() - (time.time() - self.day0)
        loadgen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stack.callback(_terminate, loadgen)
        background = self._background(stack, kube, offset_s)
        view = LiveView(sys.stdout)
        while loadgen.poll() is None:
            pods = kube.list(PODS, "default")
            if prometheus is not None:
                # each replica at its podIP:port, labelled with namespace, pod and service as a PodMonitor does
                prometheus.set_targets([*pod_targets(pods), urlsplit(self.gateway_metrics).netloc])
            t = time.monotonic() - day0_mono
            views = [self._service_view(kube, name, pods) for name in self._names()]
            self._record(t, views[0], held_gpus(pods, DRIVEN))
            phase = self.day.phase_at(t)
            view.update(t, phase.name, "as every day: the forecast knows it" if phase.predictable else
                        "unannounced: the days before had none of it", views)
            time.sleep(TICK_S)
        view.close()
        background_summary: dict[str, Any] = {}
        if background is not None:
            text, _ = background.communicate(timeout=60)
            background_summary = _loadgen_summary(text)
        summary_text, errors = loadgen.communicate(timeout=30)
        summary = _loadgen_summary(summary_text)
        if not summary:
            print(f"loadgen printed no summary: {errors[-2000:]}", file=sys.stderr, flush=True)
        # loadgen's t = 0 on the day's clock (both from the machine's monotonic clock)
        start_s = float(summary.get("started_monotonic_s", day0_mono + offset_s)) - day0_mono
        self._summarize(summary)
        if background is not None:
            self._summarize_background(background_summary, kube)
        if missing("plot"):
            print(f"\ntimeline: {timeline}   (no plot: it needs infer-ctl's 'plot' extra, "
                  "pip install 'infer-ctl[plot]')", flush=True)
        else:
            plot(self.day, self.recorder, timeline, self.out / "demo.png", start_s=start_s, slo_ms=self.slo_ms)
            print(f"\nplot: {self.out / 'demo.png'}   timeline: {timeline}", flush=True)
        return 0

    def _background(self, stack: contextlib.ExitStack, kube: Any, offset_s: float) -> subprocess.Popen[str] | None:
        """The background service's loadgen: its steady rate from where the day starts to its end, summarized in
        the day's phases (None when the demo has no such service)."""
        if not any(s["metadata"]["name"] == BACKGROUND for s in self.services):
            return None
        url = _wait_for_front_door(kube, BACKGROUND)
        rate = BACKGROUND_RPS * self.day.rate_scale
        cmd = [sys.executable, "-m", "loadgen", f"{url}/v1/completions",
               "--shape", f"{rate:g}@{max(1.0, self.day.day_s - offset_s):g}s", "--json",
               "--phases", self.day.phase_starts(offset_s), "--body", _body(self.services, BACKGROUND, "Summarize"),
               "--no-progress", "--max-error-ratio", "1", "--timeout", "30s"]
        print(f"         {BACKGROUND}: loadgen at {rate:g} req/s all day (a second process)\n", flush=True)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stack.callback(_terminate, proc)
        return proc

    def _summarize_background(self, summary: dict[str, Any], kube: Any) -> None:
        """The background service's figures: what lending its GPUs cost it (its requests in each phase), and how
        often it yielded them (its `Yielded` Events)."""
        from infer_ctl.kube.client import EVENTS

        yielded = sum(int(e.get("count") or (e.get("series") or {}).get("count") or 1)
                      for e in kube.list(EVENTS, "default") if e.get("reason") == "Yielded")
        lent = "lending no GPU (--without-sleepers)" if self.args.without_sleepers else \
            f"its GPUs lent to chat's sleepers: {yielded} replica(s) put to sleep for chat's wakes and loads"
        print(f"\nsummary of {BACKGROUND} (steady {BACKGROUND_RPS * self.day.rate_scale:g} req/s; {lent})", flush=True)
        if not summary:
            print("  loadgen printed no summary", flush=True)
            return
        print(f"  {'phase':<15} {'p50':>8} {'p95':>8} {'ok':>7} {'errors':>7}", flush=True)
        for p in summary.get("phases") or ():
            print(f"  {p['name']:<15} {_ms(p['p50_ms']):>8} {_ms(p['p95_ms']):>8} {p['ok']:>7} {p['errors']:>7}",
                  flush=True)
        kinds = ", ".join(f"{k} {n}" for k, n in (summary.get("errors_by_kind") or {}).items())
        print(f"  traffic     {summary.get('sent', 0)} requests, {summary.get('ok', 0)} ok, "
              f"{summary.get('errors', 0)} errors{' (' + kinds + ')' if kinds else ''}; p50 "
              f"{summary.get('p50_ms', 0):.0f} ms, p95 {summary.get('p95_ms', 0):.0f} ms overall", flush=True)
        self.background = {"loadgen": summary, "yielded": yielded}
        path = self.out / "summary.json"
        if path.exists():
            path.write_text(json.dumps({**json.loads(path.read_text()), "background": self.background}, indent=2))

    def _names(self) -> list[str]:
        names = [s["metadata"]["name"] for s in self.services]
        return [DRIVEN, *(n for n in names if n != DRIVEN)]

    def _service_view(self, kube: Any, name: str, pods: list[dict[str, Any]]) -> ServiceView:
        from infer_ctl.kube.client import INFERENCE_SERVICES
        from infer_ctl.kube.labels import LABEL_SERVICE

        status = (kube.get(INFERENCE_SERVICES, name, "default") or {}).get("status") or {}
        if name == DRIVEN:
            self.measured = status.get("slo") or self.measured
        forecast = status.get("forecast") or {}
        desired = status.get("desired") or {}
        decision = status.get("lastDecision") or {}
        # this cycle's reason and message (the Scaling condition); lastDecision keeps the last change's
        scaling: dict[str, Any] = next((c for c in status.get("conditions") or () if c.get("type") == "Scaling"), {})
        mine = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_SERVICE) == name]
        states = Counter(replica_states(mine))
        note = ""
        if forecast:
            note = (f"upper q{float(forecast.get('quantile', 'nan')):g} within {forecast.get('horizonSeconds')} s, "
                    f"{forecast.get('method', '')}")
        return ServiceView(name, float(status.get("observedRps", "nan")), float(forecast.get("upperRps", "nan")),
                           note, int(desired.get("serving", 0)), int(desired.get("standby", 0)), dict(states),
                           str(scaling.get("reason") or decision.get("reason") or ""),
                           str(scaling.get("message") or decision.get("message") or ""))

    def _record(self, t_s: float, svc: ServiceView, gpus: float) -> None:
        self.recorder.samples.append(Sample(t_s, svc.observed_rps, svc.forecast_rps, svc.desired_serving,
                                            svc.desired_standby, dict(svc.replicas), svc.reason, gpus))

    # ------------------------------------------------------------------------------------------ the end

    def _summarize(self, summary: dict[str, Any]) -> None:
        rec = self.recorder
        peak = max((s.count("Serving") for s in rec.samples), default=0)
        dt = [b.t_s - a.t_s for a, b in zip(rec.samples, rec.samples[1:], strict=False)] + [TICK_S]
        gpu_s = sum(s.gpus * d for s, d in zip(rec.samples, dt, strict=True))
        slo = f"p95 <= {self.slo_ms:g} ms" if not math.isnan(self.slo_ms) else "none"
        pool = "; no pool of sleepers (--without-sleepers)" if self.args.without_sleepers else ""
        print(f"\nsummary of {DRIVEN} (SLO {slo}; latency from each request's scheduled send time{pool})", flush=True)
        phases = phase_rows(self.day, rec, summary.get("phases") or [], self.slo_ms)
        print(f"  {'phase':<15} {'seconds':>9} {'req/s':>9} {'p50':>8} {'p95':>8} {'SLO':>6} {'errors':>7}  "
              f"{'serving':>7} {'standby':>7} {'asleep':>7} {'loading':>7}", flush=True)
        for row in phases:
            print(f"  {row['name']:<15} {row['window']:>9} {row['rate']:>9} {row['p50']:>8} {row['p95']:>8} "
                  f"{row['slo']:>6} {row['errors']:>7}  {row['serving']:>7} {row['standby']:>7} "
                  f"{row['sleeping']:>7} {row['loading']:>7}", flush=True)
        for line in explain(self.day, rec, phases):
            print(f"  {line}", flush=True)
        if summary:
            kinds = ", ".join(f"{k} {n}" for k, n in (summary.get("errors_by_kind") or {}).items())
            print(f"  traffic     {summary.get('sent', 0)} requests, {summary.get('ok', 0)} ok, "
                  f"{summary.get('errors', 0)} errors{' (' + kinds + ')' if kinds else ''}; p50 "
                  f"{summary.get('p50_ms', 0):.0f} ms, p95 {summary.get('p95_ms', 0):.0f} ms overall", flush=True)
        if measured := self.measured:  # the controller's status.slo: read at the front door
            share = measured.get("attainment")
            print(f"  measured    {float(share) * 100:.2f} %" if share is not None else "  measured    -",
                  f"of {measured.get('requests', 0)} requests within {measured.get('latencyMs')} ms at the front "
                  f"door (time held for a replica included, refusals as misses) over the last "
                  f"{measured.get('windowSeconds')} s, objective {float(measured.get('objective', 'nan')) * 100:g} % "
                  f"(the controller's status.slo: {measured.get('message', '')})", flush=True)
        if self.sandbox is not None:
            print(f"  asleep      {self.sandbox.asleep_requests()} requests (every service's) reached a model server "
                  "while it slept (the node agent's count: a replica leaves routing before its sleep and joins "
                  "after a confirmed wake)", flush=True)
        print(f"  replicas    peak {peak} serving; {gpu_s / 3600:.2f} GPU-hours held (the GPUs its Pods' claims "
              "hold, loading included; a warm host's GPU charged to the services awake on it, else shared by its "
              "sleepers' services)", flush=True)
        write_samples(rec, self.out / "controller-timeline.csv")
        (self.out / "summary.json").write_text(json.dumps({
            "loadgen": summary, "peak_serving": peak, "gpu_hours": gpu_s / 3600, "day_s": self.day.day_s,
            "rate_scale": self.day.rate_scale, "phases": phases, "background": self.background}, indent=2))


def replica_states(pods: list[dict[str, Any]]) -> list[str]:
    """Each replica Pod's state as the controller counts it (`actuate.manifests.replica_state`)."""
    from infer_ctl.actuate.manifests import replica_state
    from infer_ctl.kube.pods import replica_pod

    return [str(replica_state(pod, replica_pod(pod).state)) for pod in pods]


def held_gpus(pods: list[dict[str, Any]], name: str) -> float:
    """GPUs the service holds: each claim its Pods reference, charged by the engine's `warm_host_charge` as the
    simulator charges its warm hosts: a replica's own claim is its service's; a warm host's is the services' awake
    on it, else theirs whose sleepers wait on it, evenly (a sleeper waiting on a GPU another service serves on
    holds none of it; the demo's claims each ask for one device)."""
    from infer_ctl.actuate.manifests import held_asleep
    from infer_ctl.controller.warm import referenced_claims
    from infer_ctl.engine.cycle import warm_host_charge
    from infer_ctl.kube.labels import LABEL_SERVICE

    present: dict[str, set[str]] = {}
    awake: dict[str, set[str]] = {}
    for p in pods:
        service = str(((p.get("metadata") or {}).get("labels") or {}).get(LABEL_SERVICE, ""))
        if not service:
            continue
        for claim in referenced_claims(p):  # a Pod being deleted holds its claims until it is gone
            present.setdefault(claim, set()).add(service)
            if not held_asleep(p):
                awake.setdefault(claim, set()).add(service)
    return sum(warm_host_charge(awake.get(claim, set()), services, 1.0).get(name, 0.0)
               for claim, services in present.items())


def write_samples(rec: Recorder, path: Path) -> None:
    """What the demo polled each second: the controller's rate, forecast and wanted replicas, the Pods by state."""
    import csv

    states = ["Serving", "Standby", "Sleeping", "Loading", "Pending", "Draining", "Unavailable"]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["t_s", "observed_rps", "forecast_upper_rps", "desired_serving", "desired_standby",
                         *(s.lower() for s in states), "gpus", "reason"])
        for x in rec.samples:
            writer.writerow([f"{x.t_s:.1f}", f"{x.observed_rps:.1f}", f"{x.forecast_rps:.1f}", x.desired_serving,
                             x.desired_standby, *(x.count(s) for s in states), x.gpus, x.reason])


def without_sleepers(service: dict[str, Any]) -> None:
    """A demo service without the sleeping tier: no pool of sleepers (`prewarm.sleepingReplicas`), no GPUs lent
    to another's (`prewarm.yieldToSleepers`); the rest of its prewarm as written."""
    prewarm = (service.get("spec") or {}).get("scaling", {}).get("prewarm")
    if not isinstance(prewarm, dict):
        return
    prewarm.pop("sleepingReplicas", None)
    prewarm.pop("yieldToSleepers", None)
    if not prewarm:
        del service["spec"]["scaling"]["prewarm"]


def scale_capacity(service: dict[str, Any], scale: float) -> None:
    """Scale a sandbox service's capacity per replica by `scale`, at the same latency: fewer (or more) slots,
    the service time stretched to the whole slot count, and the target rate per replica with them. E.g. 8 slots
    of 100 ms (80 req/s) at 0.3: 3 slots of 125 ms (24 req/s), target 40 -> 12 req/s."""
    if scale == 1:
        return
    annotations = service["metadata"].setdefault("annotations", {})
    base_ms = float(annotations.get(SERVICE_TIME, 100))
    base_slots = int(annotations.get(CONCURRENCY, 8))
    slots = max(1, math.ceil(base_slots * scale - 1e-9))
    annotations[SERVICE_TIME] = f"{base_ms * slots / (base_slots * scale):.3f}"
    annotations[CONCURRENCY] = str(slots)
    scaling = service["spec"]["scaling"]
    scaling["targetRequestsPerReplica"] = round(float(scaling["targetRequestsPerReplica"]) * scale, 6)


def phase_rows(day: Day, rec: Recorder, loadgen_phases: list[dict[str, Any]], slo_ms: float) -> list[dict[str, Any]]:
    """Per phase of the day: its window, rate, latency and errors (loadgen's phases, split where the day's are)
    and replicas (the Pods polled in it)."""
    by_name = {p["name"]: p for p in loadgen_phases}
    rows = []
    for phase in day.phases:
        lg = by_name.get(phase.name, {})
        samples = rec.within(phase.start_s, phase.end_s)
        lo, hi = phase.today[0][1], phase.today[-1][1]
        p95 = float(lg.get("p95_ms", math.nan)) if lg.get("ok") else math.nan

        def span(state: str, samples: list[Sample] = samples) -> str:
            values = [s.count(state) for s in samples]
            if not values:
                return "-"
            return f"{min(values)}" if min(values) == max(values) else f"{min(values)}-{max(values)}"

        rows.append({
            "name": phase.name, "start_s": phase.start_s, "end_s": phase.end_s, "predictable": phase.predictable,
            "window": f"{phase.start_s:.0f}-{phase.end_s:.0f}",
            "rate": f"{lo:.0f}" if math.isclose(lo, hi) else f"{lo:.0f}-{hi:.0f}",
            "p50": _ms(float(lg.get("p50_ms", math.nan)) if lg.get("ok") else math.nan),
            "p95": _ms(p95), "p95_ms": p95,
            "slo": "-" if math.isnan(p95) or math.isnan(slo_ms) else ("met" if p95 <= slo_ms else "MISSED"),
            "errors": str(lg.get("errors", "-")), "errors_by_kind": lg.get("errors_by_kind", {}),
            "serving": span("Serving"), "standby": span("Standby"), "sleeping": span("Sleeping"),
            "loading": span("Loading"),
        })
    return rows


def _ms(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.1f} s"


def explain(day: Day, rec: Recorder, rows: list[dict[str, Any]]) -> list[str]:
    """What the phases show: replicas loading ahead of each predictable rise, the burst guard's time to catch an
    unannounced step, and why a phase missed its SLO."""
    lines = []
    before_rps = math.inf
    for i, phase in enumerate(day.phases):
        rises = max(r for _, r in phase.today) > 1.5 * min(before_rps, phase.today[0][1])
        before_rps = phase.today[-1][1]
        if not rises:
            continue
        if phase.predictable:
            lines.append(_prewarm_line(phase, rec))
        else:
            lines.append(_burst_line(phase, rec, rows[i]))
    return [line for line in lines if line]


def _prewarm_line(phase: Phase, rec: Recorder) -> str:
    """When the replicas for a predictable rise started loading, relative to the rise."""
    before = [s for s in rec.samples if s.t_s < phase.start_s]
    if not before:
        return f"{phase.name}: began before the first poll"
    at_start = before[-1]
    ready = at_start.count("Serving") + at_start.count("Standby")
    first, low = None, math.inf
    for s in (s for s in rec.samples if s.t_s < phase.end_s):
        total = sum(s.states.values())
        if total > low:  # the first replica added after the fleet's low point (the night's scale-down)
            first = s
            break
        low = min(low, total)
    if first is None:
        return (f"{phase.name}: no replica was added: {ready} were ready when it began, started before the traffic "
                f"({_forecast(before[0])} at the first poll)")
    lead = phase.start_s - first.t_s
    when = f"{lead:.0f} s before it began" if lead > 0 else f"{-lead:.0f} s after it began (no pre-warm)"
    return (f"{phase.name}: the first replica for it was started at {first.t_s:.0f} s, {when}; when it began, "
            f"{ready} were ready and {at_start.count('Loading')} loading ({_forecast(at_start)})")


def _forecast(sample: Sample) -> str:
    return "no forecast" if math.isnan(sample.forecast_rps) else f"forecast {sample.forecast_rps:.0f} req/s"


def _burst_line(phase: Phase, rec: Recorder, row: dict[str, Any]) -> str:
    """How long the burst guard took to have the step's replicas serving, and what the requests met meanwhile."""
    samples = rec.within(phase.start_s, phase.end_s + BURST_WINDOW_S)
    if not samples:
        return ""
    peak = max(s.count("Serving") for s in samples)
    first_peak = next(s for s in samples if s.count("Serving") == peak)
    errors = ", ".join(f"{k} {n}" for k, n in (row.get("errors_by_kind") or {}).items())
    met = row["slo"] == "met"
    meanwhile = (f"p95 {row['p95']}, {'within' if met else 'over'} the SLO"
                 + (f"; refused: {errors}" if errors else ""))
    start = samples[0].count("Serving")
    response = (f"{start} serving when it began, {peak} serving {first_peak.t_s - phase.start_s:.0f} s after it "
                "(the burst guard)" if peak > start else f"the {start} serving replicas it met took it")
    return (f"{phase.name}: unannounced (the days before had {phase.history[0][1]:.0f} req/s): {response}; its "
            f"requests: {meanwhile}")


def _wait_for_front_door(kube: Any, name: str, timeout_s: float = 60.0) -> str:
    from infer_ctl.kube.client import INFERENCE_SERVICES

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        obj = kube.get(INFERENCE_SERVICES, name, "default") or {}
        url = ((obj.get("metadata") or {}).get("annotations") or {}).get("sandbox.infer-ctl.io/url")
        if url:
            return str(url)
        time.sleep(0.2)  # the sandbox's router opens the door on its own loop
    raise RuntimeError(f"no front door for {name} within {timeout_s:.0f} s")


def _wait_ready(kube: Any, name: str, timeout_s: float) -> None:
    from infer_ctl.core.api import ReplicaState
    from infer_ctl.kube.client import PODS
    from infer_ctl.kube.pods import replica_pods

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replicas = replica_pods(kube.list(PODS, "default", label_selector=f"infer-ctl.io/service={name}"))
        if any(r.state is ReplicaState.SERVING for r in replicas):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{name}: no replica became ready within {timeout_s:.0f} s")


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


def plot(day: Day, rec: Recorder, timeline: Path, path: Path, *, start_s: float, slo_ms: float) -> None:
    """Three panels over the day's seconds: requests/s (offered, answered and failed by completion, the
    controller's observed rate and upper forecast), latency p50/p95 per scheduled second against the SLO, and
    the replicas by state (serving, standby, loading stacked) with the desired count; the phases shaded."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(12, 9.5), sharex=True,
                                           gridspec_kw={"height_ratios": [3, 2, 3]})
    rows: list[dict[str, str]] = []
    if timeline.exists():
        with timeline.open() as f:
            rows = list(csv.DictReader(f))
    x = [float(r["t_s"]) + start_s for r in rows]
    if rows:
        top.plot(x, [float(r["target"]) for r in rows], color="0.55", label="offered (loadgen)")
        top.plot(x, [float(r["answered"]) for r in rows], color="tab:green", linewidth=1.0,
                 label="answered (by completion)")
        if any(float(r["failed"]) for r in rows):
            top.plot(x, [float(r["failed"]) for r in rows], color="tab:red", linewidth=1.0,
                     label="failed (by completion)")
    t = [s.t_s for s in rec.samples]
    top.plot(t, [s.observed_rps for s in rec.samples], color="tab:blue", linewidth=1.0,
             label="observed by the controller")
    top.plot(t, [s.forecast_rps for s in rec.samples], color="tab:red", linestyle="--", linewidth=1.2,
             label="forecast (upper quantile over the horizon)")
    top.set_ylabel("requests/s")
    top.legend(loc="upper left", fontsize="small")
    # failures that end together (a timeout's worth of requests) spike far above the traffic: clipped
    peak = max([1.0] + [float(r["target"]) for r in rows]
               + [s.forecast_rps for s in rec.samples if not math.isnan(s.forecast_rps)])
    top.set_ylim(0, 1.6 * peak)
    if rows:
        ok = [(xi, r) for xi, r in zip(x, rows, strict=True) if int(r["ok"])]
        mid.plot([xi for xi, _ in ok], [float(r["p50_ms"]) for _, r in ok], color="tab:blue", linewidth=1.0,
                 label="p50")
        mid.plot([xi for xi, _ in ok], [float(r["p95_ms"]) for _, r in ok], color="tab:orange", linewidth=1.0,
                 label="p95")
        p95s = [float(r["p95_ms"]) for _, r in ok if float(r["p95_ms"]) > 0]
        if p95s and max(p95s) > 10 * min(p95s):  # a queue's seconds beside a replica's 100 ms
            mid.set_yscale("log")
    if not math.isnan(slo_ms):
        mid.axhline(slo_ms, color="black", linestyle=":", linewidth=1.0, label=f"SLO p95 {slo_ms:g} ms")
    mid.set_ylabel("latency, ms\n(by scheduled second)")
    mid.legend(loc="upper left", fontsize="small")
    states = [("Serving", "tab:blue"), ("Standby", "tab:cyan"), ("Loading", "tab:orange"), ("Pending", "0.7")]
    if rec.samples:
        bottom.stackplot(t, *[[s.count(state) for s in rec.samples] for state, _ in states],
                         colors=[c for _, c in states], labels=[state.lower() for state, _ in states], step="post",
                         alpha=0.85)
        bottom.step(t, [s.desired_serving + s.desired_standby for s in rec.samples], where="post", color="black",
                    linestyle=":", label="desired (serving + standby)")
    bottom.set_ylabel("replicas")
    bottom.set_xlabel("seconds of the compressed day")
    bottom.legend(loc="upper left", fontsize="small")
    for i, phase in enumerate(day.phases):
        for ax in (top, mid, bottom):
            ax.axvspan(phase.start_s, phase.end_s, color="0.93" if i % 2 else "white", zorder=0)
        top.annotate(phase.name + ("" if phase.predictable else "\n(unannounced)"),
                     ((phase.start_s + phase.end_s) / 2, 1.0), xycoords=("data", "axes fraction"),
                     ha="center", va="bottom", fontsize="x-small")
    top.set_xlim(0, day.day_s)
    fig.suptitle(f"infer-ctl demo: the chat service through a compressed day of {day.day_s:g} s, rates x"
                 f"{day.rate_scale:g}\n{day.describe()} req/s", fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _body(services: Sequence[Mapping[str, Any]], name: str, prompt: str) -> str:
    """A completion request to service `name`: its served model name (spec.model.name, which the engine requires in
    `model`) and a prompt."""
    model = next(str(s["spec"]["model"]["name"]) for s in services if s["metadata"]["name"] == name)
    return json.dumps({"model": model, "prompt": prompt, "stream": False})
