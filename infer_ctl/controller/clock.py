"""The shell's one clock: every other module of `infer_ctl.controller` is handed one (the operator the system's,
tests a `FakeClock` they move by hand, as client-go's `clock/testing.FakeClock`), so that no rule of the shell
depends on when a test happens to run. Nothing else in controller/ reads the time (tests/test_architecture.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The wall-clock time (aware, UTC): what the cycle plans at and what an Event says."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: for durations and ages within this process."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()


@dataclass
class FakeClock:
    """A clock that moves only when told (`step`), both readings together."""

    at: datetime
    monotonic_s: float = 0.0

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return self.monotonic_s

    def step(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)
        self.monotonic_s += seconds
