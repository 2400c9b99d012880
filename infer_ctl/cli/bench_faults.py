"""Fault-injection benchmark: `python -m infer_ctl.cli.bench_faults [--control-plane kube,emulator] [--trials 3]
[--scenarios api-faults,controller-kill,node-loss,metrics-outage] [--json]`.

Each scenario starts a fresh sandbox (deploy/sandbox/small.yaml; `kube`: the real kube-apiserver, kube-scheduler
and kube-controller-manager 1.37 with the node agent; `emulator`: the project's API server) and runs the
controller as a separate process (`infer-ctl controller`, as a user runs it; on `kube` as its ServiceAccount
with exactly deploy/kustomize's RBAC, `infer_ctl.sandbox.install`), then runs its trials one after the other, each
on an InferenceService of its own:

- api-faults: the controller talks to the API server through the fault proxy (`infer_ctl.sandbox.faultproxy`),
  which answers 10 % of its requests with 500, 409 or 429 (a third each; watches included) and delays another
  5 % by 0.5 s; the service is pinned to 3, then 5, then 2 replicas (`spec.replicas`).
- controller-kill: the controller is killed (SIGKILL) while the service's 4 replicas are being created, and
  started again.
- node-loss: the Node of one of the service's 3 ready replicas is deleted.
- metrics-outage: the controller reads rates from a Prometheus URL where nothing listens; a service at 3
  replicas with no traffic must hold them (missing metrics never scale down) for 40 s.
- malformed-specs: 40 manifests, each deploy/examples/llm-8b.yaml with one field broken (wrong types, out of
  range, unknown products, bad quantities, unsafe or broken queries, bad labels, missing sections): each must
  be refused by the API server naming the field, or marked Valid=False by the controller with one Event and no
  Pod or claim (the `--trials` count does not apply).

Each trial ends when the service converged (its replicas Ready, as many as pinned, status of the latest
generation) or after a timeout, and is checked: replicas duplicated (two live Pods for one replica), orphans
(a claim without its Pod, or a Pod without its claim), devices allocated to two claims, lost loops (the
controller process died, or the status never reached the latest generation), wrong scale-downs (fewer replicas
than held during a metrics outage), and the time to converge. Prints one row per scenario.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from infer_ctl.config.cluster import load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.kube.client import EVENTS, INFERENCE_SERVICES, NODES, PODS, RESOURCE_CLAIMS, KubeClient, KubeError
from infer_ctl.kube.inferenceservice import CRD_PATH
from infer_ctl.paths import data_path
from infer_ctl.sandbox.faultproxy import Fault, FaultProxy

SCENARIOS = ("api-faults", "controller-kill", "node-loss", "metrics-outage", "malformed-specs")
# (field path, bad value) applied to deploy/examples/llm-8b.yaml, one at a time; None deletes the field
MALFORMED: tuple[tuple[str, Any], ...] = (
    ("spec.scaling.minReplicas", -1), ("spec.scaling.minReplicas", "two"), ("spec.scaling.minReplicas", 1.5),
    ("spec.scaling.maxReplicas", 0), ("spec.scaling.maxReplicas", 100_000), ("spec.scaling.minReplicas", 9),
    ("spec.scaling.targetRequestsPerReplica", 0), ("spec.scaling.targetRequestsPerReplica", -5),
    ("spec.scaling.preset", "fast"), ("spec.scaling.metric", {"query": "vector(1e9)"}),
    ("spec.scaling.metric", {"query": 'sum(rate(x{service="{{name}}"}[1m]))'}),
    ("spec.scaling.metric", {"query": "sum(rate(x{"}), ("spec.scaling.metric", {"query": ""}),
    ("spec.scaling.forecast", {"method": "prophet"}), ("spec.scaling.prewarm", {"standbyReplicas": -1}),
    ("spec.model.memory", "12GB"), ("spec.model.kvCacheMemory", "-1Gi"), ("spec.model.name", ""),
    ("spec.model.parameters", "8 billion"), ("spec.model.dtype", "int3"), ("spec.model", None),
    ("spec.accelerator.products", ["H100"]), ("spec.accelerator.products", []),
    ("spec.accelerator.products", ["h100-80gb"]), ("spec.accelerator.count", 0),
    ("spec.accelerator.minComputeCapability", "eight"), ("spec.accelerator.sharing", "Sliced"),
    ("spec.runtime.port", 0), ("spec.runtime.port", 70_000), ("spec.runtime.image", ""),
    ("spec.runtime.coldStartSeconds", -3), ("spec.runtime.memory", "lots"), ("spec.runtime", None),
    ("spec.slo.latencyP95Ms", -1), ("spec.replicas", -2), ("spec.unknownField", 1),
    ("metadata.labels", {"team": "ml infra"}), ("metadata.labels", {"model": "meta-llama/Llama"}),
    ("spec", None), ("spec.scaling", "fast"),
)
NS = "default"
ORPHAN_GRACE_S = 45.0  # three control periods and the claim collector's two-cycle rule


@dataclass
class Outcome:
    scenario: str
    trials: int = 0
    faults: int = 0
    duplicates: int = 0
    orphans: int = 0
    double_used: int = 0
    lost_loops: int = 0
    wrong_scale_downs: int = 0
    not_converged: int = 0
    converge_s: list[float] = field(default_factory=list)
    refused_by_api: int = 0  # malformed-specs: refused by the API server, naming the field
    marked_invalid: int = 0  # malformed-specs: admitted, then Valid=False with one Event
    admitted_valid: int = 0  # malformed-specs: the mutation left a valid spec
    notes: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        c = self.converge_s
        return {"scenario": self.scenario, "trials": self.trials, "faults_injected": self.faults,
                "duplicates": self.duplicates, "orphans": self.orphans, "double_used_devices": self.double_used,
                "lost_loops": self.lost_loops, "wrong_scale_downs": self.wrong_scale_downs,
                "not_converged": self.not_converged,
                "converge_s_median": round(statistics.median(c), 1) if c else None,
                "converge_s_max": round(max(c), 1) if c else None,
                **({"refused_by_api": self.refused_by_api, "marked_invalid": self.marked_invalid,
                    "admitted_valid": self.admitted_valid} if self.scenario == "malformed-specs" else {}),
                **({"notes": self.notes} if self.notes else {})}


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def _live(kube: KubeClient, service: str) -> list[dict[str, Any]]:
    return [p for p in kube.list(PODS, NS, label_selector=f"infer-ctl.io/service={service}")
            if not p["metadata"].get("deletionTimestamp")]


def _service(name: str, replicas: int | None, *, cold_start_s: float = 2.0) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"name": f"model-{name}", "memory": "12Gi"},
        "runtime": {"image": "server:1", "coldStartSeconds": cold_start_s},
        "accelerator": {"products": ["H100-80GB", "A100-80GB"]},
        "scaling": {"minReplicas": 1, "maxReplicas": 6, "targetRequestsPerReplica": 10, "preset": "cost-saver"}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService", "metadata": {"name": name},
            "spec": spec}


def _converged(kube: KubeClient, name: str, want: int) -> bool:
    obj = kube.get(INFERENCE_SERVICES, name, NS) or {}
    status = obj.get("status") or {}
    pods = _live(kube, name)
    return (len(pods) == want and all(_ready(p) for p in pods)
            and status.get("observedGeneration") == (obj.get("metadata") or {}).get("generation")
            and (status.get("replicas") or {}).get("ready") == want)


def _some_but_not_all(kube: KubeClient, name: str, n: int) -> bool:
    return 0 < len(_live(kube, name)) < n


def _wait(check: Callable[[], bool], timeout_s: float, *, poll_s: float = 0.2) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        with contextlib.suppress(KubeError):
            if check():
                return time.monotonic() - started
        time.sleep(poll_s)
    return None


def _mismatch(kube: KubeClient, name: str) -> tuple[Counter[str | None], int]:
    """(live Pods per replica, claims without a live Pod + live Pods without a claim) of one service."""
    pods = _live(kube, name)
    replicas = Counter((p["metadata"].get("labels") or {}).get("infer-ctl.io/replica") for p in pods)
    claims = [c for c in kube.list(RESOURCE_CLAIMS, NS, label_selector=f"infer-ctl.io/service={name}")
              if not c["metadata"].get("deletionTimestamp")]
    claimed = {(c["metadata"].get("labels") or {}).get("infer-ctl.io/replica") for c in claims}
    return replicas, len(claimed - set(replicas)) + len(set(replicas) - claimed)


def _check(kube: KubeClient, name: str, outcome: Outcome) -> None:
    """Count duplicates, orphans and doubly used devices of one service once it settled: a claim whose replica
    went is collected after two control cycles saw it so, so orphans are what remains after ORPHAN_GRACE_S."""
    _wait(lambda: _mismatch(kube, name)[1] == 0, ORPHAN_GRACE_S)
    replicas, orphans = _mismatch(kube, name)
    outcome.duplicates += sum(n - 1 for n in replicas.values() if n > 1)
    outcome.orphans += orphans


def _double_used(kube: KubeClient) -> int:
    devices = Counter((r.get("pool"), r.get("device"), r.get("shareID"))
                      for c in kube.list(RESOURCE_CLAIMS, NS)
                      for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
                      or ())
    return sum(n - 1 for n in devices.values() if n > 1)


class Harness:
    """One sandbox and the controller process under test."""

    def __init__(self, control_plane: str, workdir: Path) -> None:
        self.control_plane, self.workdir = control_plane, workdir
        self.policies = load_policies()
        self.kubeconfig = workdir / "kubeconfig"
        self.controller: subprocess.Popen[bytes] | None = None
        self.controller_kubeconfig = self.kubeconfig
        self.kube: KubeClient | None = None

    @contextlib.contextmanager
    def sandbox(self) -> Iterator[KubeClient]:
        import yaml

        topology = load_cluster(data_path("deploy/sandbox/small.yaml"), self.policies.catalog)
        if self.control_plane == "kube":
            from infer_ctl.sandbox.kubesandbox import kube_sandbox_in_thread

            manager: contextlib.AbstractContextManager[Any] = kube_sandbox_in_thread(
                topology, self.policies.catalog, kubeconfig=self.kubeconfig)
        else:
            from infer_ctl.sandbox.runtime import sandbox_in_thread

            manager = sandbox_in_thread(topology, self.policies.catalog, kubeconfig=self.kubeconfig)
        with manager as sb:
            kube = KubeClient.from_config(str(self.kubeconfig))
            local = getattr(sb, "local", None)
            if local is not None:
                # the controller runs as its ServiceAccount with deploy/'s RBAC, as installed (not as an admin)
                from infer_ctl.sandbox.install import install_controller

                self.controller_kubeconfig = install_controller(local, self.workdir / "controller.kubeconfig",
                                                                (NS,), replace_sandbox_classes=kube)
            else:
                kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                             body=yaml.safe_load(CRD_PATH.read_text()))
            self.kube = kube
            try:
                yield kube
            finally:
                self.stop_controller()
                kube.close()

    def start_controller(self, kubeconfig: Path | None = None, *extra: str) -> None:
        log = (self.workdir / "controller.log").open("ab")
        self.controller = subprocess.Popen(
            [sys.executable, "-m", "infer_ctl.cli.main", "controller", "--kubeconfig",
             str(kubeconfig or self.controller_kubeconfig), "--namespace", NS, *extra],
            stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        time.sleep(3)  # kopf's start: login, discovery, watches

    def stop_controller(self, sig: int = signal.SIGTERM) -> None:
        if self.controller is not None and self.controller.poll() is None:
            self.controller.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.controller.wait(30)
            if self.controller.poll() is None:
                self.controller.kill()
                self.controller.wait(10)
        self.controller = None

    def alive(self) -> bool:
        return self.controller is not None and self.controller.poll() is None


def _pin_and_converge(kube: KubeClient, name: str, replicas: int, timeout_s: float) -> float | None:
    kube.merge_patch(INFERENCE_SERVICES, name, {"spec": {"replicas": replicas}}, NS)
    return _wait(lambda: _converged(kube, name, replicas), timeout_s)


def api_faults(h: Harness, trials: int) -> Outcome:
    out = Outcome("api-faults")
    assert h.kube is not None
    kube = h.kube
    proxy = FaultProxy.for_kubeconfig(h.controller_kubeconfig)
    faults = [proxy.add(Fault(None, r".", status=code, times=None, probability=0.1 / 3))
              for code in (500, 409, 429)]
    faults.append(proxy.add(Fault(None, r".", delay_s=0.5, times=None, probability=0.05)))
    with proxy.running():
        h.start_controller(proxy.write_kubeconfig(h.workdir / "proxied.kubeconfig"))
        for i in range(trials):
            name = f"faults-{i}"
            kube.create(INFERENCE_SERVICES, _service(name, 3), NS)
            times = [_wait(partial(_converged, kube, name, 3), 120)]
            for replicas in (5, 2):
                times.append(_pin_and_converge(kube, name, replicas, 120))
            _settle_and_check(h, name, out, times)
        out.faults = sum(f.injected for f in faults)
    return out


def controller_kill(h: Harness, trials: int) -> Outcome:
    """The controller's creates are slowed (0.5 s each, through the fault proxy) so that it is killed in the
    middle of writing a service's 4 replicas (claims and Pods); the time is from the kill to convergence."""
    out = Outcome("controller-kill")
    assert h.kube is not None
    kube = h.kube
    proxy = FaultProxy.for_kubeconfig(h.controller_kubeconfig)
    proxy.add(Fault("POST", r"/(pods|resourceclaims)$", delay_s=0.5, times=None))
    with proxy.running():
        kubeconfig = proxy.write_kubeconfig(h.workdir / "proxied.kubeconfig")
        for i in range(trials):
            name = f"kill-{i}"
            h.start_controller(kubeconfig)
            kube.create(INFERENCE_SERVICES, _service(name, 4, cold_start_s=3.0), NS)
            # killed once some, not all, of its replicas exist
            if _wait(partial(_some_but_not_all, kube, name, 4), 30, poll_s=0.05) is None:
                out.notes.append(f"trial {i}: no moment with some but not all replicas seen; killed late")
            h.stop_controller(signal.SIGKILL)
            killed = time.monotonic()
            out.faults += 1
            h.start_controller(kubeconfig)
            took = _wait(partial(_converged, kube, name, 4), 120)
            _settle_and_check(h, name, out, [None if took is None else time.monotonic() - killed])
            h.stop_controller()
    return out


def node_loss(h: Harness, trials: int) -> Outcome:
    out = Outcome("node-loss")
    assert h.kube is not None
    kube = h.kube
    h.start_controller()
    for i in range(trials):
        name = f"node-{i}"
        kube.create(INFERENCE_SERVICES, _service(name, 3), NS)
        if _wait(partial(_converged, kube, name, 3), 120) is None:
            out.trials += 1
            out.not_converged += 1
            continue
        victim = next(p for p in _live(kube, name) if (p.get("spec") or {}).get("nodeName"))
        node = victim["spec"]["nodeName"]
        kube.delete(NODES, node)
        out.faults += 1

        def replaced(n: str = name, lost: str = node) -> bool:
            pods = _live(kube, n)
            return (len(pods) == 3 and all(_ready(p) for p in pods)
                    and all((p.get("spec") or {}).get("nodeName") != lost for p in pods))

        took = _wait(replaced, 120)
        _settle_and_check(h, name, out, [took], converged=took is not None)
    return out


def metrics_outage(h: Harness, trials: int) -> Outcome:
    out = Outcome("metrics-outage")
    assert h.kube is not None
    kube = h.kube
    h.start_controller(None, "--prometheus-url", "http://127.0.0.1:9")  # nothing listens on port 9
    for i in range(trials):
        name = f"outage-{i}"
        kube.create(INFERENCE_SERVICES, _service(name, 3), NS)
        took = _wait(partial(_converged, kube, name, 3), 120)
        # autoscaling resumes with the rate unreadable: the 3 replicas must stay
        kube.merge_patch(INFERENCE_SERVICES, name, {"spec": {"replicas": None}}, NS)
        out.faults += 1
        lowest = 3
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            with contextlib.suppress(KubeError):
                lowest = min(lowest, len(_live(kube, name)))
            time.sleep(0.5)
        out.wrong_scale_downs += lowest < 3
        _settle_and_check(h, name, out, [took], converged=took is not None)
    return out


def _settle_and_check(h: Harness, name: str, out: Outcome, times: list[float | None], *,
                      converged: bool | None = None) -> None:
    assert h.kube is not None
    out.trials += 1
    done = all(t is not None for t in times) if converged is None else converged
    if done:
        out.converge_s.extend(t for t in times if t is not None)
    else:
        out.not_converged += 1
    if not h.alive():
        out.lost_loops += 1
    obj = h.kube.get(INFERENCE_SERVICES, name, NS) or {}
    if (obj.get("status") or {}).get("observedGeneration") != (obj.get("metadata") or {}).get("generation"):
        out.lost_loops += 1
    _check(h.kube, name, out)
    out.double_used = _double_used(h.kube)
    kube = h.kube
    kube.delete(INFERENCE_SERVICES, name, NS)
    _wait(lambda: not _live(kube, name), 60)


def _mutated(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    import copy

    obj = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = obj
    for key in parents:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return obj


def malformed_specs(h: Harness, trials: int) -> Outcome:
    """Every MALFORMED manifest (`trials` is ignored: the list is the trials): refused by the API server with
    the field named, or admitted and marked Valid=False by the controller with exactly one InvalidSpec Event,
    touching nothing (no Pod, no claim). `not_converged` counts the manifests that met neither; `lost_loops` a
    controller that died."""
    import yaml

    out = Outcome("malformed-specs")
    assert h.kube is not None
    kube = h.kube
    base = yaml.safe_load(data_path("deploy/examples/llm-8b.yaml").read_text())
    h.start_controller()
    for i, (path, value) in enumerate(MALFORMED):
        name = f"bad-{i}"
        manifest = _mutated({**base, "metadata": {**base["metadata"], "name": name}}, path, value)
        out.trials += 1
        out.faults += 1
        try:
            kube.create(INFERENCE_SERVICES, manifest, NS)
        except KubeError as exc:
            out.refused_by_api += 1
            if exc.status != 422 or not any(part in exc.message for part in ("spec", "metadata")):
                out.not_converged += 1
            continue

        def judged(n: str = name) -> bool:
            status = (kube.get(INFERENCE_SERVICES, n, NS) or {}).get("status") or {}
            return any(c.get("type") == "Valid" for c in status.get("conditions") or ())

        started = time.monotonic()
        if _wait(judged, 30) is None:
            out.not_converged += 1
            continue
        out.converge_s.append(time.monotonic() - started)
        status = (kube.get(INFERENCE_SERVICES, name, NS) or {}).get("status") or {}
        valid = next(c for c in status["conditions"] if c["type"] == "Valid")
        time.sleep(1)  # a second Event would come within a control period; one is enough to see
        events = [e for e in kube.list(EVENTS, NS)
                  if (e.get("regarding") or {}).get("name") == name and e.get("reason") == "InvalidSpec"]
        touched = _live(kube, name) or kube.list(RESOURCE_CLAIMS, NS, label_selector=f"infer-ctl.io/service={name}")
        if valid["status"] == "False" and len(events) == 1 and not touched:
            out.marked_invalid += 1
        elif valid["status"] == "True":
            out.admitted_valid += 1  # the mutation left a valid spec (e.g. an unknown field pruned)
            out.notes.append(f"admitted as valid: {path}={value!r}")
        else:
            out.not_converged += 1
        kube.delete(INFERENCE_SERVICES, name, NS)
    if not h.alive():
        out.lost_loops += 1
    return out


RUNNERS: dict[str, Callable[[Harness, int], Outcome]] = {
    "api-faults": api_faults, "controller-kill": controller_kill, "node-loss": node_loss,
    "metrics-outage": metrics_outage, "malformed-specs": malformed_specs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--control-plane", default="kube", help="kube, emulator or both (comma-separated)")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", action="store_true", help="one JSON object per scenario instead of the table")
    args = parser.parse_args(argv)
    for control_plane in args.control_plane.split(","):
        for scenario in args.scenarios.split(","):
            started = time.monotonic()
            # a Node deleted does not come back: each node-loss trial gets a cluster of its own
            rounds = [1] * args.trials if scenario == "node-loss" else [args.trials]
            outcome = Outcome(scenario)
            for trials in rounds:
                with tempfile.TemporaryDirectory(prefix=f"infer-ctl-faults-{scenario}-") as tmp:
                    harness = Harness(control_plane, Path(tmp))
                    with harness.sandbox():
                        outcome = _merge(outcome, RUNNERS[scenario](harness, trials))
            row = {"control_plane": control_plane, **outcome.row(), "wall_s": round(time.monotonic() - started)}
            print(json.dumps(row) if args.json else _line(row), flush=True)
    return 0


def _merge(a: Outcome, b: Outcome) -> Outcome:
    counts = ("trials", "faults", "duplicates", "orphans", "double_used", "lost_loops", "wrong_scale_downs",
              "not_converged", "refused_by_api", "marked_invalid", "admitted_valid")
    merged = Outcome(a.scenario, converge_s=a.converge_s + b.converge_s, notes=a.notes + b.notes)
    for name in counts:
        setattr(merged, name, getattr(a, name) + getattr(b, name))
    return merged


def _line(row: dict[str, Any]) -> str:
    return "  ".join(f"{k}={v}" for k, v in row.items())


if __name__ == "__main__":
    sys.exit(main())
