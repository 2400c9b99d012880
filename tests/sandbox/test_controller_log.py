"""What `infer-ctl controller` logs on the sandbox: one line per change of a service's decision (the replicas it
wants and why), not kopf's "Timer 'control' succeeded." every control period for every service."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.config.cluster import load_cluster
from infer_ctl.config.policies import load_policies
from infer_ctl.controller.operator import OperatorConfig, quiet_handler_successes, run
from infer_ctl.controller.reconciler import Settings
from infer_ctl.sandbox.runtime import sandbox_in_thread
from infer_ctl.sandbox.threaded import LoopThread, wait_started
from tests.builders import InferenceServiceBuilder

ROOT = Path(__file__).resolve().parents[2]
SERVICES = "/apis/infer-ctl.io/v1alpha1/namespaces/default/inferenceservices"


@pytest.fixture
def kopf_objects_level() -> Iterator[None]:
    """kopf.objects' level as it was (the operator sets it; other tests' kopf must log as before)."""
    logger = logging.getLogger("kopf.objects")
    level = logger.level
    try:
        yield
    finally:
        logger.setLevel(level)


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while (value := check()) is None or value is False:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def test_the_controller_logs_each_decision_once_and_no_handler_successes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, kopf_objects_level: None) -> None:
    caplog.set_level(logging.INFO)
    policies = load_policies(ROOT / "policies")
    policies = replace(policies, scaling=replace(policies.scaling, control_period_s=0.5))
    cluster = load_cluster(ROOT / "deploy" / "sandbox" / "small.yaml", policies.catalog)
    kubeconfig = tmp_path / "kubeconfig"
    with sandbox_in_thread(cluster, policies.catalog, kubeconfig=kubeconfig, run_processes=False) as sandbox, \
            httpx.Client(base_url=sandbox.url, timeout=10) as http:
        crd = yaml.safe_load((ROOT / "crds" / "inferenceservice.yaml").read_text())
        assert http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd).status_code == 201
        thread = LoopThread("kopf")
        stop, ready = threading.Event(), threading.Event()
        config = OperatorConfig(Settings(policies), kubeconfig=str(kubeconfig), namespaces=("default",))
        future = asyncio.run_coroutine_threadsafe(run(config, stop_flag=stop, ready_flag=ready), thread.loop)
        try:
            wait_started(ready, future, "kopf")
            http.post(SERVICES, json=InferenceServiceBuilder("llm").build())

            wait_until("the first cycle's status", lambda: (http.get(f"{SERVICES}/llm").json().get("status")
                                                            or {}).get("observedGeneration"))
            time.sleep(3)  # six more control periods, none of which changes the decision
            http.patch(SERVICES + "/llm", json={"spec": {"scaling": {"minReplicas": 2}}},
                       headers={"Content-Type": "application/merge-patch+json"})
            wait_until("the new decision", lambda: (http.get(f"{SERVICES}/llm").json()["status"]["desired"]
                                                    ["serving"] == 2) or None)
            time.sleep(2)
        finally:
            stop.set()
            future.result(timeout=30)
            thread.stop()
    decisions = [r.getMessage() for r in caplog.records if r.name == "infer_ctl.controller.operator" and
                 "default/llm: wants" in r.getMessage()]
    assert len(decisions) == 2, "\n".join(decisions)
    assert decisions[0].startswith("default/llm: wants 1 serving + ") and "(first decision): " in decisions[0]
    assert decisions[1].startswith("default/llm: wants 2 serving + ") and "(was 1 + " in decisions[1]
    assert not [r for r in caplog.records if r.name.startswith("kopf") and "succeeded" in r.getMessage() and
                "Timer" in r.getMessage()]
    # the sandbox answers the controller's permission check (a 404 was a warning in every run's log)
    assert not [r for r in caplog.records if "could not check the controller's permissions" in r.getMessage()]


def test_verbose_keeps_kopfs_handler_lines(kopf_objects_level: None) -> None:
    root = logging.getLogger()
    level = root.level
    logger = logging.getLogger("kopf.objects")
    logger.setLevel(logging.NOTSET)
    try:
        root.setLevel(logging.DEBUG)
        quiet_handler_successes()
        assert logger.level == logging.NOTSET
        root.setLevel(logging.INFO)
        quiet_handler_successes()
        assert logger.level == logging.WARNING
    finally:
        root.setLevel(level)
