"""`infer-ctl explain NAMESPACE/NAME`: say at which layer each replica that is not running stopped."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser("explain", help="why the replicas of an InferenceService are not running",
                            description=__doc__)
    parser.add_argument("target", metavar="NAMESPACE/NAME", help="the InferenceService (NAME alone: default/NAME)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--policies", type=Path, default=None, help="policies folder (default: policies/)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from infer_ctl.config.policies import load_policies
    from infer_ctl.controller.explain import explain, render
    from infer_ctl.kube.client import KubeClient, KubeError

    namespace, _, name = args.target.rpartition("/")
    namespace = namespace or "default"
    try:
        kube = KubeClient.from_config(args.kubeconfig)
    except Exception as exc:  # kubeconfig problems come in many types; say what and where
        print(f"infer-ctl explain: cannot load the kubeconfig: {exc}", file=sys.stderr)
        return 2
    try:
        findings = explain(kube, load_policies(args.policies), namespace, name)
    except KubeError as exc:
        print(f"infer-ctl explain: {exc}", file=sys.stderr)
        return 2
    finally:
        kube.close()
    print(render(namespace, name, findings))
    return 1 if findings and findings[0].layer == "spec" else 0
