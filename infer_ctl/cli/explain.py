"""`infer-ctl explain NAMESPACE/NAME`: say at which layer each replica that is not running stopped.

It judges with the policies the cluster's controller runs (the ConfigMap its Deployment mounts) unless told
otherwise, and its first line says which policies it used."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SANDBOX_KUBECONFIG = Path(".sandbox/kubeconfig")  # where `infer-ctl sandbox up` writes it by default
CONTROLLER_NAMESPACE = "infer-ctl-system"  # deploy/kustomize's and the Helm chart's


def register(sub: Any) -> None:
    parser = sub.add_parser("explain", help="why the replicas of an InferenceService are not running",
                            description=__doc__)
    parser.add_argument("target", metavar="NAMESPACE/NAME", help="the InferenceService (NAME alone: default/NAME)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--policies", type=Path, default=None, metavar="DIR",
                        help="judge with the policies in this local folder (default: the ones the cluster's "
                             "controller runs, see --controller-namespace)")
    source.add_argument("--policies-configmap", default=None, metavar="[NS/]NAME",
                        help="judge with the policies in this ConfigMap (one key per policy file; NS defaults to "
                             "--controller-namespace)")
    parser.add_argument("--controller-namespace", default=CONTROLLER_NAMESPACE, metavar="NS",
                        help="where the controller runs (default: %(default)s): its Deployment's policies ConfigMap "
                             "(the one mounted at $INFER_CTL_POLICIES) is read; when no Deployment there mounts "
                             "one, the local policies ($INFER_CTL_POLICIES, else the shipped policies/)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from infer_ctl.cli.policysource import PolicySourceError, resolve
    from infer_ctl.controller.explain import explain, render
    from infer_ctl.core.errors import SpecError
    from infer_ctl.kube.client import KubeClient, KubeError

    namespace, _, name = args.target.rpartition("/")
    namespace = namespace or "default"
    missing = no_cluster(args.kubeconfig, os.environ, Path.home())
    if missing is not None:
        print(f"infer-ctl explain: {missing}\n{how_to_point_at_a_cluster(args.target)}", file=sys.stderr)
        return 2
    try:
        kube = KubeClient.from_config(args.kubeconfig)
    except Exception as exc:  # kubeconfig problems come in many types; say what and where
        where = args.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        print(f"infer-ctl explain: cannot load the kubeconfig {where}: {exc}", file=sys.stderr)
        return 2
    try:
        try:
            source = resolve(kube, local=args.policies, configmap=args.policies_configmap,
                             controller_namespace=args.controller_namespace)
        except (PolicySourceError, SpecError) as exc:
            print(f"infer-ctl explain: the policies: {exc}", file=sys.stderr)
            return 2
        findings = explain(kube, source.policies, namespace, name)
    except KubeError as exc:
        unreachable = "\nIs the cluster running? (the local one: infer-ctl sandbox up)" if exc.status == 0 else ""
        print(f"infer-ctl explain: {exc}{unreachable}", file=sys.stderr)
        return 2
    finally:
        kube.close()
    print(f"policies: {source.description}")
    print(render(namespace, name, findings))
    return 1 if findings and findings[0].layer == "spec" else 0


def no_cluster(kubeconfig: str | None, env: Mapping[str, str], home: Path) -> str | None:
    """Why there is no cluster to ask (None when there may be one): the kubernetes client would otherwise fall
    back to the in-cluster configuration and say only "Service host/port is not set"."""
    if kubeconfig is not None:
        return None if Path(kubeconfig).expanduser().is_file() else f"the kubeconfig {kubeconfig} does not exist"
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        if any(Path(p).expanduser().is_file() for p in listed):
            return None
        return f"KUBECONFIG={env['KUBECONFIG']} names no file that exists"
    if (home / ".kube" / "config").is_file() or env.get("KUBERNETES_SERVICE_HOST"):
        return None  # the default kubeconfig, or in a Pod (its ServiceAccount)
    return "no cluster to ask: no --kubeconfig, KUBECONFIG is not set and ~/.kube/config does not exist"


def how_to_point_at_a_cluster(target: str) -> str:
    lines = ["Point it at a cluster:",
             f"  infer-ctl explain {target} --kubeconfig FILE",
             "  export KUBECONFIG=FILE",
             "or start the local sandbox (it writes .sandbox/kubeconfig and installs the CRD):",
             "  infer-ctl sandbox up"]
    if SANDBOX_KUBECONFIG.is_file():
        lines.append(f"A sandbox kubeconfig is here: infer-ctl explain {target} --kubeconfig {SANDBOX_KUBECONFIG}")
    return "\n".join(lines)
