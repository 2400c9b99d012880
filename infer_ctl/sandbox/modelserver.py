"""The model-server stand-in that the node agent runs per bound Pod (`python -m infer_ctl.sandbox.modelserver`).

It behaves like an inference server where the controller can see it: it listens at once, but answers
readiness only after a real cold start (a sleep, shorter when the node has the model cached); each request
takes the accelerator's service time while holding one of `concurrency` slots (more wait in a queue, beyond
`max-queue` they get 429; a request whose client closes the connection before its answer is aborted, its slot or
place freed, and counted with code 499, as vLLM aborts a disconnected client's request); `/metrics` has
`infer_ctl_requests_total{namespace,service,pod}` and the latency histogram `infer_ctl_request_duration_seconds`;
SIGTERM drains in-flight requests and exits.

The HTTP/1.1 server is hand-written on asyncio streams (keep-alive, Content-Length bodies) rather than aiohttp:
the node agent starts one process per Pod and 100 Pods must be ready in seconds on two cores, so the process
imports only asyncio and prometheus_client (about 0.1 s of CPU to start instead of 0.4 s).

Sleep mode, as vLLM's level 1 (`--enable-sleep-mode`): `POST /sleep?level=1` lets in-flight requests finish,
then moves the weights to host memory (`--model-bytes` / `--d2h-gbps`) and frees the device; `POST /wake_up`
moves them back (`--model-bytes` / `--h2d-gbps`); `GET /is_sleeping` answers `{"is_sleeping": bool}`. Both are
idempotent (sleeping when asleep answers 200 at once). With `--start-asleep` the server loads into host memory
and reports ready asleep (ready means loaded). A request that arrives while the model sleeps, or is going to
sleep, is answered 503 at once with Retry-After and `X-Infer-Ctl-Asleep: true` (the front door then sends it to
another replica: it reached this one before the router saw it leave traffic); one that arrives during a wake is
held until the wake ends, at most `max-queue` of them and at most `--hold-s` each. A request never wakes the
model: the controller decides which model is awake on a GPU. With `--agent-url`, each move first asks the node agent
for the memory it will fill (`POST <agent-url>/reserve/device` before a wake, `.../reserve/host` before a sleep)
and tells it what it freed (`.../release/host` after a wake, `.../release/device` after a sleep): a refusal is a
409 with the agent's `{"reason": ..., "message": ...}` (DeviceMemory: the device's memory is taken by other awake
models; HostMemory: the node's host-memory budget is full), and nothing moves.
Gauges (labels namespace, service, pod): `infer_ctl_model_sleeping`, `infer_ctl_host_memory_bytes` (weights in
host memory: while asleep), `infer_ctl_gpu_memory_bytes` (while awake), `infer_ctl_queue_depth` (requests
waiting for a slot or for a wake); `infer_ctl_wakes_total` and the histogram `infer_ctl_wake_duration_seconds`.

Protocol with the node agent on stdout: `LISTENING <port>` once bound, `READY` after the cold start.

`--zygote` is the node agent's fork server: it imports all of this once and forks one child process per Pod
on request (a JSON line `{"id": ..., "args": [...]}` on stdin), reporting `<id> PID <pid>`, the child's
`<id> LISTENING <port>` / `<id> READY`, and `<id> EXITED <code>`. Each Pod is still its own process, but starting
one costs a fork (milliseconds) instead of an interpreter start (0.2 s of CPU), which is what lets 100 Pods
become ready within seconds on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
WAKE_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0)
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request", 409: "Conflict",
            429: "Too Many Requests", 503: "Service Unavailable"}
GB = 1e9  # the bandwidths are in GB/s, 10^9 bytes per second
ASLEEP_HEADER = "X-Infer-Ctl-Asleep"  # on a 503 of a model that sleeps: the front door retries another replica

Answer = tuple[int, str, bytes, dict[str, str]]


def _json(status: int, body: object, headers: dict[str, str] | None = None) -> Answer:
    return status, "application/json", json.dumps(body).encode(), headers or {}


class ModelServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ready = False
        self.draining = False
        self.stopping = asyncio.Event()  # set when draining begins: held requests are answered at once
        self.slots = asyncio.Semaphore(args.concurrency)
        self.waiting = 0  # admitted, waiting for a slot
        self.held = 0  # waiting for a wake
        self.inflight = 0  # every request inside: held, waiting or served
        self.idle = asyncio.Event()
        self.idle.set()
        self.admitted = 0  # past the wake gate: waiting for a slot or served (a sleep waits for them)
        self.admitted_idle = asyncio.Event()
        self.admitted_idle.set()
        self.asleep = False
        self.waking = False  # a wake is under way: requests that arrive are held until it ends
        self.awake = asyncio.Event()  # set while requests pass: loaded, awake and not going to sleep
        self.transition = asyncio.Lock()  # one sleep or wake at a time
        labels = {"namespace": args.namespace, "service": args.service, "pod": args.pod}
        names = list(labels)
        self.registry = CollectorRegistry()
        self.requests = Counter("infer_ctl_requests", "Inference requests answered, by HTTP code.",
                                [*labels, "code"], registry=self.registry)
        self.latency = Histogram("infer_ctl_request_duration_seconds", "Time from request to response.",
                                 names, buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.inflight_gauge = Gauge("infer_ctl_inflight_requests", "Requests being served or queued.",
                                    names, registry=self.registry)
        self.ready_gauge = Gauge("infer_ctl_model_ready", "1 once the model is loaded.", names,
                                 registry=self.registry)
        self.sleeping_gauge = Gauge("infer_ctl_model_sleeping", "1 while the model sleeps (weights in host memory).",
                                    names, registry=self.registry)
        self.host_memory = Gauge("infer_ctl_host_memory_bytes", "Weights held in host memory (while asleep).",
                                 names, registry=self.registry)
        self.gpu_memory = Gauge("infer_ctl_gpu_memory_bytes", "Weights held in device memory (while awake).",
                                names, registry=self.registry)
        self.queue_gauge = Gauge("infer_ctl_queue_depth", "Requests waiting for a slot or for a wake.",
                                 names, registry=self.registry)
        self.wakes = Counter("infer_ctl_wakes", "Wakes from sleep.", names, registry=self.registry)
        self.wake_duration = Histogram("infer_ctl_wake_duration_seconds", "Time to move the weights back to the "
                                       "device and serve again.", names, buckets=WAKE_BUCKETS_S,
                                       registry=self.registry)
        self.labels = labels
        for code in ("200", "429", "503"):
            self.requests.labels(**labels, code=code)
        self.latency.labels(**labels)
        self.wakes.labels(**labels)
        self.wake_duration.labels(**labels)
        for gauge in (self.inflight_gauge, self.ready_gauge, self.sleeping_gauge, self.host_memory, self.gpu_memory,
                      self.queue_gauge):
            gauge.labels(**labels)

    # ------------------------------------------------------------------------------------------ states

    def loaded(self) -> None:
        """The cold start is over: serve, or (`--start-asleep`) sleep with the weights in host memory."""
        self.ready = True
        self.ready_gauge.labels(**self.labels).set(1)
        self._set_asleep(self.args.start_asleep)

    def drain(self) -> None:
        """No new requests (503, connections closed after the answer); held ones are answered 503 at once."""
        self.draining = True
        self.stopping.set()

    def _set_asleep(self, asleep: bool) -> None:
        self.asleep = asleep
        self.sleeping_gauge.labels(**self.labels).set(1 if asleep else 0)
        self.host_memory.labels(**self.labels).set(self.args.model_bytes if asleep else 0)
        self.gpu_memory.labels(**self.labels).set(0 if asleep else self.args.model_bytes)
        if asleep:
            self.awake.clear()
        else:
            self.awake.set()

    def _count(self) -> None:
        self.inflight_gauge.labels(**self.labels).set(self.inflight)
        self.queue_gauge.labels(**self.labels).set(self.waiting + self.held)

    def retry_after_s(self) -> int:
        """What a held request's 503 suggests: the time a wake takes, at least a second."""
        return max(1, math.ceil(float(self.args.model_bytes) / (float(self.args.h2d_gbps) * GB)))

    # ------------------------------------------------------------------------------------------ HTTP

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ahead = b""  # the first byte of a next request, read while watching for the client's close
        try:
            while True:
                head = ahead + await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = [*lines[0].split(" ", 2), "", ""][:3]
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                path, _, query = target.partition("?")
                route = self.route(method, path, parse_qs(query), body)
                if method == "POST" and path.startswith("/v1/"):
                    answer, ahead = await self._unless_closed(reader, route)
                    if answer is None:
                        break
                    status, content_type, payload, extra = answer
                else:
                    status, content_type, payload, extra = await route
                    ahead = b""
                keep = headers.get("connection", "").lower() != "close" and not self.draining
                head_out = "".join(f"{k}: {v}\r\n" for k, v in extra.items())
                writer.write(f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {content_type}\r\n"
                             f"Content-Length: {len(payload)}\r\n{head_out}"
                             f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n".encode() + payload)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    async def _unless_closed(self, reader: asyncio.StreamReader, request: Coroutine[Any, Any, Answer]
                             ) -> tuple[Answer | None, bytes]:
        """A request's answer, unless its client closes the connection first: then the request is aborted (its
        slot, or its place in the queue, freed, and counted as 499), as vLLM's server aborts the request of a
        client that disconnected, rather than spent on an answer nobody reads (a front door whose client timed
        out closes its request here). Returns the answer (None: aborted) and the byte of a next request read
        meanwhile (b"" if none: clients do not pipeline, but one may)."""
        work = asyncio.ensure_future(request)
        watch = asyncio.ensure_future(reader.read(1))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done() and watch.done() and (watch.exception() is not None or watch.result() == b""):
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                self.requests.labels(**self.labels, code="499").inc()
                return None, b""
            answer = await work
            if not watch.done():
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            ahead = watch.result() if watch.done() and not watch.cancelled() and watch.exception() is None else b""
            return answer, ahead
        finally:
            for task in (work, watch):
                task.cancel()

    async def route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> Answer:
        if method == "GET" and path == "/metrics":
            return 200, "text/plain; version=0.0.4", generate_latest(self.registry), {}
        if method == "GET" and path in ("/healthz", "/livez"):
            return 200, "text/plain", b"ok", {}
        if method == "GET" and path in ("/readyz", self.args.ready_path):
            ok = self.ready and not self.draining
            return (200 if ok else 503), "text/plain", b"ready" if ok else b"loading", {}
        if method == "GET" and path == "/is_sleeping":
            return _json(200, {"is_sleeping": self.asleep})
        if method == "POST" and path == "/sleep":
            return await self.sleep(query)
        if method == "POST" and path == "/wake_up":
            return await self.wake_up()
        if method != "POST":
            return 405 if path.startswith("/v1/") else 404, "text/plain", b"not found", {}
        return await self.infer(body)

    # ------------------------------------------------------------------------------------------ sleep and wake

    async def sleep(self, query: dict[str, list[str]]) -> Answer:
        level = (query.get("level") or query.get("sleep_level") or ["1"])[0]
        if level != "1":
            return _json(400, {"reason": "BadRequest", "message": f"level: {level!r} is not supported; this "
                                                                 "server sleeps at level 1 only (weights kept in "
                                                                 "host memory)"})
        if not self.ready:
            return _json(503, {"reason": "Loading", "message": "the model is still loading"})
        async with self.transition:
            if self.asleep:
                return _json(200, {})
            refused = await self._agent("reserve", "host")
            if refused is not None:
                return refused
            self.awake.clear()  # new requests are held from now on; admitted ones finish first
            await self.admitted_idle.wait()
            await asyncio.sleep(self.args.model_bytes / (self.args.d2h_gbps * GB))
            self._set_asleep(True)
            await self._agent("release", "device")
        return _json(200, {})

    async def wake_up(self) -> Answer:
        if not self.ready:
            return _json(503, {"reason": "Loading", "message": "the model is still loading"})
        async with self.transition:
            if not self.asleep:
                return _json(200, {})
            refused = await self._agent("reserve", "device")
            if refused is not None:
                return refused
            started = time.perf_counter()
            self.waking = True
            try:
                await asyncio.sleep(self.args.model_bytes / (self.args.h2d_gbps * GB))
            finally:
                self.waking = False
            self._set_asleep(False)
            self.wake_duration.labels(**self.labels).observe(time.perf_counter() - started)
            self.wakes.labels(**self.labels).inc()
            await self._agent("release", "host")
        return _json(200, {})

    async def _agent(self, operation: str, where: str) -> Answer | None:
        """Ask the node agent (if any) to reserve or release memory; a refusal or an error as the answer."""
        if not self.args.agent_url:
            return None
        url = f"{self.args.agent_url}/{operation}/{where}"
        try:
            status, payload = await asyncio.to_thread(_post, url, self.args.agent_timeout_s)
        except OSError as e:
            return _json(503, {"reason": "AgentUnavailable", "message": f"node agent at {url}: {e}"})
        if status == 200:
            return None
        try:
            body = json.loads(payload)
        except ValueError:
            body = {"reason": "AgentError", "message": payload.decode(errors="replace")[:500]}
        return _json(status if status in (409, 404) else 503, body)

    # ------------------------------------------------------------------------------------------ requests

    async def infer(self, body: bytes) -> Answer:
        started = time.perf_counter()
        if not self.ready or self.draining:
            self.requests.labels(**self.labels, code="503").inc()
            return _json(503, {"error": "model not ready"})
        self.inflight += 1
        self.idle.clear()
        try:
            # Held only while a wake is under way (the controller wakes a replica before it puts it in
            # traffic); asleep or going to sleep, refused at once with a header the front door retries elsewhere
            # (a router that sent it here has not seen the replica leave traffic yet).
            if not self.awake.is_set() and (not self.waking or self.held >= self.args.max_queue
                                            or not await self._hold()):
                self.requests.labels(**self.labels, code="503").inc()
                return _json(503, {"error": "model asleep"}, {"Retry-After": str(self.retry_after_s()),
                                                             ASLEEP_HEADER: "true"})
            if self.waiting >= self.args.max_queue:
                self.requests.labels(**self.labels, code="429").inc()
                return _json(429, {"error": "queue full"})
            return await self._serve(body, started)
        finally:
            self.inflight -= 1
            self._count()
            if self.inflight == 0:
                self.idle.set()

    async def _hold(self) -> bool:
        """Wait (at most `--hold-s`) until the model is awake; False if it was not, or the server drains."""
        self.held += 1
        self._count()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.args.hold_s
        try:
            while not self.awake.is_set():
                remaining = deadline - loop.time()
                if remaining <= 0 or self.stopping.is_set():
                    return False
                waiters = {asyncio.ensure_future(self.awake.wait()), asyncio.ensure_future(self.stopping.wait())}
                _, pending = await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                for waiter in pending:
                    waiter.cancel()
            return not self.stopping.is_set()
        finally:
            self.held -= 1
            self._count()

    async def _serve(self, body: bytes, started: float) -> Answer:
        # Admitted synchronously after the wake gate: a sleep that begins now waits for this request.
        self.admitted += 1
        self.admitted_idle.clear()
        scale = 1.0
        try:
            tokens = json.loads(body or b"{}").get("max_tokens") if body else None
            if isinstance(tokens, int) and tokens > 0:
                scale = tokens / self.args.reference_tokens
        except (ValueError, AttributeError):
            pass
        self.waiting += 1
        self._count()
        try:
            async with self.slots:
                self.waiting -= 1
                self._count()
                await asyncio.sleep(self.args.service_time_ms / 1000 * scale)
        finally:
            self.admitted -= 1
            if self.admitted == 0:
                self.admitted_idle.set()
        elapsed = time.perf_counter() - started
        self.latency.labels(**self.labels).observe(elapsed)
        self.requests.labels(**self.labels, code="200").inc()
        answer = {"pod": self.args.pod, "model": self.args.model, "latency_s": round(elapsed, 6),
                  "accelerator": self.args.accelerator}
        return _json(200, answer)


def _post(url: str, timeout_s: float) -> tuple[int, bytes]:
    """POST with no body (urllib, imported on first use: a server without an agent never pays for it), straight to
    the agent on 127.0.0.1 whatever proxy the environment names."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=b"", method="POST")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


def _print(message: str) -> None:
    print(message, flush=True)


async def serve(args: argparse.Namespace, emit: Callable[[str], None] = _print) -> int:
    model = ModelServer(args)
    server = await asyncio.start_server(model.handle, "127.0.0.1", args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    emit(f"LISTENING {port}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loading = asyncio.ensure_future(asyncio.sleep(args.cold_start_s))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if loading.done() and not stop.is_set():
        model.loaded()
        emit("READY")
    await stopping
    loading.cancel()
    # Drain: no new requests (503, connections closed after the answer), in-flight ones finish.
    model.drain()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(model.idle.wait(), args.drain_s)
    server.close()
    emit("STOPPED")
    return 0


def zygote() -> int:
    """Fork server: one child per command line on stdin; stdin closing stops every child and the zygote."""
    out = sys.stdout
    children: dict[int, str] = {}

    def write(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    def reap(_signum: int = 0, _frame: object = None) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ident = children.pop(pid, None)
            if ident is not None:
                write(f"{ident} EXITED {os.waitstatus_to_exitcode(status)}")

    signal.signal(signal.SIGCHLD, reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent stops the zygote by closing its stdin
    for line in sys.stdin:
        try:
            command = json.loads(line)
            ident, argv = str(command["id"]), [str(a) for a in command["args"]]
            args = parse_args(argv)
        except (ValueError, KeyError, TypeError, SystemExit) as e:
            write(f"- ERROR {e!r}")
            continue
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # record the pid before its exit is reaped
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            os.setsid()
            os.close(0)
            prefix = ident

            def emit(message: str, prefix: str = prefix) -> None:
                write(f"{prefix} {message}")

            code = 1
            try:
                code = asyncio.run(serve(args, emit))
            finally:
                os._exit(code)
        children[pid] = ident
        write(f"{ident} PID {pid}")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m infer_ctl.sandbox.modelserver")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (reported on stdout)")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--service", default="")
    parser.add_argument("--pod", default="")
    parser.add_argument("--model", default="")
    parser.add_argument("--accelerator", default="")
    parser.add_argument("--service-time-ms", type=float, default=100.0)
    parser.add_argument("--reference-tokens", type=int, default=256,
                        help="requests with max_tokens take service time x max_tokens/this")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-queue", type=int, default=256)
    parser.add_argument("--cold-start-s", type=float, default=0.0)
    parser.add_argument("--drain-s", type=float, default=30.0)
    parser.add_argument("--ready-path", default="/readyz")
    parser.add_argument("--model-bytes", type=_non_negative_int, default=0,
                        help="weights moved by a sleep or a wake (0: they move at once)")
    parser.add_argument("--h2d-gbps", type=_positive_float, default=12.0,
                        help="host-to-device bandwidth of a wake, GB/s")
    parser.add_argument("--d2h-gbps", type=_positive_float, default=12.0,
                        help="device-to-host bandwidth of a sleep, GB/s")
    parser.add_argument("--start-asleep", action="store_true",
                        help="load into host memory and sleep (ready means loaded)")
    parser.add_argument("--hold-s", type=_non_negative_float, default=30.0,
                        help="how long a request that arrives while asleep is held before a 503")
    parser.add_argument("--agent-url", default="",
                        help="the node agent's URL for this pod (memory reservations); empty: none")
    parser.add_argument("--agent-timeout-s", type=_positive_float, default=10.0)
    return parser.parse_args(argv)


def _number(kind: type[float] | type[int], low: float, strict: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"{text!r} must be {'>' if strict else '>='} {low:g}")
        return value

    return parse


_non_negative_int = _number(int, 0, strict=False)
_positive_float = _number(float, 0, strict=True)
_non_negative_float = _number(float, 0, strict=False)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments == ["--zygote"]:
        return zygote()
    return asyncio.run(serve(parse_args(arguments)))


if __name__ == "__main__":
    sys.exit(main())
