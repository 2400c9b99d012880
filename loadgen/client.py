"""The HTTP client under the open loop: aiohttp's client (default) or httpx's own transport, configured on purpose.

Which one, and why (see loadgen/README.md for the benchmark): aiohttp's client (C-accelerated HTTP parser, its
own keep-alive pool) sustains several times httpx's stock transport (httpcore over anyio and h11) on one core;
httpx stays selectable (`--transport httpx`) for HTTP/2 and because the fake-clock tests drive the runner through
httpx.MockTransport.

aiohttp's session, as configured here:
* timeouts: `total` = --timeout (pool wait, connect, request and the whole response), `sock_connect` =
  --connect-timeout (the TCP/TLS connect of a new connection). No other read timeout.
* connections: at most --connections to the target (TCPConnector(limit=...)), opened on demand, kept alive;
  requests beyond the limit wait in aiohttp's FIFO queue, and a request that times out while still waiting
  there is a `pool_timeout`.
* no retries: aiohttp re-sends an idempotent request once when a pooled connection fails (RFC 9112 9.3.1) and
  offers no switch for it; a client middleware (public API since aiohttp 3.12) turns those failures into an
  exception type the session does not retry, so every request reaches the server at most once.
* no redirects followed, no cookies kept, no proxy from the environment, no decompression (we ask for
  `identity`); bodies, chunked or not (SSE included), are read to the end through aiohttp's own parser.
* send time: the `on_request_headers_sent` trace signal stores the loop time the request head was written.

Every failure is classified into the kinds the reports have always used (`classify`).
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import httpx

from loadgen.body import BodyTemplate

USER_AGENT = "loadgen/0.1 (infer-ctl)"
TRANSPORTS = ("aiohttp", "httpx")


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
    transport: str = "aiohttp"  # one of TRANSPORTS
    verify_tls: bool = True
    http2: bool = False


class PoolTimeout(TimeoutError):
    """The request's time ran out while it waited for a free connection (all --connections busy)."""


class _NotRetried(aiohttp.ClientConnectionError):
    """Carries a failure aiohttp would retry past its retry loop (see the module docstring)."""

    def __init__(self, original: aiohttp.ClientError) -> None:
        super().__init__(str(original))
        self.original = original


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
    Failures raise (aiohttp's or httpx's exception types, or PoolTimeout); `classify` names them."""

    async def send(self, body: bytes | None, written: list[float]) -> int: ...

    async def aclose(self) -> None: ...


class _Attempt:
    """Per request, for the trace callbacks: where the write time goes, and whether it waits for the pool."""

    __slots__ = ("queued", "written")

    def __init__(self, written: list[float]) -> None:
        self.written = written
        self.queued = False


async def _no_retry(req: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
    try:
        return await handler(req)
    except aiohttp.ClientConnectorError:
        raise  # connect failures: aiohttp never retries these
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
        raise _NotRetried(exc) from exc


def _tracing(loop: asyncio.AbstractEventLoop) -> aiohttp.TraceConfig:
    async def headers_sent(_s: aiohttp.ClientSession, ctx: Any, _p: aiohttp.TraceRequestHeadersSentParams) -> None:
        ctx.trace_request_ctx.written[0] = loop.time()

    async def queued(_s: aiohttp.ClientSession, ctx: Any, _p: aiohttp.TraceConnectionQueuedStartParams) -> None:
        ctx.trace_request_ctx.queued = True

    async def dequeued(_s: aiohttp.ClientSession, ctx: Any, _p: aiohttp.TraceConnectionQueuedEndParams) -> None:
        ctx.trace_request_ctx.queued = False

    trace = aiohttp.TraceConfig()
    trace.on_request_headers_sent.append(headers_sent)
    trace.on_connection_queued_start.append(queued)
    trace.on_connection_queued_end.append(dequeued)
    return trace


class AiohttpSender:
    """aiohttp.ClientSession.request per request, the body read to its end. Create inside the running loop."""

    def __init__(self, cfg: ClientConfig) -> None:
        connector = aiohttp.TCPConnector(limit=cfg.connections, limit_per_host=0, ssl=cfg.verify_tls)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=cfg.timeout_s, sock_connect=cfg.connect_timeout_s),
            headers=request_headers(cfg),
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=False,
            raise_for_status=False,
            middlewares=(_no_retry,),
            trace_configs=[_tracing(asyncio.get_running_loop())],
        )
        self._method = cfg.method
        self._url = cfg.url  # aiohttp parses it per request through yarl's cache (~0.1 us)
        self._connections = cfg.connections

    async def send(self, body: bytes | None, written: list[float]) -> int:
        attempt = _Attempt(written)
        try:
            async with self._session.request(
                self._method, self._url, data=body, allow_redirects=False, trace_request_ctx=attempt
            ) as response:
                await response.read()
                return response.status
        except _NotRetried as exc:
            raise exc.original from None
        except TimeoutError:
            if attempt.queued:
                raise PoolTimeout(f"no connection free within the timeout (all {self._connections} busy)") from None
            raise

    async def aclose(self) -> None:
        await self._session.close()


class HttpxSender:
    """httpx.AsyncClient.request per request; `client` defaults to make_httpx_client(cfg)."""

    def __init__(self, cfg: ClientConfig, client: httpx.AsyncClient | None = None) -> None:
        self._client = client if client is not None else make_httpx_client(cfg)
        self._method = cfg.method
        self._url = httpx.URL(cfg.url)
        self._trace = client is None

    async def send(self, body: bytes | None, written: list[float]) -> int:
        if self._trace:
            extensions: dict[str, Any] = {"trace": _httpx_tracer(asyncio.get_running_loop(), written)}
        else:  # a caller-made client (tests: httpx.MockTransport) stores the write time itself
            extensions = {"loadgen_sent": written}
        response = await self._client.request(self._method, self._url, content=body, extensions=extensions)
        return response.status_code

    async def aclose(self) -> None:
        await self._client.aclose()


def make_httpx_client(cfg: ClientConfig) -> httpx.AsyncClient:
    """httpx.AsyncClient on its own transport (httpcore): explicit timeouts and limits, no retries, no env."""
    timeout = httpx.Timeout(cfg.timeout_s, connect=cfg.connect_timeout_s)
    limits = httpx.Limits(max_connections=cfg.connections, max_keepalive_connections=cfg.connections)
    transport = httpx.AsyncHTTPTransport(
        verify=cfg.verify_tls, http2=cfg.http2, limits=limits, trust_env=False, retries=0
    )
    return httpx.AsyncClient(
        headers=request_headers(cfg), timeout=timeout, transport=transport, trust_env=False, follow_redirects=False
    )


def make_sender(cfg: ClientConfig) -> Sender:
    if cfg.transport == "httpx":
        return HttpxSender(cfg)
    return AiohttpSender(cfg)


def _httpx_tracer(loop: asyncio.AbstractEventLoop, box: list[float]) -> Callable[[str, dict[str, Any]], Any]:
    """httpcore's trace hook: the time the request headers start going out."""

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event in ("http11.send_request_headers.started", "http2.send_request_headers.started"):
            box[0] = loop.time()

    return trace


def classify(exc: BaseException) -> str:
    """A short, stable error kind for the summary and metrics, the same for both clients."""
    if isinstance(exc, PoolTimeout):
        return "pool_timeout"
    if isinstance(exc, httpx.HTTPError):
        return _classify_httpx(exc)
    if isinstance(exc, aiohttp.ClientError | TimeoutError):
        return _classify_aiohttp(exc)
    return "client_" + type(exc).__name__.lower()


def _connect_kind(text: str) -> str:
    lowered = text.lower()
    if "refused" in lowered or f"[errno {errno.ECONNREFUSED}]" in lowered:
        return "connect_refused"
    if "name or service" in lowered or "nodename" in lowered or "no address" in lowered:
        return "dns"
    if "tls" in lowered or "ssl" in lowered or "certificate" in lowered:
        return "tls"
    return "connect"


def _refused(exc: BaseException) -> bool:
    """Whether a ConnectionRefusedError is among the causes (httpcore's message says only "All connection
    attempts failed")."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _classify_httpx(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect_timeout"
    if isinstance(exc, httpx.PoolTimeout):
        return "pool_timeout"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect_refused" if _refused(exc) else _connect_kind(str(exc))
    if isinstance(exc, httpx.RemoteProtocolError):
        return "protocol"
    if isinstance(exc, httpx.ReadError | httpx.WriteError):
        return "disconnect"
    return type(exc).__name__.lower()


def _classify_aiohttp(exc: aiohttp.ClientError | TimeoutError) -> str:
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect_timeout"
    if isinstance(exc, TimeoutError):  # the total timeout, or SocketTimeoutError
        return "timeout"
    if isinstance(exc, aiohttp.ClientSSLError | aiohttp.ClientConnectorCertificateError):
        return "tls"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "dns"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if exc.os_error.errno == errno.ECONNREFUSED:
            return "connect_refused"
        return _connect_kind(str(exc))
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        return "protocol"  # closed before a full response, a broken body, or not HTTP
    if isinstance(exc, aiohttp.ClientOSError):
        return "disconnect"
    return type(exc).__name__.lower()
