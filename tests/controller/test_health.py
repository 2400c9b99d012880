"""`infer-ctl controller --log-format json` and the readiness endpoint (infer_ctl/controller/health.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

from infer_ctl.controller.health import ReadinessServer, liveness_endpoint

SCRIPT = """
import logging, kopf
from infer_ctl.controller.health import configure_logging
configure_logging("json", verbose=False)
logging.getLogger("infer_ctl.x").info("plain %s", 1)
body = {"apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "llm", "namespace": "ns", "uid": "u-1"}}
kopf.ObjectLogger(body=kopf.Body(body), settings=kopf.OperatorSettings()).warning("about %s", "llm")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("infer_ctl.y").exception("failed")
"""


def test_json_logs_are_one_object_per_line_with_kopfs_object_reference() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=60)
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 3, result.stderr
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line)
        assert line["time"].endswith("+00:00")
    assert lines[0]["level"] == "INFO" and lines[0]["logger"] == "infer_ctl.x" and lines[0]["message"] == "plain 1"
    assert lines[1]["level"] == "WARNING" and lines[1]["message"] == "about llm"
    assert lines[1]["object"] == {"apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService", "name": "llm",
                                  "uid": "u-1", "namespace": "ns"}
    assert "ZeroDivisionError" in lines[2]["exc_info"]


def get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_readyz_answers_503_naming_what_is_missing_then_200() -> None:
    missing = ["the pods.core cache has not synced"]
    server = ReadinessServer(lambda: list(missing), 0)
    try:
        url = f"http://127.0.0.1:{server.port}"
        assert get(url + "/readyz") == (503, {"ready": False, "missing": missing})
        missing.clear()
        assert get(url + "/readyz") == (200, {"ready": True, "missing": []})
        try:
            urllib.request.urlopen(url + "/other", timeout=5)
            raise AssertionError("404 expected")
        except urllib.error.HTTPError as e:
            assert e.code == 404
    finally:
        server.close()


def test_a_failing_check_is_not_ready_rather_than_an_error() -> None:
    def broken() -> list[str]:
        raise RuntimeError("boom")

    server = ReadinessServer(broken, 0)
    try:
        code, body = get(f"http://127.0.0.1:{server.port}/readyz")
        assert code == 503 and "boom" in str(body["missing"])
    finally:
        server.close()


def test_the_liveness_url_is_kopfs_healthz() -> None:
    assert liveness_endpoint("0.0.0.0", 8080) == "http://0.0.0.0:8080/healthz"
    assert liveness_endpoint("::", 8080) == "http://[::]:8080/healthz"
