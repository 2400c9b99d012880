"""The simulated device a stand-in runs on, read from the environment the node agent gives the container.

None of these variables is part of an engine's interface: the agent adds them beside the container's own env
(contract section 1). The node agent's memory ledger (`INFER_CTL_SANDBOX_AGENT_URL`) is how two engines on one
device find out that their memory does not fit, as CUDA would tell them.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

GB = 1e9  # the bandwidths are in GB/s, 10^9 bytes per second
REFERENCE_TOKENS = 256  # a request asking for max_tokens takes service time x max_tokens / this


@dataclass(frozen=True, slots=True)
class Hardware:
    namespace: str
    pod: str
    accelerator: str
    service_time_ms: float
    concurrency: int
    cold_start_s: float
    model_bytes: int
    h2d_gbps: float
    d2h_gbps: float
    agent_url: str
    engine_version: tuple[int, ...]  # () = latest/untagged: the newest behaviour
    drain_s: float

    def work(self, max_tokens: object) -> tuple[int, float]:
        """The tokens a request generates (its max_tokens, else 16) and its service time on this device: the
        service time scaled by max_tokens / REFERENCE_TOKENS, or one service time when it names no max_tokens.
        E.g. 100 ms per request and max_tokens 512: 512 tokens in 200 ms."""
        generated = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 16
        return generated, self.service_time_ms / 1000 * (generated / REFERENCE_TOKENS if max_tokens else 1.0)

    def wake_s(self) -> float:
        return self.model_bytes / (self.h2d_gbps * GB)

    def sleep_s(self) -> float:
        return self.model_bytes / (self.d2h_gbps * GB)


def hardware_from_env(env: Mapping[str, str] | None = None) -> Hardware:
    """The device from `INFER_CTL_SANDBOX_*`; a bad value fails at start, naming the variable."""
    source = os.environ if env is None else env

    def text(name: str, default: str) -> str:
        return source.get(f"INFER_CTL_SANDBOX_{name}", default)

    def number(name: str, default: float, low: float, strict: bool = False) -> float:
        raw = text(name, str(default))
        try:
            value = float(raw)
        except ValueError:
            raise SystemExit(f"INFER_CTL_SANDBOX_{name}: {raw!r} is not a number") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise SystemExit(f"INFER_CTL_SANDBOX_{name}: {raw!r} must be {'>' if strict else '>='} {low:g}")
        return value

    return Hardware(
        namespace=text("NAMESPACE", "default"),
        pod=text("POD", ""),
        accelerator=text("ACCELERATOR", ""),
        service_time_ms=number("SERVICE_TIME_MS", 100.0, 0),
        concurrency=max(1, int(number("CONCURRENCY", 8, 1))),
        cold_start_s=number("COLD_START_S", 0.0, 0),
        model_bytes=int(number("MODEL_BYTES", 0, 0)),
        h2d_gbps=number("H2D_GBPS", 12.0, 0, strict=True),
        d2h_gbps=number("D2H_GBPS", 12.0, 0, strict=True),
        agent_url=text("AGENT_URL", ""),
        engine_version=parse_version(text("ENGINE_VERSION", "")),
        drain_s=number("DRAIN_S", 30.0, 0),
    )


def parse_version(tag: str) -> tuple[int, ...]:
    """"0.11.0" / "v0.11.0" / "0.11.0-cu128" -> (0, 11, 0); "" or anything without a leading number -> () (newest)."""
    parts: list[int] = []
    for piece in tag.lstrip("v").split("-")[0].split("."):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def at_least(version: tuple[int, ...], minimum: tuple[int, ...]) -> bool:
    """Whether an engine of `version` has what `minimum` introduced; the newest (()) has everything."""
    return version == () or version >= minimum


class Ledger:
    """The node agent's memory ledger for this Pod: reserve before filling memory, release after freeing it."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url
        self.timeout_s = timeout_s

    async def call(self, operation: str, where: str) -> str | None:
        """None when granted (or no agent); else the refusal's message, as the engine would log a CUDA OOM."""
        if not self.url:
            return None
        url = f"{self.url}/{operation}/{where}"
        try:
            status, payload = await asyncio.to_thread(_post, url, self.timeout_s)
        except OSError as e:
            return f"node agent at {url}: {e}"
        if status == 200:
            return None
        try:
            body = json.loads(payload)
            return f"{body.get('reason', 'Refused')}: {body.get('message', '')}"
        except (ValueError, AttributeError):
            return payload.decode(errors="replace")[:500]


def _post(url: str, timeout_s: float) -> tuple[int, bytes]:
    """POST with no body (urllib, imported on first use: a server without an agent never pays for it), straight to
    the agent on 127.0.0.1 whatever proxy the environment names."""
    import urllib.error  # noqa: PLC0415 -- first use only, as the docstring says
    import urllib.request  # noqa: PLC0415 -- first use only, as the docstring says

    request = urllib.request.Request(url, data=b"", method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()
