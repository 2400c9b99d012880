"""The Event recorder of the shell (as client-go's `tools/record`: one unit, handed to whoever reports, with its
own aggregation and an injected clock), and a fake that only remembers, for tests of the units that report.

An Event that repeats (same object, reason and note) within EVENT_SERIES_WINDOW_S is counted in the first one's
`series` instead of being posted again, and the series is written at most every EVENT_SERIES_WRITE_S: an
unplaceable service says so once, not every cycle. E.g. the same "cannot be placed" every 10 s for 20 min: one
Event, its series written at 5, 10, 15 and 20 min (count 31, 61, 91, 121)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from infer_ctl.controller.clock import Clock
from infer_ctl.kube.client import KubeClient, KubeError

log = logging.getLogger(__name__)

EVENT_NOTE_MAX = 1024
EVENT_SERIES_WINDOW_S = 1800.0
EVENT_SERIES_WRITE_S = 300.0

Call = Callable[..., Awaitable[Any]]


class Recorder(Protocol):
    async def record(self, regarding: Mapping[str, Any], reason: str, note: str, type: str,  # noqa: PLR0917
                     action: str, now: datetime | None = None) -> None:
        """Post an Event about `regarding` (or count it in its series); `now`: when (the clock's now if None)."""
        ...


@dataclass
class _Posted:
    """An Event posted, and how often it occurred since."""

    name: str
    namespace: str
    count: int
    last_s: float
    written_s: float


class EventRecorder:
    """Posts Events through the API server (`call` runs a blocking client call off the event loop)."""

    def __init__(self, kube: KubeClient, call: Call, clock: Clock) -> None:
        self.kube, self._k, self.clock = kube, call, clock
        self._events: dict[tuple[str, str, str], _Posted] = {}  # (object uid, reason, note) -> the Event posted

    async def record(self, regarding: Mapping[str, Any], reason: str, note: str, type: str,  # noqa: PLR0917
                     action: str, now: datetime | None = None) -> None:
        """Post an Event, or count it in the series of the same Event posted within EVENT_SERIES_WINDOW_S. A
        failure is a log line, never a failed cycle."""
        now = now if now is not None else self.clock.now()
        note = note[:EVENT_NOTE_MAX]
        meta = regarding["metadata"]
        key, t = (str(meta.get("uid", "")), reason, note), now.timestamp()
        posted = self._events.get(key)
        try:
            if posted is not None and t - posted.last_s < EVENT_SERIES_WINDOW_S:
                posted.count, posted.last_s = posted.count + 1, t
                if t - posted.written_s >= EVENT_SERIES_WRITE_S:
                    posted.written_s = t
                    await self._k(self.kube.event_series, posted.name, posted.namespace, count=posted.count,
                                  now=now)
                return
            name = await self._k(self.kube.event, regarding, reason=reason, note=note, type=type, action=action,
                                 now=now)
            self._events = {k: p for k, p in self._events.items() if t - p.last_s < EVENT_SERIES_WINDOW_S}
            self._events[key] = _Posted(name, str(meta.get("namespace") or "default"), 1, t, t)
        except KubeError as exc:
            if posted is not None and exc.not_found:  # the Event expired (its TTL): the next one is posted anew
                self._events.pop(key, None)
            log.warning("cannot record event %s: %s", reason, exc)


@dataclass(frozen=True, slots=True)
class Recorded:
    """An Event a `FakeRecorder` was asked to post."""

    uid: str
    reason: str
    note: str
    type: str
    action: str
    at: datetime


@dataclass
class FakeRecorder:
    """Remembers every Event asked for, in order, and posts nothing (no aggregation: what was asked)."""

    clock: Clock
    recorded: list[Recorded] = field(default_factory=list)

    async def record(self, regarding: Mapping[str, Any], reason: str, note: str, type: str,  # noqa: PLR0917
                     action: str, now: datetime | None = None) -> None:
        self.recorded.append(Recorded(str(regarding["metadata"].get("uid", "")), reason, note[:EVENT_NOTE_MAX],
                                      type, action, now if now is not None else self.clock.now()))

    def reasons(self) -> list[str]:
        return [r.reason for r in self.recorded]
