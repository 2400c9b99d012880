"""loadgen's clients (aiohttp's, the default, and httpx's own transport) as the runner drives them: one Sender per
run, against real servers on 127.0.0.1; what goes out, what comes back, and how failures are named."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from infer_ctl.sandbox.ports import free_port
from loadgen.body import parse_template
from loadgen.client import TRANSPORTS, ClientConfig, Sender, classify, make_sender

RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

each_client = pytest.mark.parametrize("transport", TRANSPORTS)


@asynccontextmanager
async def sender(url: str, transport: str = "aiohttp", **cfg: object) -> AsyncIterator[Sender]:
    s = make_sender(ClientConfig(url=url, transport=transport, **cfg))  # type: ignore[arg-type]
    try:
        yield s
    finally:
        await s.aclose()


async def failure(s: Sender) -> BaseException:
    try:
        status = await s.send(None, [0.0])
    except Exception as exc:
        return exc
    raise AssertionError(f"expected a failure, got HTTP {status}")


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + (await reader.readexactly(length) if length else b"")


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[RawHandler], Awaitable[str]]]:
    """raw_server(handler) -> URL: an asyncio server speaking whatever bytes the test writes."""
    servers: list[asyncio.Server] = []

    async def start(handler: RawHandler) -> str:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"

    yield start
    for s in servers:
        s.close()
        await s.wait_closed()


@each_client
async def test_sequential_requests_reuse_one_keep_alive_connection(upstream, transport: str) -> None:  # type: ignore[no-untyped-def]
    async with sender(upstream.url("/ok"), transport) as s:
        assert [await s.send(None, [0.0]) for _ in range(30)] == [200] * 30
    assert upstream.requests == 30 and len(upstream.peers) == 1


@each_client
async def test_a_chunked_response_is_read_to_its_end_and_the_connection_stays_in_step(upstream, transport: str) -> None:  # type: ignore[no-untyped-def]
    async with sender(upstream.url("/chunked"), transport) as s:
        assert [await s.send(None, [0.0]) for _ in range(3)] == [200] * 3
    assert len(upstream.peers) == 1


@each_client
async def test_a_streamed_response_counts_until_its_last_event(raw_server, transport: str) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for event in (b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    loop = asyncio.get_running_loop()
    async with sender(await raw_server(handler), transport) as s:
        began = loop.time()
        assert await s.send(None, [0.0]) == 200
        assert loop.time() - began >= 0.3


@each_client
async def test_a_connection_close_response_is_honoured_and_the_next_request_reconnects(
    upstream, transport: str
) -> None:  # type: ignore[no-untyped-def]
    async with sender(upstream.url("/close"), transport) as s:
        assert [await s.send(None, [0.0]) for _ in range(3)] == [200] * 3
    assert len(upstream.peers) == 3


@each_client
async def test_head_and_no_content_responses_keep_the_connection_in_step(upstream, transport: str) -> None:  # type: ignore[no-untyped-def]
    async with sender(upstream.url("/ok"), transport, method="HEAD") as s:
        assert [await s.send(None, [0.0]) for _ in range(2)] == [200, 200]
    async with sender(upstream.url("/status/204"), transport) as s:
        assert [await s.send(None, [0.0]) for _ in range(2)] == [204, 204]
    assert len(upstream.peers) == 2  # one per sender


@each_client
async def test_the_pool_never_opens_more_connections_than_allowed(upstream, transport: str) -> None:  # type: ignore[no-untyped-def]
    async with sender(upstream.url("/slow?ms=50"), transport, connections=3) as s:
        statuses = await asyncio.gather(*(s.send(None, [0.0]) for _ in range(12)))
    assert statuses == [200] * 12
    assert len(upstream.peers) == 3


@each_client
async def test_a_slow_response_is_a_timeout_and_a_request_waiting_for_the_pool_a_pool_timeout(
    upstream, transport: str
) -> None:  # type: ignore[no-untyped-def]
    # One connection, four requests at once: the first holds it until its time runs out, and so do the others,
    # the last two (at least) while still waiting for the connection.
    async with sender(upstream.url("/slow?ms=1000"), transport, connections=1, timeout_s=0.3) as s:
        errors = await asyncio.gather(*(failure(s) for _ in range(4)))
    kinds = [classify(e) for e in errors]
    assert kinds[0] == "timeout"
    assert kinds[2:] == ["pool_timeout", "pool_timeout"]


@each_client
async def test_a_refused_connection_is_named_so_with_the_address(transport: str) -> None:
    port = free_port()
    async with sender(f"http://127.0.0.1:{port}/", transport) as s:
        err = await failure(s)
    assert classify(err) == "connect_refused"
    if transport == "aiohttp":
        assert str(port) in str(err)


@each_client
async def test_a_body_framed_by_connection_close_is_read_to_the_end(raw_server, transport: str) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nno length, ")
        await writer.drain()
        writer.write(b"ends at close")
        writer.close()

    async with sender(await raw_server(handler), transport) as s:
        assert await s.send(None, [0.0]) == 200
        assert await s.send(None, [0.0]) == 200


@each_client
async def test_an_idle_connection_closed_by_the_server_is_not_reused(raw_server, transport: str) -> None:  # type: ignore[no-untyped-def]
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

    async with sender(await raw_server(handler), transport) as s:
        assert await s.send(None, [0.0]) == 200
        await closed.wait()
        await asyncio.sleep(0.01)  # one loop pass for the client to read the FIN
        assert await s.send(None, [0.0]) == 200
    assert connections == 2


@each_client
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_request_the_server_drops_is_a_protocol_error_and_never_sent_twice(
    raw_server, transport: str, method: str
) -> None:  # type: ignore[no-untyped-def]
    requests = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            requests += 1
            if requests == 1:  # the first on a connection is answered: the next one goes on a reused connection
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                continue
            writer.close()  # then: read, and dropped without an answer
            return

    async with sender(await raw_server(handler), transport, method=method) as s:
        assert await s.send(None, [0.0]) == 200
        err = await failure(s)
    assert classify(err) == "protocol"
    assert requests == 2  # aiohttp would re-send an idempotent request once; loadgen's client must not


@each_client
async def test_a_response_that_is_not_http_is_a_protocol_error(raw_server, transport: str) -> None:  # type: ignore[no-untyped-def]
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        await writer.drain()

    async with sender(await raw_server(handler), transport) as s:
        assert classify(await failure(s)) == "protocol"


@each_client
async def test_the_request_goes_out_with_the_users_headers_and_its_body_and_the_send_time_is_recorded(  # type: ignore[no-untyped-def]
    raw_server, transport: str
) -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                seen.append(await read_request(reader))
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()

    url = await raw_server(handler)
    loop = asyncio.get_running_loop()
    written = [0.0]
    before = loop.time()
    headers = (("Authorization", "Bearer t"), ("User-Agent", "mine"))
    async with sender(url + "v1/infer?x=1", transport, method="POST", headers=headers,
                      body=parse_template('{"n": ${seq}}')) as s:  # fmt: skip
        assert await s.send(b'{"n": 7}', written) == 202
        assert before < written[0] <= loop.time()
        assert await s.send(None, [0.0]) == 202
    head, _, body = seen[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/infer?x=1 HTTP/1.1"
    fields = {line.lower() for line in lines[1:]}
    assert {f"host: {url[7:-1]}", "user-agent: mine", "authorization: bearer t", "content-type: application/json",
            "content-length: 8", "accept-encoding: identity"} <= fields  # fmt: skip
    assert body == b'{"n": 7}'
    assert b"content-length: 0\r\n" in seen[1].lower()  # a bodyless POST still says so
