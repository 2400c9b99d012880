"""A real Prometheus server for tests: Debian's `prometheus` on 127.0.0.1 with a temporary data directory.

`backfill` writes history into the TSDB with `promtool tsdb create-blocks-from openmetrics` before the server
starts (blocks added to a running server appear only after about a minute). Every process started is stopped.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def require_prometheus() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.fail("Debian's prometheus is not installed: ./test installs it (apt-get install prometheus)")
    return exe


def backfill(data_dir: Path, openmetrics: str) -> None:
    source = data_dir.parent / "backfill.om"
    source.write_text(openmetrics)
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h",
                    str(source), str(data_dir)], check=True, capture_output=True, timeout=120)


@contextmanager
def prometheus(tmp: Path, *, scrape_targets: Sequence[str] = (), scrape_interval_s: float = 1.0,
               history: str | None = None) -> Iterator[str]:
    """A running Prometheus; yields its URL. `history` is OpenMetrics text to backfill first."""
    exe = require_prometheus()
    data = tmp / "prometheus-data"
    data.mkdir(parents=True, exist_ok=True)
    if history is not None:
        backfill(data, history)
    targets = ", ".join(f"'{t}'" for t in scrape_targets)
    interval = f"{round(scrape_interval_s * 1000)}ms"  # Prometheus durations take no fractions
    config = tmp / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: {interval}, evaluation_interval: {interval}}}\n"
        + (f"scrape_configs:\n  - job_name: test\n    static_configs: [{{targets: [{targets}]}}]\n"
           if scrape_targets else "")
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [exe, f"--config.file={config}", f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{port}",
         "--storage.tsdb.retention.time=3650d", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"prometheus did not become ready: {err[-2000:]}")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
