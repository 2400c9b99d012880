"""The README says what the tools print: the printer columns of `kubectl get infsvc`."""

from __future__ import annotations

from pathlib import Path

from infer_ctl.core import crdgen

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_names_the_printer_columns_kubectl_prints() -> None:
    readme = (ROOT / "README.md").read_text()
    shown = [c["name"].upper() for c in crdgen.PRINTER_COLUMNS if not c.get("priority")]
    assert "kubectl get infsvc                        # " + " ".join(shown) in readme
