"""Refresh the copies deploy/ needs of files that live elsewhere (kustomize and Helm read files only below their own
directory): policies/ into the kustomize base and the Helm chart, the InferenceService CRD (generated into crds/ by
`python -m infer_ctl.core.crdgen`) and kopf's peering CRD (deploy/kustomize/kopf-peering/crd.yaml) into the chart's
crds/. tests/deploy/test_manifests.py fails when a copy differs; `--check` says which and exits 1.

    python scripts/sync_deploy.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "infer-ctl"


def copies() -> list[tuple[Path, Path]]:
    """(source, copy) pairs."""
    pairs = [(ROOT / "crds" / "inferenceservice.yaml", CHART / "crds" / "inferenceservice.yaml"),
             (ROOT / "deploy" / "kustomize" / "kopf-peering" / "crd.yaml", CHART / "crds" / "kopf-peering.yaml")]
    for policy in sorted((ROOT / "policies").glob("*.yaml")):
        pairs += [(policy, ROOT / "deploy" / "kustomize" / "base" / "policies" / policy.name),
                  (policy, CHART / "policies" / policy.name)]
    return pairs


def stale() -> list[Path]:
    out = [copy for source, copy in copies() if not copy.exists() or copy.read_bytes() != source.read_bytes()]
    for folder in (ROOT / "deploy" / "kustomize" / "base" / "policies", CHART / "policies"):
        out += [extra for extra in folder.glob("*.yaml") if not (ROOT / "policies" / extra.name).exists()]
    return out


def main(argv: list[str]) -> int:
    if "--check" in argv:
        bad = stale()
        for path in bad:
            print(f"{path.relative_to(ROOT)} differs from its source; run python scripts/sync_deploy.py")
        return 1 if bad else 0
    for source, copy in copies():
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(source.read_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
