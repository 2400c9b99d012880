"""kubelet's container probes: startupProbe, readinessProbe and livenessProbe (httpGet and tcpSocket) on the Pod's
address.

As kubelet (pkg/kubelet/prober): a probe runs first `initialDelaySeconds` after the container started, then every
`periodSeconds`; a result counts once `successThreshold` (readiness only; 1 for the others) or `failureThreshold`
results in a row agree. Until the startup probe succeeds, neither readiness nor liveness runs and the container is
not `started`; `failureThreshold` startup failures kill it. The readiness result is the container's `ready` (no
readiness probe: ready once started); `failureThreshold` liveness failures in a row kill the container, which is then
restarted with the Pod's restartPolicy. httpGet succeeds on a status in [200, 400).
Defaults as the API's: periodSeconds 10, timeoutSeconds 1, failureThreshold 3, successThreshold 1.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

STARTUP, READINESS, LIVENESS = "startup", "readiness", "liveness"


class ProbeSpecError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Probe:
    kind: str
    port: int
    path: str | None  # None: a tcpSocket probe
    headers: tuple[tuple[str, str], ...] = ()
    initial_delay_s: float = 0.0
    period_s: float = 10.0
    timeout_s: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1

    def url(self, host: str) -> str:
        return f"http://{host}:{self.port}{self.path or '/'}"


def container_port(container: Mapping[str, Any], port: Any) -> int:
    """A probe's (or Service's) port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    text = str(port)
    if text.isdigit():
        return int(text)
    for declared in container.get("ports") or ():
        if declared.get("name") == text:
            return int(declared["containerPort"])
    raise ProbeSpecError(f"port {text!r} is not a named port of container {container.get('name', '')!r}")


def parse_probe(kind: str, container: Mapping[str, Any]) -> Probe | None:
    """The container's `<kind>Probe` (None when it has none); ProbeSpecError for one the sandbox cannot run."""
    spec = container.get(f"{kind}Probe")
    if not spec:
        return None
    timing = {"initial_delay_s": float(spec.get("initialDelaySeconds", 0)),
              "period_s": float(spec.get("periodSeconds", 10)), "timeout_s": float(spec.get("timeoutSeconds", 1)),
              "failure_threshold": int(spec.get("failureThreshold", 3)),
              # kubelet (and the API's validation) take 1 for liveness and startup probes
              "success_threshold": int(spec.get("successThreshold", 1)) if kind == READINESS else 1}
    if get := spec.get("httpGet"):
        if str(get.get("scheme", "HTTP")).upper() != "HTTP":
            raise ProbeSpecError(f"{kind}Probe: scheme {get.get('scheme')} (the sandbox probes HTTP only)")
        headers = tuple((str(h.get("name")), str(h.get("value"))) for h in get.get("httpHeaders") or ())
        return Probe(kind, container_port(container, get.get("port")), str(get.get("path") or "/"), headers,
                     **timing)  # type: ignore[arg-type]
    if tcp := spec.get("tcpSocket"):
        return Probe(kind, container_port(container, tcp.get("port")), None, **timing)  # type: ignore[arg-type]
    raise ProbeSpecError(f"{kind}Probe: only httpGet and tcpSocket probes run in the sandbox "
                         f"(got {sorted(k for k in spec if k not in ('initialDelaySeconds', 'periodSeconds'))})")


async def check(probe: Probe, host: str, session: aiohttp.ClientSession) -> bool:
    """One probe: True on success."""
    try:
        if probe.path is None:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, probe.port), probe.timeout_s)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True
        async with session.get(probe.url(host), headers=dict(probe.headers), allow_redirects=False,
                               timeout=aiohttp.ClientTimeout(total=probe.timeout_s)) as answer:
            await answer.read()
            return 200 <= answer.status < 400
    except (OSError, TimeoutError, aiohttp.ClientError):
        return False


@dataclass
class Verdict:
    """Consecutive results of one probe; `result` changes only when a threshold is met (kubelet's worker)."""

    probe: Probe
    result: bool | None = None  # None: not decided yet
    successes: int = 0
    failures: int = 0

    def record(self, ok: bool) -> bool:
        """Count one result; True when `result` changed."""
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            decided = self.successes >= self.probe.success_threshold
        else:
            self.failures, self.successes = self.failures + 1, 0
            decided = self.failures >= self.probe.failure_threshold
        if decided and self.result is not ok:
            self.result = ok
            return True
        return False
