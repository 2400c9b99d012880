"""A lean HTTP/1.1 keep-alive transport for httpx.AsyncClient, built on asyncio protocols.

Why: httpx's own transport (httpcore over anyio and h11) tops out near 1,000-1,300 requests/s on one core of
the machines this project runs on (measured against the same local endpoint as loadgen/bench.py), while a load
generator must drive at least 2,000 req/s open loop with room to spare. The httpx client layer itself is cheap
(~10,000 req/s on its own), so loadgen keeps httpx.AsyncClient as its client (headers, timeouts, request and
response objects, error types) and plugs this transport under it. `--transport httpx` selects httpx's stock
transport instead (HTTP proxies, HTTP/2 when `h2` is installed); both raise the same httpx exceptions.

What it does: one request at a time per connection (no pipelining), a pool of up to `max_connections` per
origin opened lazily and reused LIFO (warm connections first), waiters served FIFO, responses framed by
Content-Length, chunked transfer-encoding or connection close, `Connection: close` and HTTP/1.0 honoured,
TLS through the ssl module. Timeouts come from httpx: `pool` (waiting for a connection), `connect`, and `read`
(here: the whole response after the request is written). A stale keep-alive connection that the server closed
while idle is dropped before use.

Send time: when the request carries `extensions["loadgen_sent"]` (a one-item list), the loop time at which the
request was written to the socket is stored in it; the runner turns that into the send lag.
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import ssl
from typing import Any

import httpx

_CRLF2 = b"\r\n\r\n"
_NO_BODY_STATUS = frozenset((204, 304))

_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE = range(4)

Result = tuple[int, list[tuple[bytes, bytes]], bytes, bool, bytes]


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; parses one response at a time into `waiter`."""

    __slots__ = (
        "_body",
        "_buf",
        "_chunk_left",
        "_headers",
        "_is_head",
        "_keep_alive",
        "_mode",
        "_need",
        "_reason",
        "_status",
        "_version",
        "closed",
        "transport",
        "waiter",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Result] | None = None
        self.closed = False
        self._buf = bytearray()
        self._mode = _HEAD
        self._need = 0
        self._chunk_left = -1
        self._body = bytearray()
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._keep_alive = True
        self._is_head = False
        self._version = b"HTTP/1.1"
        self._reason = b""

    # asyncio callbacks ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:
            # Bytes while idle: the server broke the protocol (or sent a late error); never reuse this one.
            self.close()
            return
        self._buf += data
        try:
            self._parse()
        except _ProtocolError as exc:
            self._fail(httpx.RemoteProtocolError(str(exc)))

    def eof_received(self) -> bool:
        if self.waiter is not None and self._mode == _UNTIL_CLOSE:
            self._body += self._buf
            self._buf.clear()
            self._keep_alive = False
            self._finish()
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if self._mode == _UNTIL_CLOSE:
                self._body += self._buf
                self._keep_alive = False
                self._finish()
            else:
                detail = f": {exc}" if exc else ""
                self._fail(httpx.RemoteProtocolError(f"server closed the connection before a full response{detail}"))

    # request/response -------------------------------------------------------------------------------------
    def begin(self, waiter: asyncio.Future[Result], is_head: bool) -> None:
        self.waiter = waiter
        self._mode = _HEAD
        self._is_head = is_head
        self._body = bytearray()
        self._headers = []
        self._chunk_left = -1

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def timed_out(self) -> None:
        self._fail(httpx.ReadTimeout("no full response within the read timeout"))
        self.close()

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        self._keep_alive = False
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _finish(self) -> None:
        waiter, self.waiter = self.waiter, None
        if self._buf:  # bytes beyond the response: we never pipeline, so the stream is out of step
            self._keep_alive = False
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, self._headers, bytes(self._body), self._keep_alive, self._reason))

    def _parse(self) -> None:
        buf = self._buf
        while True:
            if self._mode == _HEAD:
                end = buf.find(_CRLF2)
                if end < 0:
                    if len(buf) > 65536:
                        raise _ProtocolError("response header block over 64 KiB")
                    return
                head = bytes(buf[:end])
                del buf[: end + 4]
                if not self._parse_head(head):
                    continue  # an interim 1xx response; the real one follows
            if self._mode == _LENGTH:
                if len(buf) < self._need:
                    return
                self._body += buf[: self._need]
                del buf[: self._need]
                self._finish()
                return
            if self._mode == _CHUNKED:
                if not self._parse_chunks():
                    return
                self._finish()
                return
            if self._mode == _UNTIL_CLOSE:
                self._body += buf
                buf.clear()
                return

    def _parse_head(self, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise _ProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(parts[1])
        self._version = parts[0]
        self._reason = parts[2] if len(parts) > 2 else b""
        if 100 <= status < 200:
            return False
        self._status = status
        headers: list[tuple[bytes, bytes]] = []
        length = -1
        chunked = False
        keep_alive = self._version == b"HTTP/1.1"
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise _ProtocolError(f"malformed header line {line[:80]!r}")
            name = name.strip()
            value = value.strip()
            headers.append((name, value))
            lower = name.lower()
            if lower == b"content-length":
                if not value.isdigit():
                    raise _ProtocolError(f"bad Content-Length {value[:40]!r}")
                length = int(value)
            elif lower == b"transfer-encoding":
                chunked = value.lower().endswith(b"chunked")
            elif lower == b"connection":
                v = value.lower()
                if b"close" in v:
                    keep_alive = False
                elif b"keep-alive" in v:
                    keep_alive = True
        self._headers = headers
        self._keep_alive = keep_alive
        if self._is_head or status in _NO_BODY_STATUS:
            self._mode, self._need = _LENGTH, 0
        elif chunked:
            self._mode, self._chunk_left = _CHUNKED, -1
        elif length >= 0:
            self._mode, self._need = _LENGTH, length
        else:
            self._mode = _UNTIL_CLOSE
        return True

    def _parse_chunks(self) -> bool:
        """Consume chunks from the buffer; True once the last chunk and trailers are in."""
        buf = self._buf
        while True:
            if self._chunk_left < 0:  # expecting a size line
                nl = buf.find(b"\r\n")
                if nl < 0:
                    return False
                size_text = bytes(buf[:nl]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise _ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
                del buf[: nl + 2]
                if size == 0:
                    self._chunk_left = -2  # trailers until an empty line
                else:
                    self._chunk_left = size
            if self._chunk_left == -2:
                end = buf.find(b"\r\n")
                while end > 0:  # skip trailer lines
                    del buf[: end + 2]
                    end = buf.find(b"\r\n")
                if end < 0:
                    return False
                del buf[:2]
                return True
            if len(buf) < self._chunk_left + 2:
                return False
            self._body += buf[: self._chunk_left]
            del buf[: self._chunk_left + 2]
            self._chunk_left = -1


class _ProtocolError(Exception):
    pass


class _Pool:
    """Connections to one origin: idle ones (LIFO), a count of open ones, waiters (FIFO)."""

    __slots__ = ("addr", "host", "idle", "open", "port", "server_hostname", "ssl", "waiters")

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> None:
        self.host = host
        self.port = port
        self.ssl = ssl_context
        self.server_hostname = host if ssl_context is not None else None
        self.addr: tuple[int, Any] | None = None  # (family, sockaddr) once resolved
        self.idle: list[_Connection] = []
        self.open = 0
        self.waiters: collections.deque[asyncio.Future[_Connection | None]] = collections.deque()


class FastTransport(httpx.AsyncBaseTransport):
    """An httpx transport: HTTP/1.1 with keep-alive over asyncio protocols. See the module docstring."""

    def __init__(self, max_connections: int = 512, verify: bool = True) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.max_connections = max_connections
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._pools: dict[tuple[bytes, str, int], _Pool] = {}
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context()
            if not self._verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl = ctx
        return self._ssl

    def _pool(self, url: httpx.URL) -> _Pool:
        scheme = url.raw_scheme
        host = url.host
        port = url.port or (443 if scheme == b"https" else 80)
        key = (scheme, host, port)
        pool = self._pools.get(key)
        if pool is None:
            if scheme not in (b"http", b"https"):
                raise httpx.UnsupportedProtocol(f"unsupported URL scheme {url.scheme!r}")
            pool = _Pool(host, port, self._ssl_context() if scheme == b"https" else None)
            self._pools[key] = pool
        return pool

    async def _connect(self, pool: _Pool, timeout_s: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                if pool.addr is None:
                    infos = await loop.getaddrinfo(pool.host, pool.port, type=socket.SOCK_STREAM)
                    if not infos:
                        raise OSError(f"no address for {pool.host}")
                    pool.addr = (infos[0][0], infos[0][4])
                family, sockaddr = pool.addr
                sock = socket.socket(family, socket.SOCK_STREAM)
                try:
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    await loop.sock_connect(sock, sockaddr)
                    _, conn = await loop.create_connection(
                        _Connection, sock=sock, ssl=pool.ssl, server_hostname=pool.server_hostname
                    )
                except BaseException:
                    sock.close()
                    raise
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {pool.host}:{pool.port} within {timeout_s:g} s") from None
        except ssl.SSLError as exc:
            raise httpx.ConnectError(f"TLS handshake with {pool.host}:{pool.port} failed: {exc}") from None
        except OSError as exc:
            # asyncio's strerror is "Connect call failed (...)"; the errno says what happened.
            if isinstance(exc, socket.gaierror) or not exc.errno:
                reason = exc.strerror or str(exc)
            else:
                reason = os.strerror(exc.errno)
            raise httpx.ConnectError(f"{pool.host}:{pool.port}: {reason}") from None
        return conn

    async def _acquire(self, pool: _Pool, pool_timeout_s: float | None, connect_timeout_s: float | None) -> _Connection:
        while pool.idle:
            conn = pool.idle.pop()
            if not conn.closed:
                return conn
            pool.open -= 1
        if pool.open >= self.max_connections:
            waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
            pool.waiters.append(waiter)
            try:
                async with asyncio.timeout(pool_timeout_s):
                    handed = await waiter
            except BaseException as exc:
                # A connection (or a free slot) may have been handed over in the same loop pass in which the
                # timeout or a cancellation hit this task: pass it on, or it leaks and the pool shrinks for
                # good (seen in a 10-minute run on a saturated machine: all 512 slots gone after 200 s).
                if waiter.done() and not waiter.cancelled():
                    late = waiter.result()
                    if late is not None:
                        self._release(pool, late, keep_alive=True)
                    else:
                        pool.open -= 1
                        self._wake_one(pool, None)
                else:
                    waiter.cancel()
                if isinstance(exc, TimeoutError):
                    raise httpx.PoolTimeout(
                        f"all {self.max_connections} connections busy for {pool_timeout_s:g} s"
                    ) from None
                raise
            if handed is not None:
                return handed
            # A slot was freed by a closed connection: open a new one in its place (already counted).
        else:
            pool.open += 1
        try:
            return await self._connect(pool, connect_timeout_s)
        except BaseException:
            pool.open -= 1
            self._wake_one(pool, None)
            raise

    def _wake_one(self, pool: _Pool, conn: _Connection | None) -> bool:
        while pool.waiters:
            waiter = pool.waiters.popleft()
            if not waiter.done():
                if conn is None:
                    pool.open += 1  # the waiter opens a connection in the freed slot
                waiter.set_result(conn)
                return True
        return False

    def _release(self, pool: _Pool, conn: _Connection, keep_alive: bool) -> None:
        if keep_alive and not conn.closed and not self._closed:
            if not self._wake_one(pool, conn):
                pool.idle.append(conn)
            return
        conn.close()
        pool.open -= 1
        if pool.open < self.max_connections:
            self._wake_one(pool, None)

    def pool_for(self, url: str | httpx.URL) -> _Pool:
        """The pool of `url`'s origin, for `exchange`."""
        return self._pool(url if isinstance(url, httpx.URL) else httpx.URL(url))

    async def exchange(
        self,
        pool: _Pool,
        payload: bytes,
        *,
        is_head: bool = False,
        pool_timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        sent: list[float] | None = None,
    ) -> Result:
        """Send one complete request (head and body bytes) and return (status, headers, body, keep-alive,
        reason). The lowest level, used directly by loadgen's hot path: no httpx objects per request."""
        if self._closed:
            raise httpx.ConnectError("transport is closed")
        conn = await self._acquire(pool, pool_timeout_s, connect_timeout_s)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Result] = loop.create_future()
        conn.begin(waiter, is_head)
        assert conn.transport is not None
        conn.transport.write(payload)
        if sent is not None:
            sent[0] = loop.time()
        timer = loop.call_later(read_timeout_s, conn.timed_out) if read_timeout_s else None
        try:
            result = await waiter
        except BaseException:
            self._release(pool, conn, keep_alive=False)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self._release(pool, conn, result[3])
        return result

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        pool = self._pool(request.url)
        try:
            content = request.content
        except httpx.RequestNotRead:
            content = await request.aread()
        head = [request.method.encode(), b" ", request.url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        if content:
            head.append(content)
        status, headers, body, _, reason = await self.exchange(
            pool,
            b"".join(head),
            is_head=request.method == "HEAD",
            pool_timeout_s=timeouts.get("pool"),
            connect_timeout_s=timeouts.get("connect"),
            read_timeout_s=timeouts.get("read"),
            sent=request.extensions.get("loadgen_sent"),
        )
        return httpx.Response(
            status,
            headers=headers,
            content=body,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )

    async def aclose(self) -> None:
        self._closed = True
        for pool in self._pools.values():
            for conn in pool.idle:
                conn.close()
            pool.idle.clear()
            while pool.waiters:
                w = pool.waiters.popleft()
                if not w.done():
                    w.set_exception(httpx.ConnectError("transport closed"))
