"""loadgen's HTTP/1.1 transport under httpx.AsyncClient, against real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from loadgen.runner import classify
from loadgen.transport import FastTransport

RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def client(max_connections: int = 8, **timeouts: float) -> httpx.AsyncClient:
    timeout = httpx.Timeout(timeouts.get("timeout", 5.0), **{k: v for k, v in timeouts.items() if k != "timeout"})
    return httpx.AsyncClient(transport=FastTransport(max_connections), timeout=timeout)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[RawHandler], Awaitable[int]]]:
    """raw_server(handler) -> port: an asyncio server speaking whatever bytes the test writes."""
    servers: list[asyncio.Server] = []

    async def start(handler: RawHandler) -> int:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    yield start
    for s in servers:
        s.close()
        await s.wait_closed()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_sequential_requests_reuse_one_keep_alive_connection(upstream) -> None:  # type: ignore[no-untyped-def]
    async with client() as c:
        for _ in range(30):
            r = await c.get(upstream.url("/ok"))
            assert (r.status_code, r.text) == (200, "ok")
    assert upstream.requests == 30 and len(upstream.peers) == 1


async def test_a_chunked_response_is_reassembled(upstream) -> None:  # type: ignore[no-untyped-def]
    async with client() as c:
        r = await c.get(upstream.url("/chunked"))
    assert r.content == b"hello chunked world"


async def test_a_connection_close_response_is_honoured_and_the_next_request_reconnects(upstream) -> None:  # type: ignore[no-untyped-def]
    async with client() as c:
        for _ in range(3):
            assert (await c.get(upstream.url("/close"))).text == "bye"
    assert len(upstream.peers) == 3


async def test_head_and_no_content_responses_have_no_body(upstream) -> None:  # type: ignore[no-untyped-def]
    async with client() as c:
        assert (await c.head(upstream.url("/ok"))).content == b""
        r = await c.get(upstream.url("/status/204"))
        assert (r.status_code, r.content) == (204, b"")
        assert (await c.get(upstream.url("/ok"))).text == "ok"  # the connection is still in step
    assert len(upstream.peers) == 1


async def test_the_pool_never_opens_more_connections_than_allowed(upstream) -> None:  # type: ignore[no-untyped-def]
    async with client(max_connections=3) as c:
        responses = await asyncio.gather(*(c.get(upstream.url("/slow?ms=50")) for _ in range(12)))
    assert all(r.status_code == 200 for r in responses)
    assert len(upstream.peers) == 3


async def test_waiting_for_a_busy_pool_times_out_as_a_pool_timeout(upstream) -> None:  # type: ignore[no-untyped-def]
    async with client(max_connections=1, pool=0.05) as c:
        slow = asyncio.create_task(c.get(upstream.url("/slow?ms=500")))
        await asyncio.sleep(0.05)
        with pytest.raises(httpx.PoolTimeout) as err:
            await c.get(upstream.url("/ok"))
        assert classify(err.value) == "pool_timeout"
        assert (await slow).status_code == 200


async def test_a_response_slower_than_the_read_timeout_is_a_timeout_and_the_connection_is_dropped(upstream) -> None:  # type: ignore[no-untyped-def]
    async with client(read=0.1) as c:
        with pytest.raises(httpx.ReadTimeout) as err:
            await c.get(upstream.url("/slow?ms=1000"))
        assert classify(err.value) == "timeout"
        assert (await c.get(upstream.url("/ok"))).text == "ok"
    assert len(upstream.peers) == 2


async def test_a_refused_connection_is_a_connect_error_naming_the_address() -> None:
    port = free_port()
    async with client() as c:
        with pytest.raises(httpx.ConnectError) as err:
            await c.get(f"http://127.0.0.1:{port}/")
    assert f"127.0.0.1:{port}" in str(err.value)
    assert classify(err.value) == "connect_refused"


async def test_a_body_framed_by_connection_close_is_read_to_the_end(raw_server) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nno length, ")
        await writer.drain()
        writer.write(b"ends at close")
        writer.close()

    port = await raw_server(handler)
    async with client() as c:
        r = await c.get(f"http://127.0.0.1:{port}/")
    assert r.content == b"no length, ends at close"


async def test_an_idle_connection_closed_by_the_server_is_not_reused(raw_server) -> None:  # type: ignore[no-untyped-def]
    connections = 0
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # keep-alive promised, then closed while idle (as servers do on their idle timeout)
        await writer.wait_closed()
        closed.set()

    port = await raw_server(handler)
    async with client() as c:
        assert (await c.get(f"http://127.0.0.1:{port}/")).text == "ok"
        await closed.wait()
        await asyncio.sleep(0.01)  # one loop pass for the client to read the FIN
        assert (await c.get(f"http://127.0.0.1:{port}/")).text == "ok"
    assert connections == 2


async def test_a_response_that_is_not_http_is_a_protocol_error(raw_server) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()

    port = await raw_server(handler)
    async with client() as c:
        with pytest.raises(httpx.RemoteProtocolError, match=r"not an HTTP/1\.x status line") as err:
            await c.get(f"http://127.0.0.1:{port}/")
    assert classify(err.value) == "protocol"


async def test_the_request_goes_out_with_its_body_and_the_send_time_is_recorded(raw_server) -> None:  # type: ignore[no-untyped-def]
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    port = await raw_server(handler)
    sent = [0.0]
    loop = asyncio.get_running_loop()
    before = loop.time()
    async with client() as c:
        r = await c.post(f"http://127.0.0.1:{port}/v1/x?a=1", content=b'{"n": 1}', extensions={"loadgen_sent": sent})
    assert r.status_code == 201
    assert seen[0].startswith(b"POST /v1/x?a=1 HTTP/1.1\r\n")
    assert seen[0].endswith(b'\r\n\r\n{"n": 1}')
    assert before <= sent[0] <= loop.time()


async def test_the_direct_sender_writes_a_complete_request_with_the_users_headers(raw_server) -> None:  # type: ignore[no-untyped-def]
    from loadgen.body import parse_template
    from loadgen.runner import ClientConfig, DirectSender

    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                seen.append(await read_request(reader))
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    port = await raw_server(handler)
    cfg = ClientConfig(
        url=f"http://127.0.0.1:{port}/v1/infer?x=1",
        method="POST",
        headers=(("Authorization", "Bearer t"), ("User-Agent", "mine")),
        body=parse_template('{"n": ${seq}}'),
    )
    sender = DirectSender(cfg)
    written = [0.0]
    try:
        assert await sender.send(b'{"n": 7}', written) == 202
        assert await sender.send(None, written) == 202
    finally:
        await sender.aclose()
    head, _, body = seen[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/infer?x=1 HTTP/1.1"
    assert {f"host: 127.0.0.1:{port}", "user-agent: mine", "authorization: Bearer t",
            "content-type: application/json", "content-length: 8"} <= set(lines[1:])  # fmt: skip
    assert body == b'{"n": 7}'
    assert seen[1].endswith(b"content-length: 0\r\n\r\n")  # a bodyless POST still says so
    assert written[0] > 0


@pytest.mark.parametrize(
    "keep_alive",
    [True, False],
    ids=["a connection handed to a waiter as it is cancelled goes back to the pool",
         "a free slot handed to a waiter as it is cancelled is passed on"],
)  # fmt: skip
async def test_a_waiter_cancelled_in_the_instant_it_is_served_does_not_leak_the_pool(
    upstream: Any, keep_alive: bool
) -> None:
    transport = FastTransport(max_connections=1)
    pool = transport.pool_for(upstream.url("/ok"))
    try:
        held = await transport._acquire(pool, None, 5.0)
        waiting = asyncio.create_task(transport._acquire(pool, None, 5.0))
        await asyncio.sleep(0)  # the task is now queued as a waiter
        assert len(pool.waiters) == 1
        # In one loop pass: the connection is released to the waiter, then the waiter's timeout cancels it.
        transport._release(pool, held, keep_alive=keep_alive)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert pool.open == (1 if keep_alive else 0)
        again = await asyncio.wait_for(transport._acquire(pool, None, 5.0), 2.0)  # the pool is whole again
        assert pool.open == 1
        transport._release(pool, again, keep_alive=True)
    finally:
        await transport.aclose()


@pytest.mark.looptime
@pytest.mark.parametrize(
    "keep_alive",
    [True, False],
    ids=["a connection handed over as the pool timeout fires goes back to the pool",
         "a free slot handed over as the pool timeout fires is passed on"],
)  # fmt: skip
async def test_a_pool_timeout_in_the_instant_of_a_handover_does_not_leak_the_pool(keep_alive: bool) -> None:
    from loadgen.transport import _Connection

    transport = FastTransport(max_connections=1)
    pool = transport.pool_for("http://upstream.test/")
    held = _Connection()  # a connection in use (no socket needed: it is only handed around)
    pool.open = 1
    loop = asyncio.get_running_loop()
    # Both due at the same loop time; the release was scheduled first, so it runs first in that pass, and the
    # waiter's timeout then fires before the waiter could resume.
    loop.call_at(loop.time() + 0.5, transport._release, pool, held, keep_alive)
    with pytest.raises(httpx.PoolTimeout):
        await transport._acquire(pool, 0.5, 5.0)
    if keep_alive:
        assert pool.open == 1 and pool.idle == [held]
    else:
        assert pool.open == 0
    await transport.aclose()
