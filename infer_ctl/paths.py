"""Where the project's data files are: the checkout (development, editable installs) or the installed copy
under `<prefix>/share/infer-ctl/` (a wheel, a container image)."""

from __future__ import annotations

import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
INSTALLED = Path(sys.prefix) / "share" / "infer-ctl"


def data_path(relative: str) -> Path:
    """`crds/inferenceservice.yaml`, `policies`, ...: the checkout's copy when there is one, else the installed."""
    local = CHECKOUT / relative
    return local if local.exists() else INSTALLED / relative
