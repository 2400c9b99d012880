"""The kubectl the sandbox tests run: the project's 1.37 build (scripts/kube-binaries.sh), else one on PATH."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from infer_ctl.sandbox.localcluster import LocalClusterError, kube_binaries


def kubectl_binary() -> Path | None:
    """The built kubectl 1.37 when the Kubernetes binaries are built, else `kubectl` on PATH, else None (the
    test that needs it is skipped)."""
    try:
        return kube_binaries(build=False) / "kubectl"
    except LocalClusterError:
        found = shutil.which("kubectl")
        return Path(found) if found else None


def columns(text: str) -> list[list[str]]:
    """kubectl's table output as rows of cells, cut where the header's columns start (an empty cell stays "",
    where splitting on spaces would shift the cells after it)."""
    lines = text.rstrip("\n").splitlines()
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", lines[0])]
    return [[line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)] for line in lines]
