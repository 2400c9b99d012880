"""`python -m loadgen`."""

from __future__ import annotations

import sys

from loadgen.cli import main

if __name__ == "__main__":
    sys.exit(main())
