"""A kubeconfig for the sandbox, so kubectl, the kubernetes client and kopf connect as to any cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CONTEXT = "infer-ctl-sandbox"


def kubeconfig(url: str, *, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": url}}],
        "users": [{"name": CONTEXT, "user": {"token": "sandbox"}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace}}],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(path: Path, url: str, *, namespace: str = "default") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig(url, namespace=namespace), sort_keys=False))
    path.chmod(0o600)
    return path
