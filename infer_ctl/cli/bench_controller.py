"""Controller benchmark: `python -m infer_ctl.cli.bench_controller [--services 10,100] [--cluster FILE]
[--control-plane emulator,kube]`.

For each control plane and count N it starts a fresh sandbox (deploy/sandbox/large.yaml by default, model servers
with no cold start; `emulator`: the project's API server and scheduler; `kube`: the real kube-apiserver,
kube-scheduler and kube-controller-manager 1.37 with the node agent) and the controller as a separate process
(`infer-ctl controller`, direct scrape, metrics on a local port), applies N InferenceServices at once and prints:

- apply -> all claims and Pods created (reconcile latency of the first cycles), and -> all replicas Ready;
- the controller's own cycle times from its `infer_ctl_reconcile_seconds` histogram (mean, and the estimated
  p50/p99 from the buckets);
- one control round for all N services: a fresh process runs every service's cycle at once, twice (the first
  round builds each service's memory, the second is the steady state), and prints the wall time of each;
- the controller process's resident memory (VmRSS) after the services settle, and its peak (VmHWM);
- on `kube`: the API requests the controller sent per minute over the settle window, by verb and resource,
  from kube-apiserver's audit log (the controller runs as a user of its own, with admin rights). The window
  opens once every service shows its first forecast (`all_forecast_s`): until then each one's status is still
  being filled in (replicas placed and Ready, the first rate read, the first forecast), which is not idle load.

`--controller-tree PATH` runs the controller from another checkout (e.g. `git worktree add /tmp/before <commit>`),
so that one harness measures before and after a change.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _rss_mib(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _histogram(text: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                buckets.append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_sum"):
                total = s.value
            elif s.name.endswith("_count"):
                count = s.value
    return sorted(buckets), total, count


def _quantile(buckets: list[tuple[float, float]], count: float, q: float) -> float:
    """Prometheus' histogram_quantile: linear within the bucket that holds the rank."""
    rank, lower, below = q * count, 0.0, 0.0
    for upper, cumulative in buckets:
        if cumulative >= rank:
            if upper == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = upper, cumulative
    return lower


# the controller's own user on `kube` (its ServiceAccount, infer_ctl.sandbox.install), so the audit log tells its
# requests
CONTROLLER_USER = "system:serviceaccount:infer-ctl-system:infer-ctl"


def api_requests(audit_log: Path, user: str, start: datetime, end: datetime) -> Counter[str]:
    """The requests `user` completed between `start` and `end`, by verb and resource (kube-apiserver's audit log,
    one JSON event per line at stage ResponseComplete; a watch counts once, when it ends)."""
    counts: Counter[str] = Counter()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        if (event.get("user") or {}).get("username") != user:
            continue
        at = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if not start <= at < end:
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource") or event.get("requestURI", "?").split("?")[0]
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        counts[f"{event.get('verb')} {resource}"] += 1
    return counts


def run_one(n: int, cluster_file: Path, settle_s: float, control_plane: str = "emulator",
            controller_tree: Path | None = None) -> dict[str, Any]:
    import httpx
    import yaml

    from infer_ctl.config.cluster import load_cluster
    from infer_ctl.config.policies import load_policies
    from infer_ctl.kube.client import INFERENCE_SERVICES, PODS, RESOURCE_CLAIMS, KubeClient
    from infer_ctl.kube.inferenceservice import CRD_PATH
    from infer_ctl.sandbox.runtime import sandbox_in_thread

    policies = load_policies()
    tmp = Path(f"/tmp/infer-ctl-bench-{control_plane}-{n}")
    tmp.mkdir(exist_ok=True)
    kubeconfig = tmp / "kubeconfig"
    cluster = load_cluster(cluster_file, policies.catalog)
    sandbox: contextlib.AbstractContextManager[Any]
    if control_plane == "kube":
        from infer_ctl.sandbox.kubesandbox import kube_sandbox_in_thread

        # the node agent records the nodes' model caches itself: a reporter process per node (60 on large.yaml,
        # about 60 MB each) would measure the machine, not the controller
        sandbox = kube_sandbox_in_thread(cluster, policies.catalog, kubeconfig=kubeconfig, audit_log=True,
                                         node_cache_reporter=False)
    else:
        sandbox = sandbox_in_thread(cluster, policies.catalog, kubeconfig=kubeconfig)
    with sandbox as sb:
        kube = KubeClient.from_config(str(kubeconfig))
        from infer_ctl.sandbox.kubesandbox import KubeSandbox

        local = sb.local if isinstance(sb, KubeSandbox) else None  # the real control plane, on `kube`
        controller_kubeconfig = kubeconfig
        if local is not None:
            # as its ServiceAccount with exactly deploy/'s RBAC (a --controller-tree older than that RBAC may be
            # refused what it used to be granted)
            from infer_ctl.sandbox.install import install_controller

            controller_kubeconfig = install_controller(local, tmp / "controller.kubeconfig", ("default",),
                                                       replace_sandbox_classes=kube)
        if control_plane != "kube":  # kube_sandbox_in_thread installs it and waits until it is served
            kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                         body=yaml.safe_load(CRD_PATH.read_text()))
        port = 19464 + n
        # The controller of this checkout, or of another (`--controller-tree`: e.g. a worktree of an older
        # commit, to measure before and after a change with the same harness).
        tree = controller_tree or ROOT
        controller = subprocess.Popen(
            [sys.executable, "-m", "infer_ctl.cli.main", "controller", "--kubeconfig", str(controller_kubeconfig),
             "--namespace", "default", "--metrics-port", str(port)], cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=subprocess.DEVNULL, stderr=(tmp / "controller.log").open("w"))
        try:
            time.sleep(3)  # kopf's start (login, discovery, watches); there is no readiness endpoint to await
            products = [["H100-80GB"], ["A100-80GB"], ["L4"]]
            started = time.monotonic()
            for i in range(n):
                kube.create(INFERENCE_SERVICES, {
                    "apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService",
                    "metadata": {"name": f"svc-{i}"},
                    "spec": {"model": {"name": f"model-{i}", "memory": "12Gi"},
                             "runtime": {"image": "server:1", "coldStartSeconds": 0},
                             "accelerator": {"products": products[i % 3]},
                             "scaling": {"minReplicas": 1, "maxReplicas": 2, "targetRequestsPerReplica": 10,
                                         "preset": "cost-saver"}}}, "default")
            applied = time.monotonic() - started
            created_at = ready_at = None
            ready = 0
            while time.monotonic() - started < 180:
                pods = kube.list(PODS, "default")
                claims = kube.list(RESOURCE_CLAIMS, "default")
                if created_at is None and len(pods) >= n and len(claims) >= n:
                    created_at = time.monotonic() - started
                ready = sum(any(c.get("type") == "Ready" and c.get("status") == "True"
                                for c in (p.get("status") or {}).get("conditions") or ()) for p in pods)
                if ready >= n:
                    ready_at = time.monotonic() - started
                    break
                time.sleep(0.2)
            # A service's first cycles write its status as it starts: its replicas placed and Ready, its first
            # rate reading, its first forecast (about a minute of history later); the window of steady cycles
            # opens once every service has had that forecast, so that the API load it counts is the idle one
            forecast_at: float | None = None  # None: not every service had a forecast within 300 s
            while time.monotonic() - started < 300:
                if all((svc.get("status") or {}).get("forecast") for svc in kube.list(INFERENCE_SERVICES, "default")):
                    forecast_at = time.monotonic() - started
                    break
                time.sleep(1.0)
            window_start = datetime.now(UTC)
            time.sleep(settle_s)  # let several control periods pass for the cycle-time histogram
            window_end = datetime.now(UTC)
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            buckets, total, count = _histogram(text, "infer_ctl_reconcile_seconds")
            rss, peak = _rss_mib(controller.pid)
            controller.terminate()
            controller.wait(30)
            requests: Counter[str] | None = None
            if local is not None:
                time.sleep(2)  # the audit log is written in batches
                requests = api_requests(local.audit_path, CONTROLLER_USER, window_start, window_end)
            # One control round over every service (all N cycles at once, as the timers fire), by a fresh
            # process on the settled cluster: the first round builds each service's memory, the second is
            # the steady state.
            rounds = json.loads(subprocess.run(
                [sys.executable, "-m", "infer_ctl.cli.bench_controller", "--round", str(kubeconfig)],
                capture_output=True, text=True, check=True, timeout=600).stdout)
        finally:
            if controller.poll() is None:
                controller.terminate()
                controller.wait(30)
            kube.close()
    mean = total / count if count else float("nan")
    return {
        "control_plane": control_plane, "services": n, "apply_s": round(applied, 2),
        "all_claims_and_pods_created_s": None if created_at is None else round(created_at, 2),
        "all_ready_s": None if ready_at is None else round(ready_at, 2), "ready_replicas": ready,
        "all_forecast_s": None if forecast_at is None else round(forecast_at, 1),
        "cycles_measured": int(count), "cycle_mean_ms": round(mean * 1000, 1),
        "cycle_p50_ms": round(_quantile(buckets, count, 0.5) * 1000, 1),
        "cycle_p99_ms": round(_quantile(buckets, count, 0.99) * 1000, 1),
        "controller_rss_mib": round(rss, 1), "controller_peak_rss_mib": round(peak, 1),
        "round_first_s": rounds["first_s"], "round_steady_s": rounds["steady_s"],
        "api_requests_per_min": None if requests is None else round(sum(requests.values()) * 60 / settle_s, 1),
        "api_requests_by_verb_resource_per_min": None if requests is None else {
            k: round(v * 60 / settle_s, 1) for k, v in requests.most_common()},
    }


def one_round(kubeconfig: str) -> dict[str, float]:
    """Two control rounds over every InferenceService, each with all cycles started at once."""
    import asyncio
    from datetime import UTC, datetime

    from infer_ctl.config.policies import load_policies
    from infer_ctl.controller.reconciler import Reconciler, Settings
    from infer_ctl.kube.client import INFERENCE_SERVICES, KubeClient

    async def rounds() -> dict[str, float]:
        kube = KubeClient.from_config(kubeconfig)
        reconciler = Reconciler(kube, Settings(load_policies()))
        bodies = kube.list(INFERENCE_SERVICES, "default")
        out = {}
        async def cycle(body: dict[str, Any]) -> None:  # as the operator's handler: the cycle, then its status
            result = await reconciler.cycle(body, datetime.now(UTC))
            meta = body["metadata"]
            await asyncio.to_thread(kube.merge_patch, INFERENCE_SERVICES, meta["name"], {"status": result.status},
                                    meta["namespace"], subresource="status")

        for name in ("first_s", "steady_s"):
            started = time.monotonic()
            await asyncio.gather(*(cycle(b) for b in bodies))
            out[name] = round(time.monotonic() - started, 2)
        await reconciler.close()
        kube.close()
        return out

    return asyncio.run(rounds())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infer_ctl.cli.bench_controller", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", default="10,100", help="comma-separated service counts (default 10,100)")
    parser.add_argument("--cluster", type=Path, default=ROOT / "deploy" / "sandbox" / "large.yaml")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds of steady cycles to measure")
    parser.add_argument("--control-plane", default="emulator,kube",
                        help="comma-separated: emulator, kube (default both, one table)")
    parser.add_argument("--controller-tree", type=Path, default=None,
                        help="run the controller from this checkout (default: this one)")
    parser.add_argument("--round", metavar="KUBECONFIG", help=argparse.SUPPRESS)  # the round, in its own process
    args = parser.parse_args(argv)
    if args.round:
        print(json.dumps(one_round(args.round)))
        return 0
    rows = []
    for plane in args.control_plane.split(","):
        for n in (int(x) for x in args.services.split(",")):
            rows.append(run_one(n, args.cluster, args.settle, plane, args.controller_tree))
            print(json.dumps(rows[-1]), flush=True)
    print(_table(rows))
    return 0


def _table(rows: list[dict[str, Any]]) -> str:
    columns = [("control_plane", "control plane"), ("services", "services"),
               ("all_claims_and_pods_created_s", "created s"), ("all_ready_s", "all Ready s"),
               ("cycle_p50_ms", "cycle p50 ms"), ("cycle_p99_ms", "cycle p99 ms"),
               ("round_steady_s", "round s"), ("controller_peak_rss_mib", "peak RSS MiB"),
               ("api_requests_per_min", "API requests/min")]
    lines = ["| " + " | ".join(title for _, title in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(key)) for key, _ in columns) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
