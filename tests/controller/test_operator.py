"""The real kopf runtime against the sandbox: applying an InferenceService makes replicas appear, status is
written through the status subresource, deleting the service cascades to its Pods and claims."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from infer_ctl.kube.client import INFERENCE_SERVICES, PODS, RESOURCE_CLAIMS
from tests.builders import InferenceServiceBuilder
from tests.controller.conftest import Cluster, running_controller


@pytest.fixture
def operator(cluster: Cluster) -> Iterator[Cluster]:
    with running_controller(cluster, namespaces=("default",)):
        yield cluster


def wait_for(what: str, check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)  # kopf and the sandbox run on their own loops: poll the API as a user would
    raise AssertionError(f"timed out waiting for {what}")


def test_applying_a_service_makes_replicas_and_writes_status(operator: Cluster) -> None:
    kube = operator.kube
    kube.create(INFERENCE_SERVICES, InferenceServiceBuilder("llm").with_("spec.scaling.minReplicas", 2)
                .with_("spec.runtime.coldStartSeconds", 0.5).build(), "default")
    wait_for("two replica pods", lambda: len(kube.list(PODS, "default", label_selector="infer-ctl.io/service=llm"))
             == 2)
    status = wait_for("status written", lambda: (kube.get(INFERENCE_SERVICES, "llm", "default") or {}).get("status"))
    assert status["observedGeneration"] == 1
    assert any(c["type"] == "Valid" and c["status"] == "True" for c in status["conditions"])

    kube.delete(INFERENCE_SERVICES, "llm", "default")
    wait_for("pods and claims collected", lambda: not kube.list(PODS, "default")
             and not kube.list(RESOURCE_CLAIMS, "default"), timeout_s=60)
