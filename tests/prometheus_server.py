"""A real Prometheus server for tests: Debian's `prometheus` on 127.0.0.1 with a temporary data directory
(`infer_ctl.sandbox.prometheus.LocalPrometheus`), optionally backfilled with history. Every process started is
stopped."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from infer_ctl.sandbox.prometheus import LocalPrometheus, find_prometheus


@contextmanager
def prometheus(tmp: Path, *, scrape_targets: Sequence[str] = (), scrape_interval_s: float = 1.0,
               history: str | None = None) -> Iterator[str]:
    """A running Prometheus; yields its URL. `history` is OpenMetrics text to backfill first."""
    if find_prometheus() is None:
        pytest.fail("Debian's prometheus is not installed: ./test installs it (apt-get install prometheus)")
    server = LocalPrometheus(tmp / "prometheus", scrape_interval_s=scrape_interval_s)
    if history is not None:
        server.backfill(history)
    try:
        yield server.start(targets=scrape_targets, retention="3650d")
    finally:
        server.stop()
