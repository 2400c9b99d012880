"""Run an async sandbox component on an event loop in a thread of its own.

Blocking clients (the kubernetes client, kubectl-style scripts) and kopf's own loop must not share the
sandbox's event loop (a blocking call there would deadlock the server it waits for), so tests and the
benchmarks start the sandbox here and talk to it over HTTP like any client.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop in a daemon thread; `call` runs a coroutine on it and waits for its result."""

    def __init__(self, name: str = "sandbox") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, fn: Callable[[], Awaitable[T]], timeout_s: float | None = 60.0) -> T:
        async def runner() -> T:
            return await fn()

        future: Future[T] = asyncio.run_coroutine_threadsafe(runner(), self.loop)
        return future.result(timeout_s)

    def call_sync(self, fn: Callable[[], T], timeout_s: float | None = 60.0) -> T:
        """Run a plain function on the loop (for touching loop-owned state such as the store)."""
        async def runner() -> T:
            return fn()

        return self.call(runner, timeout_s)

    def stop(self) -> None:
        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running():
            self.call(cancel_rest, timeout_s=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
        self.loop.close()


def wait_started(ready: threading.Event, running: Future[object], what: str, timeout_s: float = 30.0) -> None:
    """Wait until `ready` is set by the coroutine behind `running`. A coroutine that fails before it is ready
    raises its own error here, at once, not a timeout that hides it."""
    deadline = time.monotonic() + timeout_s
    while not ready.wait(0.1):
        if running.done():
            running.result()  # its exception, if it failed
            raise RuntimeError(f"{what} ended before it was ready")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} was not ready within {timeout_s:g} s")
