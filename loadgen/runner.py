"""The open loop: one scheduler task sends each request at its scheduled time, whatever came before.

Hot path per request: the scheduler calls `_fire`, which starts one task running `_request`; that task renders
the body, sends it through a Sender, classifies the outcome and records it in RunStats. Nothing waits on
earlier responses: a slow server shows up as latency and in-flight growth, not as a lower rate. When the
optional in-flight cap binds, due requests queue (FIFO) and still count their latency from the scheduled time;
the summary reports how many waited.

The client (loadgen.client, --transport): aiohttp's client by default, httpx's own transport on request; both
are configured there on purpose (timeouts, connection limit, no retries) and their failures named alike.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from loadgen.client import ClientConfig, Sender, classify, make_sender
from loadgen.schedule import ArrivalChunk
from loadgen.stats import RunStats

EARLY_S = 1e-6  # a request may go out this much before its time (below the clock's practical resolution)
START_DELAY_S = 0.1  # between setting up and t = 0, so the first requests are not late by construction


@dataclass(slots=True)
class RunOutcome:
    stats: RunStats
    started_at_s: float  # loop time of t = 0
    schedule_end_s: float  # last scheduled offset (s)
    last_start_s: float  # offset of the last request handed to the client
    ended_s: float  # offset when the last response (or error) came back
    interrupted: bool = False
    cancelled_at_end: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Runner:
    """Runs one schedule against one target. Create, then `await run(...)` once."""

    def __init__(
        self,
        cfg: ClientConfig,
        stats: RunStats | None = None,
        target_of: Callable[[int], float] | None = None,
        on_tick: Callable[[Runner, int], None] | None = None,
        client_factory: Callable[[ClientConfig], Sender] = make_sender,
    ) -> None:
        """`client_factory` builds the Sender; tests pass an HttpxSender over httpx.MockTransport."""
        self.cfg = cfg
        self._client_factory = client_factory
        self.stats = stats if stats is not None else RunStats()
        self.target_of = target_of
        self.on_tick = on_tick
        self.t0 = 0.0
        self._stop = False
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._queue: collections.deque[tuple[float, int, int, int]] = collections.deque()
        self._idle = asyncio.Event()
        self._stopped = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sender: Sender | None = None
        self._last_start_s = 0.0
        self.current_second = 0

    def stop(self) -> None:
        """Stop scheduling (e.g. on Ctrl-C); requests already sent still finish."""
        self._stop = True
        self._stopped.set()

    def abort(self) -> None:
        """Stop scheduling, drop queued requests and cancel those in flight (e.g. a second Ctrl-C)."""
        self.stop()
        self._queue.clear()
        for task in list(self._tasks):
            task.cancel()
        if self.stats.in_flight == 0:
            self._idle.set()

    @property
    def in_flight(self) -> int:
        return self.stats.in_flight

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def run(
        self, chunks: Iterator[ArrivalChunk], duration_s: float | None = None, drain_timeout_s: float | None = None
    ) -> RunOutcome:
        """Send `chunks`, then wait until `duration_s` after the start (a shape may end in silence, e.g.
        `50@60s,0@120s`: the run, its timeline and progress last the whole shape), then for the responses."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        drain_timeout_s = drain_timeout_s if drain_timeout_s is not None else self.cfg.timeout_s * 2 + 5
        sender = self._client_factory(self.cfg)
        self._sender = sender
        try:
            # Move everything allocated so far (modules, numpy, the schedule's first chunk) out of the
            # collector's reach: a full collection over it took 10-20 ms, long enough to show as send lag.
            gc.collect()
            gc.freeze()
            self.t0 = loop.time() + START_DELAY_S
            ticker = loop.create_task(self._ticker())
            try:
                schedule_end = await self._schedule(chunks)
                if duration_s is not None and not self._stop:
                    remaining = self.t0 + duration_s - loop.time()
                    if remaining > 0:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._stopped.wait(), remaining)
                cancelled = await self._drain(drain_timeout_s)
            finally:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
            ended = loop.time() - self.t0
        finally:
            await sender.aclose()
        self.stats.sample_in_flight(ended)
        self.stats.finalize_before(float("inf"), self.target_of)
        return RunOutcome(
            stats=self.stats,
            started_at_s=self.t0,
            schedule_end_s=schedule_end,
            last_start_s=self._last_start_s,
            ended_s=ended,
            interrupted=self._stop,
            cancelled_at_end=cancelled,
        )

    async def _schedule(self, chunks: Iterator[ArrivalChunk]) -> float:
        loop = self._loop
        assert loop is not None
        clock = loop.time
        t0 = self.t0
        fire = self._fire
        default_ctx, default_gen = self.cfg.default_tokens
        last = 0.0
        for chunk in chunks:
            offsets = chunk.offsets_s.tolist()
            n = len(offsets)
            ctx = chunk.context_tokens.tolist() if chunk.context_tokens is not None else None
            gen = chunk.generated_tokens.tolist() if chunk.generated_tokens is not None else None
            i = 0
            while i < n:
                if self._stop:
                    return last
                delay = t0 + offsets[i] - clock()
                # Always yield once per batch, even when behind, so started requests make progress.
                await asyncio.sleep(delay if delay > 0 else 0)
                # Compare absolute times (t0 + offset, as the sleep was computed), with a microsecond of
                # tolerance: the loop may wake a hair early, and `now - t0 < offset` by rounding would
                # otherwise make it sleep for 1e-17 s again and again.
                horizon = clock() + EARLY_S
                while i < n and t0 + offsets[i] <= horizon:
                    fire(
                        offsets[i],
                        ctx[i] if ctx is not None else default_ctx,
                        gen[i] if gen is not None else default_gen,
                    )
                    i += 1
            if n:
                last = offsets[-1]
        return last

    def _fire(self, sched_s: float, context_tokens: int, generated_tokens: int) -> None:
        self.stats.on_scheduled(sched_s)
        seq = self._seq
        self._seq = seq + 1
        cap = self.cfg.max_in_flight
        if cap is not None and self.stats.in_flight >= cap:
            self.stats.cap_waited += 1
            self._queue.append((sched_s, context_tokens, generated_tokens, seq))
            return
        self._start(sched_s, context_tokens, generated_tokens, seq)

    def _start(self, sched_s: float, context_tokens: int, generated_tokens: int, seq: int) -> None:
        assert self._loop is not None
        self.stats.on_start()
        self._idle.clear()
        task = self._loop.create_task(self._request(sched_s, context_tokens, generated_tokens, seq))
        self._tasks.add(task)
        self._last_start_s = self._loop.time() - self.t0

    async def _request(self, sched_s: float, context_tokens: int, generated_tokens: int, seq: int) -> None:
        cfg = self.cfg
        sender = self._sender
        loop = self._loop
        assert sender is not None and loop is not None
        t0 = self.t0
        written = [0.0]
        body = cfg.body.render(context_tokens, generated_tokens, seq) if cfg.body is not None else None
        status = 0
        kind: str | None = None
        try:
            status = await sender.send(body, written)
            if status >= 400:
                kind = f"http_{status}"
        except asyncio.CancelledError:
            kind = "cancelled"
            raise
        except Exception as exc:  # every failure is data for the summary, never a crash of the loop
            kind = classify(exc)
            self.stats.note_error(kind, f"{type(exc).__name__}: {exc}")
        finally:
            done = loop.time()
            self.stats.on_done(sched_s, written[0] - t0 if written[0] else None, done - t0, status, kind)
            self._tasks.discard(asyncio.current_task())
            if self._queue and (cfg.max_in_flight is None or self.stats.in_flight < cfg.max_in_flight):
                self._start(*self._queue.popleft())
            elif self.stats.in_flight == 0 and not self._queue:
                self._idle.set()

    async def _drain(self, timeout_s: float) -> int:
        """Wait for every started and queued request; cancel what is left after `timeout_s`."""
        if self.stats.in_flight == 0 and not self._queue:
            return 0
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
            return 0
        except TimeoutError:
            left = len(self._tasks) + len(self._queue)
            self._queue.clear()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            return left

    async def _ticker(self) -> None:
        """Once per second of run time: sample in-flight, fold old seconds into rows, call `on_tick`."""
        loop = self._loop
        assert loop is not None
        k = 0
        # A second is final when nothing scheduled in it can still be pending.
        horizon_s = self.cfg.timeout_s * 2 + 2
        while True:
            await asyncio.sleep(max(0.0, self.t0 + k + 1 - loop.time()))
            self.stats.sample_in_flight(k + 0.5)
            self.current_second = k + 1
            self.stats.finalize_before(k - horizon_s, self.target_of)
            if self.on_tick is not None:
                self.on_tick(self, k + 1)
            k += 1
