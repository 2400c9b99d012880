"""The open loop: one scheduler task sends each request at its scheduled time, whatever came before.

Hot path per request: the scheduler calls `_fire`, which starts one task running `_request`; that task renders
the body, sends it through a Sender, classifies the outcome and records it in RunStats. Nothing waits on
earlier responses: a slow server shows up as latency and in-flight growth, not as a lower rate. When the
optional in-flight cap binds, due requests queue (FIFO) and still count their latency from the scheduled time;
the summary reports how many waited.

Senders (--transport):
* fast (default): loadgen.transport's connection pool driven directly with a request head rendered once;
  per request only the body and Content-Length are joined on. No httpx Request/Response objects: profiling
  showed httpx's client layer (headers, cookies, response objects) costing about two thirds of the CPU per
  request, which is what bounds an open loop on one core.
* httpx-fast: httpx.AsyncClient over loadgen.transport (the same pool, with httpx's request/response objects).
* httpx: httpx.AsyncClient with its stock transport (httpcore): HTTP proxies, HTTP/2 with `h2` installed.
All three raise httpx's exception types, classified the same way.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from loadgen.body import BodyTemplate
from loadgen.schedule import ArrivalChunk
from loadgen.stats import RunStats
from loadgen.transport import FastTransport

USER_AGENT = "loadgen/0.1 (infer-ctl)"
EARLY_S = 1e-6  # a request may go out this much before its time (below the clock's practical resolution)
START_DELAY_S = 0.1  # between setting up and t = 0, so the first requests are not late by construction


@dataclass(frozen=True, slots=True)
class ClientConfig:
    url: str
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: BodyTemplate | None = None
    default_tokens: tuple[int, int] = (512, 128)
    timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    connections: int = 512
    max_in_flight: int | None = None
    transport: str = "fast"  # "fast" (loadgen.transport) or "httpx" (httpx's stock transport)
    verify_tls: bool = True
    http2: bool = False


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


def classify(exc: BaseException) -> str:
    """A short, stable error kind for the summary and metrics."""
    text = str(exc)
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect_timeout"
    if isinstance(exc, httpx.PoolTimeout):
        return "pool_timeout"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        lowered = text.lower()
        if "refused" in lowered or f"[errno {errno.ECONNREFUSED}]" in lowered:
            return "connect_refused"
        if "name or service" in lowered or "nodename" in lowered or "no address" in lowered:
            return "dns"
        if "tls" in lowered or "ssl" in lowered or "certificate" in lowered:
            return "tls"
        return "connect"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "protocol"
    if isinstance(exc, httpx.ReadError | httpx.WriteError):
        return "disconnect"
    if isinstance(exc, httpx.HTTPError):
        return type(exc).__name__.lower()
    return "client_" + type(exc).__name__.lower()


def request_headers(cfg: ClientConfig) -> dict[str, str]:
    """Headers every request carries (lower-case names); the user's -H values override the defaults."""
    headers = {"user-agent": USER_AGENT, "accept": "*/*", "accept-encoding": "identity"}
    if cfg.body is not None:
        headers["content-type"] = "application/json"
    for name, value in cfg.headers:
        headers[name.lower()] = value
    return headers


class Sender(Protocol):
    """Sends one request with `body`; stores the loop time it was written in `written[0]`; returns the status.
    Failures raise (httpx exception types)."""

    async def send(self, body: bytes | None, written: list[float]) -> int: ...

    async def aclose(self) -> None: ...


class DirectSender:
    """The default hot path: FastTransport.exchange with a request head rendered once per run."""

    def __init__(self, cfg: ClientConfig) -> None:
        self._transport = FastTransport(cfg.connections, verify=cfg.verify_tls)
        url = httpx.URL(cfg.url)
        self._pool = self._transport.pool_for(url)
        headers = {"host": url.netloc.decode("ascii"), **request_headers(cfg)}
        lines = [f"{cfg.method} {url.raw_path.decode('ascii')} HTTP/1.1\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
        self._prefix = "".join(lines).encode("latin-1")
        # A bodyless POST/PUT/PATCH still says Content-Length: 0 (servers may answer 411 otherwise).
        empty = "content-length: 0\r\n\r\n" if cfg.method in ("POST", "PUT", "PATCH") else "\r\n"
        self._bodyless = self._prefix + empty.encode()
        self._is_head = cfg.method == "HEAD"
        self._timeouts = (cfg.timeout_s, cfg.connect_timeout_s, cfg.timeout_s)

    async def send(self, body: bytes | None, written: list[float]) -> int:
        if body is None:
            payload = self._bodyless
        else:
            payload = b"".join((self._prefix, b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body))
        pool_s, connect_s, read_s = self._timeouts
        result = await self._transport.exchange(
            self._pool,
            payload,
            is_head=self._is_head,
            pool_timeout_s=pool_s,
            connect_timeout_s=connect_s,
            read_timeout_s=read_s,
            sent=written,
        )
        return result[0]

    async def aclose(self) -> None:
        await self._transport.aclose()


class HttpxSender:
    """httpx.AsyncClient.request per request; `client` defaults to make_client(cfg)."""

    def __init__(self, cfg: ClientConfig, client: httpx.AsyncClient | None = None) -> None:
        self._client = client if client is not None else make_client(cfg)
        self._method = cfg.method
        self._url = httpx.URL(cfg.url)
        self._stock = cfg.transport == "httpx"

    async def send(self, body: bytes | None, written: list[float]) -> int:
        if self._stock:
            extensions: dict[str, Any] = {"trace": _tracer(asyncio.get_running_loop(), written)}
        else:
            extensions = {"loadgen_sent": written}
        response = await self._client.request(self._method, self._url, content=body, extensions=extensions)
        return response.status_code

    async def aclose(self) -> None:
        await self._client.aclose()


def make_sender(cfg: ClientConfig) -> Sender:
    if cfg.transport == "fast":
        return DirectSender(cfg)
    return HttpxSender(cfg)


def make_client(cfg: ClientConfig) -> httpx.AsyncClient:
    """httpx.AsyncClient for --transport httpx-fast (loadgen's transport) or httpx (the stock one)."""
    headers = request_headers(cfg)
    timeout = httpx.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s)
    if cfg.transport == "httpx-fast":
        return httpx.AsyncClient(
            transport=FastTransport(cfg.connections, verify=cfg.verify_tls), headers=headers, timeout=timeout
        )
    limits = httpx.Limits(max_connections=cfg.connections, max_keepalive_connections=cfg.connections)
    return httpx.AsyncClient(
        headers=headers, timeout=timeout, limits=limits, verify=cfg.verify_tls, http2=cfg.http2, trust_env=False
    )


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


def _tracer(loop: asyncio.AbstractEventLoop, box: list[float]) -> Callable[[str, dict[str, Any]], Any]:
    """httpcore's trace hook, for the stock transport: the time the request headers start going out."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event in ("http11.send_request_headers.started", "http2.send_request_headers.started"):
            box[0] = loop.time()

    return trace
