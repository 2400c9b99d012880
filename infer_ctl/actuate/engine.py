"""The sleep/wake client: puts a replica's engine to sleep and wakes it, the way its runtime profile says
(`policies/runtimes.yaml`, `infer_ctl.core.runtime`), and reads its requests in flight.

- A sleep, on an engine version whose sleep lets the requests in flight finish (vLLM >= 0.16: `POST
  /sleep?level=1&mode=wait`), is that one call. On one whose sleep does not (vLLM before 0.16 has no `mode`, and
  a sleep with requests in flight breaks them; SGLang's release asserts an idle scheduler), the replica is drained
  first: the caller has taken it out of routing, and the client waits until the engine's running and waiting
  gauges (read off its /metrics) are both zero, at most the profile's `drainTimeoutSeconds`; a drain that times
  out is a failed sleep (tried again next cycle), never a sleep over live requests.
- A wake is the wake call, then, where the engine has one, the is-sleeping call must say it is awake before the
  caller puts the replica back in routing (vLLM: `GET /is_sleeping` -> `{"is_sleeping": false}`).
- A refusal is the engine's own answer, said as it said it: vLLM answers a failed wake with HTTP 500 and its
  error JSON (`{"error": {"message": ...}}`, older releases `{"message": ...}`), not a reason code.

Every call has a deadline; an answer that is not 2xx, or no answer, is a failure with a reason ("" = done).
The clock is injected (`sleep_s`), so the drain's polling is tested with time moved by hand.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.core.runtime import HttpCall, ServiceRuntime

DRAIN_POLL_S = 0.5


def gauge_sum(exposition: str, *names: str) -> tuple[float, ...]:
    """Each named gauge's sum over its series in a Prometheus text exposition; a ValueError names one that is
    missing."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in names:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    missing = [n for n in names if n not in totals]
    if missing:
        raise ValueError(f"no {', '.join(missing)} in the exposition")
    return tuple(totals[n] for n in names)


@dataclass(frozen=True, slots=True)
class InFlight:
    """An engine's requests in flight now (running and waiting), or why they could not be read."""

    running: float
    waiting: float
    error: str = ""

    @property
    def total(self) -> float:
        return self.running + self.waiting


def refusal(answer: httpx.Response) -> str:
    """An engine's non-2xx answer as one line: its error message where its JSON has one (vLLM's
    `{"error": {"message"}}` or older `{"message"}`; SGLang's `{"error": {"message"}}`), with the status."""
    try:
        body: Any = answer.json()
    except ValueError:
        body = None
    message = ""
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping):
            message = str(error.get("message") or "")
        elif isinstance(error, str):
            message = error
        message = message or str(body.get("message") or body.get("detail") or "")
    return f"HTTP {answer.status_code}: {message or answer.text[:200]}"


@dataclass
class EngineClient:
    http: httpx.AsyncClient
    # the clock's sleep (asyncio.sleep in the controller; a fake that moves time by hand in tests)
    sleep_s: Callable[[float], Awaitable[None]] = asyncio.sleep
    call_timeout_s: float = 30.0

    async def _call(self, address: str, call: HttpCall, *, extra: Mapping[str, str] | None = None,
                    timeout_s: float | None = None) -> httpx.Response:
        params = {**call.params, **(extra or {})}
        timeout = httpx.Timeout(timeout_s or self.call_timeout_s, connect=2.0)
        return await self.http.request(call.method, f"http://{address}{call.path}", params=params or None,
                                       timeout=timeout)

    async def in_flight(self, address: str, runtime: ServiceRuntime, *, timeout_s: float = 2.0) -> InFlight:
        """The engine's running and waiting requests, from its /metrics."""
        metrics = runtime.profile.metrics
        try:
            answer = await self.http.get(f"http://{address}/metrics", timeout=timeout_s)
            answer.raise_for_status()
            running, waiting = gauge_sum(answer.text, *metrics.in_flight)
            return InFlight(running, waiting)
        except (httpx.HTTPError, ValueError) as exc:
            return InFlight(math.nan, math.nan, f"cannot read {address}/metrics: {type(exc).__name__} {exc}")

    async def drain(self, address: str, runtime: ServiceRuntime, timeout_s: float) -> str:
        """Wait until the engine has no request running or waiting (it is out of routing already); why not
        ("" once drained)."""
        waited = 0.0
        while True:
            now = await self.in_flight(address, runtime)
            if not now.error and now.total == 0:
                return ""
            if waited >= timeout_s:
                return now.error or (f"still {now.running:g} running and {now.waiting:g} waiting after the drain's "
                                     f"{timeout_s:g} s")
            await self.sleep_s(DRAIN_POLL_S)
            waited += DRAIN_POLL_S

    async def sleep(self, address: str, runtime: ServiceRuntime) -> str:
        """Put the engine to sleep (drained first where its version needs it); why it failed ("" when asleep)."""
        protocol, version = runtime.profile.sleep, runtime.sleep_version
        if protocol is None or version is None:
            return f"the {runtime.profile.engine} profile has no sleep mode"
        if not address:
            return "its model server's address is not known"
        if version.drain_first:
            why = await self.drain(address, runtime, protocol.drain_timeout_s)
            if why:
                return f"not drained: {why}"
        try:
            # mode=wait lets the requests in flight finish: the deadline covers them
            answer = await self._call(address, protocol.sleep, extra=version.params,
                                      timeout_s=self.call_timeout_s + protocol.drain_timeout_s)
        except httpx.HTTPError as exc:
            return f"no answer from {address}: {type(exc).__name__} {exc}"
        return "" if answer.is_success else refusal(answer)

    async def wake(self, address: str, runtime: ServiceRuntime, timeout_s: float) -> str:
        """Wake the engine and confirm it is awake; why not ("" when it serves again)."""
        protocol = runtime.profile.sleep
        if protocol is None:
            return f"the {runtime.profile.engine} profile has no sleep mode"
        if not address:
            return "its model server's address is not known yet"
        try:
            answer = await self._call(address, protocol.wake, timeout_s=timeout_s)
            if not answer.is_success:
                return refusal(answer)
            if protocol.is_sleeping is None:
                return ""
            check = await self._call(address, protocol.is_sleeping, timeout_s=5.0)
        except httpx.HTTPError as exc:
            return f"no answer from {address}: {type(exc).__name__} {exc}"
        if not check.is_success:
            return f"is it awake? {refusal(check)}"
        try:
            body = check.json()
        except ValueError:
            body = None
        state = body.get(protocol.is_sleeping_field) if isinstance(body, Mapping) else None
        if state is False:
            return ""
        return f"still asleep after the wake ({protocol.is_sleeping.path} answered {check.text[:100]})"
