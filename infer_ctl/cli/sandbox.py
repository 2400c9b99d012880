"""`infer-ctl sandbox up --cluster FILE [--port N] [--kubeconfig OUT]`: the local sandbox cluster, with the
InferenceService CRD installed (on either control plane), so the examples apply at once."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from infer_ctl.paths import data_path


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("sandbox", help="run the local sandbox cluster",
                                   description="The local sandbox: a Kubernetes API server with GPU nodes (DRA), "
                                               "a scheduler, a node agent running model servers, and routing.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start the sandbox and serve until Ctrl-C")
    up.add_argument("--cluster", type=Path, default=data_path("deploy/sandbox/small.yaml"),
                    help="cluster file (default: deploy/sandbox/small.yaml)")
    up.add_argument("--port", type=int, default=0, help="API server port on 127.0.0.1 (default: any free port)")
    up.add_argument("--kubeconfig", type=Path, default=Path(".sandbox/kubeconfig"),
                    help="where to write the kubeconfig (default: .sandbox/kubeconfig)")
    up.add_argument("--policies", type=Path, default=None, help="policies directory (default: policies/)")
    up.add_argument("--control-plane", choices=("emulator", "kube"), default="emulator",
                    help="emulator (default): the project's fast embedded API server and scheduler; kube: the real "
                         "kube-apiserver, kube-scheduler and kube-controller-manager 1.37 with etcd (built from "
                         "their Go modules on first use), with the node agent as kubelet and DRA driver; either way "
                         "the InferenceService CRD is installed")
    up.add_argument("--node-cache-reporter", choices=("daemonset", "agent"), default="daemonset",
                    help="with --control-plane kube, who records the nodes' model caches: daemonset (default): "
                         "deploy/'s DaemonSet, a process of about 60 MB per node; agent: the node agent itself, "
                         "for clusters of many nodes (the emulator always does the latter)")
    up.add_argument("--images", type=Path, default=None, metavar="FILE",
                    help="image table (YAML: images: [{image: GLOB, command: [ARGV...]}]): the local command the "
                         "node agent runs for a container image, before the built-in entries (vLLM's and SGLang's "
                         "images run the sandbox's stand-ins)")
    up.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from infer_ctl.cli.extras import require
    from infer_ctl.core.errors import SpecError

    require("sandbox", "the sandbox")
    from infer_ctl.sandbox.images import ImageTableError, load_image_table
    from infer_ctl.sandbox.runtime import Sandbox, load

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        cluster, catalog = load(args.cluster, args.policies)
        images = load_image_table(args.images)
    except (SpecError, ImageTableError) as e:
        print(f"infer-ctl sandbox: {e}", file=sys.stderr)
        return 2
    if args.control_plane == "kube":
        return _run_kube(args, cluster, catalog, images)
    sandbox = Sandbox(cluster, catalog, port=args.port or None, kubeconfig=args.kubeconfig.resolve(), images=images)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await sandbox.start()
        try:
            crd = install_crd(sandbox)
            nodes = ", ".join(f"{p.count} x {p.name}" + (f" ({p.gpus} x {p.accelerator}, {p.gpu_mode})"
                                                         if p.accelerator else "") for p in cluster.pools)
            print(f"sandbox {cluster.name!r} is up: {nodes}", flush=True)
            print(f"  API server:  {sandbox.url}", flush=True)
            print(f"  kubeconfig:  {args.kubeconfig.resolve()}   (export KUBECONFIG={args.kubeconfig.resolve()})",
                  flush=True)
            print(f"  CRD:         {crd} installed", flush=True)
            _print_next_steps(args.kubeconfig.resolve())
            print("  front doors: one per InferenceService, URL in its annotation sandbox.infer-ctl.io/url "
                  "(logged as they open)", flush=True)
            print(f"  gateway metrics: {sandbox.endpoints()['gateway-metrics']}   (every door's requests, held "
                  "ones too: a Prometheus target, or `infer-ctl controller --gateway-metrics-url`)", flush=True)
            print("Ctrl-C stops the sandbox and every model server it started.", flush=True)
            await stop.wait()
        finally:
            print("stopping the sandbox ...", flush=True)
            await sandbox.stop()
            print("stopped.", flush=True)

    try:
        asyncio.run(main())
    except OSError as e:  # e.g. the port is taken
        print(f"infer-ctl sandbox: cannot start the API server on 127.0.0.1:{args.port}: {e.strerror or e}",
              file=sys.stderr)
        return 1
    return 0


def _run_kube(args: argparse.Namespace, cluster: Any, catalog: Any, images: Any) -> int:
    """The real control plane with the node agent, until SIGINT or SIGTERM."""
    import logging
    import signal
    import threading

    from infer_ctl.kube.client import KubeError
    from infer_ctl.sandbox.kubesandbox import kube_sandbox_in_thread
    from infer_ctl.sandbox.localcluster import LocalClusterError

    logging.getLogger("infer_ctl.sandbox.localcluster").setLevel(logging.INFO)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    kubeconfig = args.kubeconfig.resolve()
    print("starting etcd, kube-apiserver, kube-scheduler and kube-controller-manager (building them first if "
          "needed) ...", flush=True)
    try:
        with kube_sandbox_in_thread(cluster, catalog, kubeconfig=kubeconfig, images=images,
                                    node_cache_reporter=args.node_cache_reporter == "daemonset") as sandbox:
            nodes = ", ".join(f"{p.count} x {p.name}" + (f" ({p.gpus} x {p.accelerator}, {p.gpu_mode})"
                                                         if p.accelerator else "") for p in cluster.pools)
            print(f"control plane {cluster.name!r} is up (Kubernetes 1.37, real): {nodes}", flush=True)
            print(f"  API server:  {sandbox.url}", flush=True)
            print(f"  kubeconfig:  {kubeconfig}   (export KUBECONFIG={kubeconfig})", flush=True)
            print(f"  logs:        {sandbox.local.workdir}/logs/", flush=True)
            print(f"  CRD:         {_crd_name()} installed", flush=True)
            _print_next_steps(kubeconfig)
            print("  front doors: one per InferenceService, URL in its annotation sandbox.infer-ctl.io/url",
                  flush=True)
            print(f"  gateway metrics: {sandbox.endpoints()['gateway-metrics']}   (every door's requests, held "
                  "ones too: a Prometheus target, or `infer-ctl controller --gateway-metrics-url`)", flush=True)
            print("Ctrl-C stops the control plane and every model server it started.", flush=True)
            stop.wait()
            print("stopping ...", flush=True)
    except (LocalClusterError, KubeError) as e:
        print(f"infer-ctl sandbox: {e}", file=sys.stderr)
        return 1
    print("stopped.", flush=True)
    return 0



def _crd_name() -> str:
    import yaml

    from infer_ctl.kube.inferenceservice import CRD_PATH

    return str(yaml.safe_load(CRD_PATH.read_text())["metadata"]["name"])


def install_crd(sandbox: Any) -> str:
    """Create the InferenceService CRD in the emulator's store (validated, then served at once, as
    apiextensions-apiserver establishes it); returns its name."""
    import yaml

    from infer_ctl.kube.inferenceservice import CRD_PATH

    crds = sandbox.store.type("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    sandbox.store.create(crds, None, yaml.safe_load(CRD_PATH.read_text()), validate=True)
    return _crd_name()


def _print_next_steps(kubeconfig: Path) -> None:
    example = data_path("deploy/examples/llm-8b.yaml")
    print(f"  next:        infer-ctl controller --kubeconfig {kubeconfig}   (in another terminal)", flush=True)
    print(f"               kubectl apply -f {example}; kubectl get infsvc -w", flush=True)
