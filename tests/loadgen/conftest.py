"""Fixtures for loadgen's tests: a real HTTP server on 127.0.0.1 in a thread of its own, and trace builders."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web


@dataclass
class Upstream:
    """What the test server saw."""

    port: int = 0
    bodies: list[dict[str, object]] = field(default_factory=list)
    peers: set[tuple[str, int]] = field(default_factory=set)
    requests: int = 0

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


def _app(seen: Upstream) -> web.Application:
    async def count(request: web.Request) -> None:
        seen.requests += 1
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            seen.peers.add(peer[:2])

    async def ok(request: web.Request) -> web.Response:
        await count(request)
        return web.Response(text="ok")

    async def slow(request: web.Request) -> web.Response:
        await count(request)
        await asyncio.sleep(float(request.query.get("ms", "200")) / 1000.0)
        return web.Response(text="slow ok")

    async def status(request: web.Request) -> web.Response:
        await count(request)
        return web.Response(status=int(request.match_info["code"]), text="status")

    async def echo(request: web.Request) -> web.Response:
        await count(request)
        seen.bodies.append(json.loads(await request.read()))
        return web.json_response({"ok": True})

    async def chunked(request: web.Request) -> web.StreamResponse:
        await count(request)
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b"hello ", b"chunked ", b"world"):
            await resp.write(part)
        await resp.write_eof()
        return resp

    async def close(request: web.Request) -> web.Response:
        await count(request)
        resp = web.Response(text="bye")
        resp.force_close()
        return resp

    app = web.Application()
    app.router.add_route("*", "/ok", ok)
    app.router.add_route("*", "/slow", slow)
    app.router.add_route("*", "/status/{code}", status)
    app.router.add_post("/echo", echo)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/close", close)
    return app


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    """An aiohttp server on 127.0.0.1 (any free port) in its own thread and event loop; stopped afterwards."""
    seen = Upstream()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner = web.AppRunner(_app(seen), access_log=None)

    async def start() -> None:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        seen.port = server.sockets[0].getsockname()[1]

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, name="upstream", daemon=True)
    thread.start()
    assert started.wait(10), "test server did not start"
    yield seen
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture
def write_csv(tmp_path: Path) -> Callable[[str, list[str]], Path]:
    """Builder: write_csv(name, lines) -> path of a CSV file with those lines."""

    def build(name: str, lines: list[str]) -> Path:
        path = tmp_path / name
        path.write_text("\n".join(lines) + "\n")
        return path

    return build


def azure_lines(n: int, start_s: float = 0.0, gap_s: float = 0.1) -> list[str]:
    """An Azure LLM trace of n requests gap_s apart, with 7-digit fractions as in the published files."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(n):
        t = start_s + i * gap_s
        whole, frac = divmod(t, 1.0)
        minute, second = divmod(int(whole), 60)
        lines.append(f"2023-11-16 18:{17 + minute:02d}:{second:02d}.{round(frac * 1e7):07d},{100 + i},{10 + i}")
    return lines


@pytest.fixture
def azure_trace(write_csv: Callable[[str, list[str]], Path]) -> Callable[..., Path]:
    def build(n: int = 20, gap_s: float = 0.1) -> Path:
        return write_csv("azure.csv", azure_lines(n, gap_s=gap_s))

    return build
