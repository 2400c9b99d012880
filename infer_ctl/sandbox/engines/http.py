"""A small HTTP/1.1 server on asyncio streams (keep-alive, Content-Length bodies), shared by the stand-ins.

Hand-written rather than aiohttp or uvicorn: the node agent starts one process per Pod and 100 Pods must be up in
seconds on two cores, so a stand-in imports only asyncio and prometheus_client. An inference request's client
that closes its connection before the answer aborts the request, as vLLM's and SGLang's servers abort the
request of a client that went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, generate_latest

# A line a stand-in prints (its stdout, which the node agent reads) when a request reaches it while it sleeps:
# neither engine counts those, and the sleeping tier must route none there (`NodeAgent.asleep_requests`)
ASLEEP_REQUEST = "ASLEEP_REQUEST"


def ignore(_line: str) -> None:
    """An engine's `emit` until it is served (`modelserver.serve` gives it the process's stdout)."""

Answer = tuple[int, str, bytes]  # status, content type, body
Route = Callable[[str, str, dict[str, list[str]], bytes], Awaitable[Answer]]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 422: "Unprocessable Entity",
            500: "Internal Server Error", 503: "Service Unavailable"}


def json_answer(status: int, body: object) -> Answer:
    return status, "application/json", json.dumps(body).encode()


def exposition(registry: CollectorRegistry) -> Answer:
    """A `/metrics` answer: the registry in Prometheus' text format."""
    return 200, "text/plain; version=0.0.4; charset=utf-8", generate_latest(registry)


def empty(status: int = 200) -> Answer:
    return status, "application/json", b""


class HttpServer:
    """Serves `route`; requests for which `watched(method, path)` holds are aborted when their client goes away
    (`on_abort` is told)."""

    def __init__(self, route: Route, watched: Callable[[str, str], bool]) -> None:
        self.route = route
        self.watched = watched
        self.closing = False  # set by a shutdown: answers end their connection
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        self.server = await asyncio.start_server(self.handle, host, port, backlog=1024)
        bound = self.server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    def stop_accepting(self) -> None:
        self.closing = True
        if self.server is not None:
            self.server.close()

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
                work = self.route(method, path, parse_qs(query, keep_blank_values=True), body)
                if self.watched(method, path):
                    answer, ahead = await _unless_closed(reader, work)
                    if answer is None:
                        break
                else:
                    answer, ahead = await work, b""
                status, content_type, payload = answer
                keep = headers.get("connection", "").lower() != "close" and not self.closing
                writer.write(f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\ncontent-type: {content_type}\r\n"
                             f"content-length: {len(payload)}\r\n"
                             f"connection: {'keep-alive' if keep else 'close'}\r\n\r\n".encode() + payload)
                await writer.drain()
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()


async def _unless_closed(reader: asyncio.StreamReader, request: Awaitable[Answer]) -> tuple[Answer | None, bytes]:
    """A request's answer, unless its client closes the connection first: then the request task is cancelled (the
    engine sees an abort). Returns the answer (None: aborted) and the byte of a next request read meanwhile."""
    work: asyncio.Future[Answer] = asyncio.ensure_future(_as_coroutine(request))
    watch: asyncio.Future[bytes] = asyncio.ensure_future(reader.read(1))
    try:
        either: set[asyncio.Future[Any]] = {work, watch}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not work.done() and watch.done() and (watch.exception() is not None or watch.result() == b""):
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
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


async def _as_coroutine(awaitable: Awaitable[Answer]) -> Answer:
    return await awaitable

