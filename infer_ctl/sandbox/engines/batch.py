"""The simulated scheduler both engines share: batch slots, a waiting queue, a pause gate and aborts.

A request waits at the gate while the engine is paused (asleep, or pausing for a sleep), then for one of the
device's batch slots, then takes its service time. A pause can let the admitted requests finish (vLLM's
`mode=wait`) or abort them (`mode=abort`): an aborted request ends with `Aborted`, and its handler answers as the
engine answers an aborted request.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


class Aborted(Exception):
    """The engine aborted the request (a sleep with mode=abort, or a shutdown)."""


@dataclass(frozen=True, slots=True)
class Timing:
    queue_s: float  # from arrival to a slot (gate included: vLLM counts a paused request as waiting)
    service_s: float


class Batch:
    def __init__(self, slots: int) -> None:
        self.slots = asyncio.Semaphore(slots)
        self.capacity = slots
        self.waiting = 0
        self.running = 0
        self.open = asyncio.Event()  # cleared while paused: arrivals wait here
        self.open.set()
        self.admitted: set[asyncio.Task[None]] = set()  # past the gate: waiting for a slot or running
        self.drained = asyncio.Event()
        self.drained.set()

    async def run(self, service_s: float) -> Timing:
        """Wait for the gate and a slot, then serve; raises Aborted if the engine aborts it meanwhile (a
        cancellation of the caller, its client gone, frees the slot and propagates)."""
        arrived = time.perf_counter()
        state = _Request()
        self.waiting += 1
        try:
            await self.open.wait()
            task = asyncio.create_task(self._serve(service_s, state))
            self.admitted.add(task)
            self.drained.clear()
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.cancelled() and not _cancelling():
                    raise Aborted() from None
                task.cancel()
                raise
            finally:
                self.admitted.discard(task)
                if not self.admitted:
                    self.drained.set()
        finally:
            if state.waiting:
                self.waiting -= 1
        return Timing(queue_s=state.started - arrived, service_s=service_s)

    async def _serve(self, service_s: float, state: _Request) -> None:
        async with self.slots:
            state.waiting = False
            self.waiting -= 1
            state.started = time.perf_counter()
            self.running += 1
            try:
                await asyncio.sleep(service_s)
            finally:
                self.running -= 1

    def pause(self) -> None:
        self.open.clear()

    def resume(self) -> None:
        self.open.set()

    def abort_all(self) -> None:
        for task in list(self.admitted):
            task.cancel()

    async def wait_drained(self) -> None:
        await self.drained.wait()


class _Request:
    __slots__ = ("started", "waiting")

    def __init__(self) -> None:
        self.waiting = True
        self.started = 0.0


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0

