"""A local Prometheus for the sandbox and the demo: Debian's `prometheus` on 127.0.0.1, a temporary data
directory, and file-based service discovery that the caller keeps up to date with the replicas' addresses
(`pod_targets`: `<podIP>:<port>` of each running replica). In a cluster, Prometheus discovers the Pods through a
PodMonitor, whose `podTargetLabels` and relabelling give each target `namespace`, `pod` and `service`: vLLM's own
metrics carry only `model_name` and `engine`, so these target labels are what tells two services' series apart."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from infer_ctl.kube.labels import LABEL_ROLE, LABEL_SERVICE, ROLE_PREFETCH
from infer_ctl.sandbox.podnet import pod_endpoint
from infer_ctl.sandbox.ports import free_port


@dataclass(frozen=True, slots=True)
class Target:
    """A scrape target and the labels Prometheus adds to its series."""

    address: str  # host:port
    labels: tuple[tuple[str, str], ...] = ()


def pod_targets(pods: Iterable[Mapping[str, Any]]) -> list[Target]:
    """The targets a PodMonitor selecting `infer-ctl.io/service` Pods would give: each running replica's
    `<podIP>:<port>` (its port named `http`, else its first) with the labels `namespace`, `pod` and `service`."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        service = labels.get(LABEL_SERVICE)
        address = pod_endpoint(pod)
        if not service or labels.get(LABEL_ROLE) == ROLE_PREFETCH or address is None \
                or (pod.get("status") or {}).get("phase") != "Running":
            continue
        out.append(Target(address, (("namespace", str(meta.get("namespace", ""))), ("pod", str(meta.get("name", ""))),
                                    ("service", str(service)))))
    return out


class PrometheusError(RuntimeError):
    pass


def find_prometheus() -> str | None:
    return shutil.which("prometheus")


class LocalPrometheus:
    def __init__(self, workdir: Path | None = None, *, scrape_interval_s: float = 1.0,
                 executable: str | None = None) -> None:
        self.executable = executable or find_prometheus()
        if self.executable is None:
            raise PrometheusError("prometheus is not installed (Debian: apt-get install prometheus)")
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="infer-ctl-prometheus-")
        self.workdir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scrape_interval_s = scrape_interval_s
        self.targets_file = self.workdir / "targets.json"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._targets: tuple[Target, ...] | None = None

    def backfill(self, openmetrics: str) -> None:
        """Write history into the TSDB before `start` (`promtool tsdb create-blocks-from openmetrics`: blocks
        added to a running server appear only after about a minute)."""
        if self._proc is not None:
            raise PrometheusError("backfill before start")
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        source = self.workdir / "backfill.om"
        source.write_text(openmetrics)
        promtool = Path(str(self.executable)).with_name("promtool")
        result = subprocess.run([str(promtool if promtool.exists() else "promtool"), "tsdb", "create-blocks-from",
                                 "openmetrics", "--max-block-duration=24h", str(source), str(data)],
                                capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            raise PrometheusError(f"promtool could not backfill: {result.stderr[-1000:]}")

    def start(self, timeout_s: float = 30.0, *, targets: Iterable[str | Target] = (), retention: str = "1d") -> str:
        interval = f"{round(self.scrape_interval_s * 1000)}ms"
        self.set_targets(targets)
        config = self.workdir / "prometheus.yml"
        config.write_text(
            f"global: {{scrape_interval: {interval}, evaluation_interval: {interval}}}\n"
            "scrape_configs:\n"
            "  - job_name: model-servers\n"
            f"    file_sd_configs: [{{files: ['{self.targets_file}'], refresh_interval: {interval}}}]\n"
        )
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        self._proc = subprocess.Popen(
            [str(self.executable), f"--config.file={config}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}", f"--storage.tsdb.retention.time={retention}",
             "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self.url
            except httpx.HTTPError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                err = self._proc.stderr.read().decode() if self._proc.stderr and self._proc.poll() is not None else ""
                self.stop()
                raise PrometheusError(f"prometheus did not become ready: {err[-1000:]}")
            time.sleep(0.05)  # a starting process: nothing to await but its port

    def set_targets(self, targets: Iterable[str | Target]) -> None:
        """Replace the scrape targets (host:port, or a `Target` with its labels); written atomically, read by
        Prometheus within one interval."""
        wanted = tuple(sorted({t if isinstance(t, Target) else Target(t) for t in targets},
                              key=lambda t: (t.address, t.labels)))
        if wanted == self._targets:
            return
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": [t.address], "labels": dict(t.labels)} for t in wanted]))
        os.replace(tmp, self.targets_file)
        self._targets = wanted

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stderr:
                self._proc.stderr.close()
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> LocalPrometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
