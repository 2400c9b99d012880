"""The controller's readiness endpoint (`--readiness-port`, GET /readyz) and its JSON log format.

Liveness is kopf's own endpoint (`--liveness-port`: kopf serves `/healthz` and answers 200 while its operator
runs). Readiness means *this process could do the work now*: kopf's operator has started (its watches are open
and, with peering, it has joined the peering: the active peer and a standby one are both ready, so a
PodDisruptionBudget counts the standby that would take over), and every watch-fed cache the controller has
opened has finished its first list (`Informer.synced`). It answers 200 with `{"ready": true, ...}` or 503 with
what is missing. Served by the standard library's HTTP server on a thread, like the metrics port.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kopf

log = logging.getLogger(__name__)
READINESS_PATH = "/readyz"
LIVENESS_PATH = "/healthz"


def liveness_endpoint(address: str, port: int) -> str:
    """kopf's `liveness_endpoint` URL for an address and port (kopf serves `/healthz` on it)."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}{LIVENESS_PATH}"


class ReadinessServer:
    """GET /readyz: 200 when `check()` returns no missing items, else 503 naming them (a JSON body either way)."""

    def __init__(self, check: Callable[[], list[str]], port: int, address: str = "127.0.0.1") -> None:
        self._check = check
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != READINESS_PATH:
                    self.send_error(404)
                    return
                missing = outer.missing()
                body = json.dumps({"ready": not missing, "missing": missing}).encode()
                self.send_response(200 if not missing else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per probe is noise

        self._server = ThreadingHTTPServer((address, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="readiness", daemon=True)
        self._thread.start()

    def missing(self) -> list[str]:
        try:
            return self._check()
        except Exception as exc:  # a probe must answer, never hang or die
            return [f"the readiness check failed: {type(exc).__name__}: {exc}"]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# The JSON log line's keys: one object per line with these (kopf adds `object` for a line about one resource).
JSON_FORMAT = "%(levelname)s %(name)s %(message)s"
JSON_RENAMES = {"levelname": "level", "name": "logger"}


def configure_logging(log_format: str, *, verbose: bool) -> None:
    """`--log-format text|json`. json: kopf's own JSON formatter (`kopf.configure(log_format=LogFormat.JSON)`),
    one object per line: time (ISO 8601, UTC), level, logger, message, and kopf's `object` reference
    (apiVersion, kind, name, uid, namespace) when the line is about one resource; exceptions as `exc_info`."""
    level = logging.DEBUG if verbose else logging.INFO
    if log_format == "json":
        kopf.configure(verbose=verbose, log_format=kopf.LogFormat.JSON)
        root = logging.getLogger()
        for handler in root.handlers:
            formatter = handler.formatter
            if formatter is not None and type(formatter).__module__.startswith("kopf."):
                # The same class kopf chose (its object reference and severity fields), with our field names.
                json_formatter: Any = type(formatter)  # pythonjsonlogger's keywords; kopf's refkey stays default
                handler.setFormatter(json_formatter(JSON_FORMAT, rename_fields=JSON_RENAMES, timestamp="time"))
        root.setLevel(level)
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
