"""The built image runs the controller on the real control plane: deploy/kustomize's local overlay, its image set
to the built reference (ghcr.io/infer-ctl/infer-ctl:<version>), and an image table entry that maps exactly that
reference to scripts/run-image.sh, so the node agent runs the Pod's container from the image's unpacked root
filesystem (chroot, read-only, as the image's user) instead of the installed package. The controller reconciles
deploy/examples/llm-8b.yaml (tests/realcluster/test_deploy.py's scenario), and the process behind the Pod is
the image's: its root directory is the bundle's rootfs, its interpreter the image's python, its user 65532; so are
the node cache reporters of deploy/'s DaemonSet (the same image), one per node.

Needs the image built and unpacked (`scripts/build-image.sh && scripts/build-image.sh unpack`, about 3 minutes
cold) and root (chroot and mount); skips without them, saying so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from infer_ctl.config.cluster import load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.kube.client import NODES, PODS, PRIORITY_CLASSES, KubeClient
from infer_ctl.sandbox.images import ImageEntry, ImageTable
from infer_ctl.sandbox.kubesandbox import KubeSandbox, kube_sandbox_in_thread
from tests.image.test_image import CACHE, REFERENCE
from tests.realcluster.test_deploy import KUSTOMIZE, PEERING_CRD, reconciles_the_example

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = CACHE / "bundle"
RUNNER = ROOT / "scripts" / "run-image.sh"
NAMESPACE = "infer-ctl-system"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeSandbox]:
    if not (BUNDLE / "rootfs").is_dir() or not (BUNDLE / "image-config.json").is_file():
        pytest.skip(f"no unpacked image in {BUNDLE}: run scripts/build-image.sh && scripts/build-image.sh unpack")
    if os.geteuid() != 0:
        pytest.skip("scripts/run-image.sh needs root (chroot and mount in a private mount namespace)")
    policies = load_policies(ROOT / "policies")
    topology = load_cluster(ROOT / "deploy" / "sandbox" / "small.yaml", policies.catalog)
    table = ImageTable.with_builtins([ImageEntry(REFERENCE, (str(RUNNER), "--bundle", str(BUNDLE), "--read-only",
                                                             "--"))])
    # deploy/'s node cache reporter DaemonSet (the same image) runs from the image too: the sandbox waits for every
    # node's first record, which the reporter writes after reading its hostPath as the image's user
    with kube_sandbox_in_thread(topology, policies.catalog, workdir=tmp_path_factory.mktemp("image"), images=table,
                                node_cache_reporter=True) as s:
        yield s


def images_processes(rootfs: Path) -> list[int]:
    """The pids whose root directory is the image's rootfs (the chroot of scripts/run-image.sh)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "root") == str(rootfs):
                    out.append(int(entry.name))
            except OSError:  # gone, or a kernel thread
                continue
    return out


def topology_nodes(sandbox: KubeSandbox) -> list[str]:
    kube = KubeClient.from_config(str(sandbox.local.kubeconfig))
    try:
        return [n["metadata"]["name"] for n in kube.list(NODES)]
    finally:
        kube.close()


def test_the_controller_that_reconciles_is_the_images_own_process_as_its_user(sandbox: KubeSandbox) -> None:
    local = sandbox.local
    kube = KubeClient.from_config(str(local.kubeconfig))
    try:
        for name in ("infer-ctl-serving", "infer-ctl-standby"):  # deploy/'s own replace the sandbox's
            kube.delete(PRIORITY_CLASSES, name)
        local.kubectl("apply", "-k", str(KUSTOMIZE / "kopf-peering"))
        local.wait_established(PEERING_CRD)
        rendered = local.kubectl("kustomize", str(KUSTOMIZE / "overlays" / "local")).stdout
        repository = REFERENCE.rpartition(":")[0]
        assert f"image: {repository}:dev" in rendered
        local.kubectl("apply", "-f", "-", input_text=rendered.replace(f"image: {repository}:dev",
                                                                      f"image: {REFERENCE}"))
        reconciles_the_example(sandbox, kube, NAMESPACE, replicas=1)

        [pod] = kube.list(PODS, NAMESPACE, label_selector="app.kubernetes.io/component=controller")
        assert pod["spec"]["containers"][0]["image"] == REFERENCE
        rootfs = (BUNDLE / "rootfs").resolve()
        pids = images_processes(rootfs)
        commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in pids}
        controllers = [pid for pid, argv in commands.items() if b"controller" in argv]
        reporters = [pid for pid, argv in commands.items() if b"node-cache-reporter" in argv]
        assert controllers, f"no controller runs from {rootfs}: {commands}"
        assert len(reporters) == len(topology_nodes(sandbox)), f"node cache reporters from {rootfs}: {reporters}"
        for pid in controllers + reporters:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            assert status["Uid"].split()[:2] == ["65532", "65532"], status["Uid"]
            executable = os.readlink(f"/proc/{pid}/exe")
            assert executable.startswith(str(rootfs)) and "python3" in executable, executable
            print(f"from the image: pid {pid}, root {rootfs}, {executable}, uid 65532: "
                  f"{b' '.join(commands[pid][:3]).decode()} ...")
    finally:
        kube.close()
