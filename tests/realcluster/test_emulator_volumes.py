"""PersistentVolumes and their claims on the emulator and on the real control plane: the node model cache's claim
bound ahead to its local volume (modelCacheVolume: persistentVolume), a volume no claim names, and a claim naming
a volume that does not exist, applied alike to both; bound (or not) by kube-controller-manager's
persistentvolume-binder and by the emulator's (infer_ctl/sandbox/volumes.py), and printed by `kubectl get -o wide`
(kube-apiserver's printers, the emulator's tables.py) with the same cells, ages aside."""

from __future__ import annotations

import copy
import itertools
import json
import re
from pathlib import Path
from typing import Any

from infer_ctl.actuate.manifests import MODEL_CACHE_CLAIM, model_cache_claim
from infer_ctl.config.cluster import load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.localcluster import LocalCluster
from infer_ctl.sandbox.runtime import sandbox_in_thread
from tests.realcluster.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
_namespaces = itertools.count()


def cells(output: str) -> list[dict[str, str]]:
    """`kubectl get`'s table as rows of header -> cell, cut at the header's column starts (cells may be empty)."""
    header, *rows = [line for line in output.splitlines() if line.strip()]
    found = list(re.finditer(r"\S+(?: \S+)*", header))  # kubectl pads columns with 3 spaces at least
    names, starts = [m.group() for m in found], [m.start() for m in found]
    bounds = [*starts[1:], None]
    return [{name: row[start:end].strip() for name, start, end in zip(names, starts, bounds, strict=True)}
            for row in rows]


def test_kubectl_shows_the_cache_volumes_bound_and_printed_alike_on_the_emulator_and_kube_apiserver(
        local_cluster: LocalCluster, tmp_path: Path) -> None:
    ns = f"volumes-{next(_namespaces)}"
    claim, volume = model_cache_claim(ns, "/var/lib/infer-ctl/models")
    free = copy.deepcopy(volume)
    free["metadata"]["name"] = f"free-{ns}"
    del free["spec"]["claimRef"]
    free["spec"].update(accessModes=["ReadOnlyMany", "ReadWriteOnce"], storageClassName="fast")
    waiting = copy.deepcopy(claim)
    waiting["metadata"]["name"] = "waiting"
    waiting["spec"]["volumeName"] = f"missing-{ns}"
    volumes = [volume["metadata"]["name"], free["metadata"]["name"]]
    policies = load_policies(ROOT / "policies")
    tables: dict[str, tuple[list[dict[str, str]], list[dict[str, str]]]] = {}
    with sandbox_in_thread(load_cluster(ROOT / "deploy" / "sandbox" / "small.yaml", policies.catalog),
                           policies.catalog) as sandbox:
        emulator = write_kubeconfig(tmp_path / "emulator.kubeconfig", sandbox.url)
        for side, kubeconfig in (("kube", None), ("emulator", emulator)):
            def kubectl(*args: str, text: str | None = None, config: Path | None = kubeconfig) -> str:
                return local_cluster.kubectl(*args, input_text=text, kubeconfig=config).stdout

            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            for obj in (namespace, volume, claim, free, waiting):
                kubectl("apply", "-f", "-", text=json.dumps(obj))

            def phase(kind: str, name: str, namespace: str | None = None) -> str:
                return kubectl("get", kind, name, *(("-n", namespace) if namespace else ()), "-o",
                               "jsonpath={.status.phase}")

            wait_for(lambda: phase("pvc", MODEL_CACHE_CLAIM, ns) == "Bound", what=f"the cache claim bound on {side}")
            wait_for(lambda: phase("pv", volumes[1]) == "Available", what=f"the free volume available on {side}")
            wait_for(lambda: phase("pvc", "waiting", ns) == "Pending", what=f"the waiting claim pending on {side}")
            tables[side] = ([{k: v for k, v in row.items() if k != "AGE"}
                             for row in cells(kubectl("get", "pv", *volumes, "-o", "wide"))],
                            [{k: v for k, v in row.items() if k != "AGE"}
                             for row in cells(kubectl("get", "pvc", "-n", ns, "-o", "wide"))])
            bound: Any = json.loads(kubectl("get", "pv", volumes[0], "-o", "json"))
            assert bound["spec"]["claimRef"]["uid"] == json.loads(kubectl(
                "get", "pvc", MODEL_CACHE_CLAIM, "-n", ns, "-o", "json"))["metadata"]["uid"], side
    local_cluster.kubectl("delete", "namespace", ns, "--wait=false")
    local_cluster.kubectl("delete", "pv", *volumes, "--wait=false")
    assert tables["emulator"] == tables["kube"]
    [cache_volume, free_volume] = tables["kube"][0]
    assert (cache_volume["CLAIM"], cache_volume["STATUS"], cache_volume["ACCESS MODES"]) == (
        f"{ns}/{MODEL_CACHE_CLAIM}", "Bound", "RWO"), cache_volume
    assert (free_volume["STATUS"], free_volume["ACCESS MODES"], free_volume["STORAGECLASS"]) == (
        "Available", "RWO,ROX", "fast"), free_volume
