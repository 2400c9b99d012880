"""`infer-ctl sandbox up --cluster FILE [--port N] [--kubeconfig OUT]`: the local sandbox cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("sandbox", help="run the local sandbox cluster",
                                   description="The local sandbox: a Kubernetes API server with GPU nodes (DRA), "
                                               "a scheduler, a node agent running model servers, and routing.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start the sandbox and serve until Ctrl-C")
    up.add_argument("--cluster", type=Path, default=Path("deploy/sandbox/small.yaml"),
                    help="cluster file (default: deploy/sandbox/small.yaml)")
    up.add_argument("--port", type=int, default=0, help="API server port on 127.0.0.1 (default: any free port)")
    up.add_argument("--kubeconfig", type=Path, default=Path(".sandbox/kubeconfig"),
                    help="where to write the kubeconfig (default: .sandbox/kubeconfig)")
    up.add_argument("--policies", type=Path, default=None, help="policies directory (default: policies/)")
    up.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from infer_ctl.core.errors import SpecError
    from infer_ctl.sandbox.runtime import Sandbox, load

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("aiohttp.access", "kmock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        cluster, catalog = load(args.cluster, args.policies)
    except SpecError as e:
        print(f"infer-ctl sandbox: {e}", file=sys.stderr)
        return 2
    sandbox = Sandbox(cluster, catalog, port=args.port or None, kubeconfig=args.kubeconfig.resolve())

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await sandbox.start()
        try:
            nodes = ", ".join(f"{p.count} x {p.name}" + (f" ({p.gpus} x {p.accelerator}, {p.gpu_mode})"
                                                         if p.accelerator else "") for p in cluster.pools)
            print(f"sandbox {cluster.name!r} is up: {nodes}", flush=True)
            print(f"  API server:  {sandbox.url}", flush=True)
            print(f"  kubeconfig:  {args.kubeconfig.resolve()}   (export KUBECONFIG={args.kubeconfig.resolve()})",
                  flush=True)
            print("  front doors: one per InferenceService, URL in its annotation sandbox.infer-ctl.io/url "
                  "(logged as they open)", flush=True)
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
