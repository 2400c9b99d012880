from __future__ import annotations

from collections.abc import Iterator

import httpx
import kubernetes
import pytest

from infer_ctl.sandbox.apiserver import SandboxApiServer
from infer_ctl.sandbox.store import Store
from infer_ctl.sandbox.testing import RunningApiServer, api_server_in_thread, pod, widget_crd


@pytest.fixture
def api() -> Iterator[RunningApiServer]:
    """A fresh sandbox API server on 127.0.0.1 in its own thread (stopped, with its watches, afterwards)."""
    with api_server_in_thread(SandboxApiServer(store=Store(history_events=50))) as running:
        yield running


@pytest.fixture
def client(api: RunningApiServer) -> Iterator[kubernetes.client.ApiClient]:
    config = kubernetes.client.Configuration()
    config.host = api.url
    with kubernetes.client.ApiClient(config) as api_client:
        yield api_client


@pytest.fixture
def core(client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(client)


@pytest.fixture
def custom(client: kubernetes.client.ApiClient) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(client)


@pytest.fixture
def http(api: RunningApiServer) -> Iterator[httpx.Client]:
    """Plain HTTP, for status codes and for bodies the typed client would refuse to send."""
    with httpx.Client(base_url=api.url, timeout=10) as session:
        yield session


@pytest.fixture(scope="module")
def http_session() -> Iterator[httpx.Client]:
    """One server for a whole property test (hypothesis runs many examples against it), with a pod and a CRD."""
    with api_server_in_thread() as running, httpx.Client(base_url=running.url, timeout=10) as session:
        session.post("/api/v1/namespaces/default/pods", json=pod("p"))
        session.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=widget_crd())
        yield session
