"""`infer-ctl controller`: run the InferenceService controller against a cluster (or the sandbox)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser("controller", help="run the InferenceService controller (kopf)",
                            description=__doc__)
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)")
    parser.add_argument("--prometheus-url", default=None,
                        help="Prometheus to read request rates from; without it (or empty) the replicas' /metrics "
                             "are scraped")
    parser.add_argument("--gateway-metrics-url", default=None, metavar="URL",
                        help="without --prometheus-url: the front door's /metrics (infer_ctl_gateway_queue_depth), "
                             "read for a service at zero replicas, whose requests only the front door sees (infer-ctl "
                             "sandbox up prints it); without either, a service at zero wakes only on its forecast")
    parser.add_argument("--namespace", action="append", default=[], metavar="NS[,NS...]",
                        help="manage only these namespaces (repeatable, or comma-separated; default: cluster-wide). "
                             "deploy/ grants the controller its writes in each by a RoleBinding")
    parser.add_argument("--peering", default=None, metavar="NAME",
                        help="elect one active controller among several through the KopfPeering NAME: the live "
                             "peer with the highest --priority works, the others wait")
    parser.add_argument("--priority", type=int, default=None,
                        help="this controller's peering priority (default: random, so that replicas of one "
                             "Deployment never tie; kopf pauses every peer of a tie)")
    parser.add_argument("--metrics-port", type=int, default=None, help="serve the controller's /metrics here")
    parser.add_argument("--metrics-address", default="127.0.0.1", help="address for --metrics-port")
    parser.add_argument("--liveness-port", type=int, default=None,
                        help="serve kopf's liveness endpoint GET /healthz here (200 while the operator runs)")
    parser.add_argument("--readiness-port", type=int, default=None,
                        help="serve GET /readyz here: 200 once kopf's operator runs and every watch-fed cache "
                             "has synced, else 503 naming what is missing")
    parser.add_argument("--health-address", default="127.0.0.1",
                        help="address for --liveness-port and --readiness-port")
    parser.add_argument("--node-cache-namespace", default=None, metavar="NS",
                        help="where the node-side reporters record the nodes' model caches (default: "
                             "$POD_NAMESPACE, the controller's own, else infer-ctl-system)")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="json: one JSON object per line (time, level, logger, message, and kopf's object "
                             "reference when the line is about one resource)")
    parser.add_argument("--policies", type=Path, default=None,
                        help="policies folder (default: $INFER_CTL_POLICIES, else the shipped policies/)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib
    import logging
    import sys

    from infer_ctl.config.policies import load_policies
    from infer_ctl.controller.health import configure_logging
    from infer_ctl.controller.operator import OperatorConfig, random_priority
    from infer_ctl.controller.operator import run as run_operator
    from infer_ctl.controller.reconciler import Settings
    from infer_ctl.core.errors import SpecError
    from infer_ctl.version import build_info

    configure_logging(args.log_format, verbose=args.verbose)
    for chatty in ("httpx", "urllib3"):  # one line per scrape and per API call is noise at INFO
        logging.getLogger(chatty).setLevel(logging.WARNING)
    where = ", ".join(namespaces(args.namespace)) or "all namespaces"
    logging.getLogger("infer_ctl.controller").info("%s: the controller starts (managing %s)", build_info().line(),
                                                   where)
    try:
        policies = load_policies(args.policies)
    except SpecError as exc:
        print(f"infer-ctl controller: the policies are invalid: {exc}", file=sys.stderr)
        return 2
    import os

    from infer_ctl.kube.modelcache import DEFAULT_NAMESPACE

    cache_ns = args.node_cache_namespace or os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
    config = OperatorConfig(Settings(policies, prometheus_url=args.prometheus_url or None,
                                     gateway_metrics_url=args.gateway_metrics_url or None,
                                     node_cache_namespace=cache_ns), kubeconfig=args.kubeconfig,
                            namespaces=namespaces(args.namespace), peering=args.peering, metrics_port=args.metrics_port,
                            metrics_address=args.metrics_address, liveness_port=args.liveness_port,
                            readiness_port=args.readiness_port, health_address=args.health_address,
                            priority=args.priority if args.priority is not None else random_priority())
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: kopf has already stopped its tasks
        asyncio.run(run_operator(config))
    return 0


def namespaces(values: list[str]) -> tuple[str, ...]:
    """`--namespace a --namespace b,c` as ("a", "b", "c"), in order, without repeats or empty items (a Deployment
    passes one comma-separated value from its ConfigMap)."""
    out: list[str] = []
    for value in values:
        for name in (n.strip() for n in value.split(",")):
            if name and name not in out:
                out.append(name)
    return tuple(out)
