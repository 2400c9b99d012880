"""The model-server stand-in that the node agent runs per bound Pod (`python -m infer_ctl.sandbox.modelserver`).

It behaves like an inference server where the controller can see it: it listens at once, but answers
readiness only after a real cold start (a sleep, shorter when the node has the model cached); each request
takes the accelerator's service time while holding one of `concurrency` slots (more wait in a queue, beyond
`max-queue` they get 429); `/metrics` has `infer_ctl_requests_total{namespace,service,pod}` and the latency
histogram `infer_ctl_request_duration_seconds`; SIGTERM drains in-flight requests and exits.

The HTTP/1.1 server is hand-written on asyncio streams (keep-alive, Content-Length bodies) rather than aiohttp:
the node agent starts one process per Pod and 100 Pods must be ready in seconds on two cores, so the process
imports only asyncio and prometheus_client (about 0.1 s of CPU to start instead of 0.4 s).

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
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request", 429: "Too Many Requests",
            503: "Service Unavailable"}


class ModelServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ready = False
        self.draining = False
        self.slots = asyncio.Semaphore(args.concurrency)
        self.waiting = 0
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        labels = {"namespace": args.namespace, "service": args.service, "pod": args.pod}
        self.registry = CollectorRegistry()
        self.requests = Counter("infer_ctl_requests", "Inference requests answered, by HTTP code.",
                                [*labels, "code"], registry=self.registry)
        self.latency = Histogram("infer_ctl_request_duration_seconds", "Time from request to response.",
                                 list(labels), buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.inflight_gauge = Gauge("infer_ctl_inflight_requests", "Requests being served or queued.",
                                    list(labels), registry=self.registry)
        self.ready_gauge = Gauge("infer_ctl_model_ready", "1 once the model is loaded.", list(labels),
                                 registry=self.registry)
        self.labels = labels
        for code in ("200", "429", "503"):
            self.requests.labels(**labels, code=code)
        self.latency.labels(**labels)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = [*lines[0].split(" ", 2), "", ""][:3]
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                status, content_type, payload = await self.route(method, path.split("?", 1)[0], body)
                keep = headers.get("connection", "").lower() != "close" and not self.draining
                writer.write(f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {content_type}\r\n"
                             f"Content-Length: {len(payload)}\r\nConnection: {'keep-alive' if keep else 'close'}"
                             "\r\n\r\n".encode() + payload)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    async def route(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if method == "GET" and path == "/metrics":
            return 200, "text/plain; version=0.0.4", generate_latest(self.registry)
        if method == "GET" and path in ("/healthz", "/livez"):
            return 200, "text/plain", b"ok"
        if method == "GET" and path in ("/readyz", self.args.ready_path):
            ok = self.ready and not self.draining
            return (200 if ok else 503), "text/plain", b"ready" if ok else b"loading"
        if method != "POST":
            return 405 if path.startswith("/v1/") else 404, "text/plain", b"not found"
        return await self.infer(body)

    async def infer(self, body: bytes) -> tuple[int, str, bytes]:
        started = time.perf_counter()
        if not self.ready or self.draining:
            self.requests.labels(**self.labels, code="503").inc()
            return 503, "application/json", b'{"error": "model not ready"}'
        if self.waiting >= self.args.max_queue:
            self.requests.labels(**self.labels, code="429").inc()
            return 429, "application/json", b'{"error": "queue full"}'
        scale = 1.0
        try:
            tokens = json.loads(body or b"{}").get("max_tokens") if body else None
            if isinstance(tokens, int) and tokens > 0:
                scale = tokens / self.args.reference_tokens
        except (ValueError, AttributeError):
            pass
        self.waiting += 1
        self.inflight += 1
        self.idle.clear()
        self.inflight_gauge.labels(**self.labels).set(self.inflight)
        try:
            async with self.slots:
                self.waiting -= 1
                await asyncio.sleep(self.args.service_time_ms / 1000 * scale)
        finally:
            self.inflight -= 1
            self.inflight_gauge.labels(**self.labels).set(self.inflight)
            if self.inflight == 0:
                self.idle.set()
        elapsed = time.perf_counter() - started
        self.latency.labels(**self.labels).observe(elapsed)
        self.requests.labels(**self.labels, code="200").inc()
        answer = {"pod": self.args.pod, "model": self.args.model, "latency_s": round(elapsed, 6),
                  "accelerator": self.args.accelerator}
        return 200, "application/json", json.dumps(answer).encode()


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
        model.ready = True
        model.ready_gauge.labels(**model.labels).set(1)
        emit("READY")
    await stopping
    loading.cancel()
    # Drain: no new requests (503, connections closed after the answer), in-flight ones finish.
    model.draining = True
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
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments == ["--zygote"]:
        return zygote()
    return asyncio.run(serve(parse_args(arguments)))


if __name__ == "__main__":
    sys.exit(main())
