"""kopf logs in with the credentials of the controller's own kubeconfig."""

from __future__ import annotations

from pathlib import Path

import yaml

from infer_ctl.controller.operator import connection_info
from infer_ctl.kube.client import KubeClient


def test_kopf_gets_the_bearer_token_and_server_of_the_kubeconfig(tmp_path: Path) -> None:
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443",
                                                     "insecure-skip-tls-verify": True}}],
              "users": [{"name": "u", "user": {"token": "abc.def"}}],
              "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    kube = KubeClient.from_config(str(tmp_path / "kubeconfig"))
    try:
        info = connection_info(kube)
    finally:
        kube.close()
    assert (info.server, info.token, info.insecure) == ("https://127.0.0.1:6443", "abc.def", True)
