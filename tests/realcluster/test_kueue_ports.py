"""Kueue's start on the real control plane when a port it was handed is taken before it binds it (another test
worker's server may take a port between `free_port()` and the bind): installed again on new ports. A module of its
own: Kueue is installed once per cluster at a time, and tests/realcluster/test_kueue.py holds it for its module."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.sandbox import kueue as kueue_module
from infer_ctl.sandbox.kueue import LocalKueue
from infer_ctl.sandbox.localcluster import LocalCluster
from tests.realcluster.conftest import first_port_taken


def test_a_port_taken_before_kueue_binds_it_installs_kueue_again_on_new_ports(
        local_cluster: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # the first port handed out (the health probe's) is held by another socket: Kueue exits at once with "address
    # already in use"
    with first_port_taken(monkeypatch, kueue_module) as port, \
            LocalKueue(local_cluster, workdir=tmp_path / "kueue") as running:
        assert running.alive()
        assert "a port was taken before Kueue bound it (attempt 1 of 3)" in caplog.text
        assert "address already in use" in (tmp_path / "kueue" / "kueue.attempt-1.log").read_text()
        assert f":{port}" not in running.health_url
