"""`infer-ctl node-cache-reporter`: report what this node's model cache holds (run by deploy/'s DaemonSet).

Scans --dir (the node's model cache directory, policies' modelCacheHostPath, mounted read-only) every --interval
and writes the node's record, a ConfigMap in --namespace (the controller's), when it changed. See
infer_ctl.observe.nodecache and infer_ctl.kube.modelcache.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser("node-cache-reporter", help="report this node's model cache to the controller "
                                                        "(deploy/'s DaemonSet)", description=__doc__)
    parser.add_argument("--node", default=os.environ.get("NODE_NAME"),
                        help="this node's name (default: $NODE_NAME, the DaemonSet's spec.nodeName)")
    parser.add_argument("--dir", type=Path, required=True, help="the node's model cache directory")
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE"),
                        help="where to write the record: the controller's namespace (default: $POD_NAMESPACE)")
    parser.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                        help="how often to scan the directory (default 5)")
    parser.add_argument("--once", action="store_true", help="scan and write once, then exit")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib
    import logging
    import sys

    from infer_ctl.kube.client import KubeClient, KubeError
    from infer_ctl.observe.nodecache import KubeRecordApi, Reporter

    for flag, value in (("--node", args.node), ("--namespace", args.namespace)):
        if not value:
            print(f"infer-ctl node-cache-reporter: {flag}: Required value (or its environment variable)",
                  file=sys.stderr)
            return 2
    if not args.interval > 0:
        print(f"infer-ctl node-cache-reporter: --interval: Invalid value: {args.interval}: must be > 0",
              file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    reporter = Reporter(KubeRecordApi(KubeClient.from_config(args.kubeconfig)), args.node, args.dir, args.namespace,
                        interval_s=args.interval)
    if args.once:
        try:
            asyncio.run(reporter.report_once())
        except KubeError as e:
            print(f"infer-ctl node-cache-reporter: {e}", file=sys.stderr)
            return 1
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(reporter.run())
    return 0
