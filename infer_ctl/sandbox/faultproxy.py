"""A counting, fault-injecting HTTP proxy in front of a Kubernetes API server (the emulator or kube-apiserver).

The client under test (the controller, kopf) is given a kubeconfig that points at the proxy (plain HTTP on
127.0.0.1; its credentials, a bearer token or none, are passed through). The proxy forwards every request to the
API server (TLS verified with the API server's CA) and streams the answer back, watches included, except where a
`Fault` matches: then it answers with an error in the API server's own form (a `Status` object with the code and
reason kube-apiserver uses), after an optional delay, or delays the real answer, or cuts a watch after its
first events. Every request is counted by (verb, resource) as the API server's audit log would name it, and every
injected fault is counted on its rule, so a test can wait for "the fault happened" before it checks the outcome.

    proxy = FaultProxy.for_kubeconfig(controller_kubeconfig)
    proxy.add(Fault("PATCH", r"/inferenceservices/llm/status$", status=409, times=1))
    with proxy.running():
        proxy.write_kubeconfig(path)     # what the controller runs with
        ...
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import re
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from infer_ctl.sandbox.threaded import LoopThread

# kube-apiserver's reason for each status it answers with (metav1.StatusReason)
REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
           410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
           504: "Timeout"}
# headers that belong to one hop, never forwarded (RFC 9110 7.6.1), and those aiohttp sets itself
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade", "host", "content-length", "content-encoding"}
_VERB_PATH = re.compile(r"^/(?:api/v1|apis/[^/]+/[^/]+)(?:/namespaces/[^/]+)?/([^/?]+)(?:/([^/?]+))?(?:/([^/?]+))?")


@dataclass
class Fault:
    """A rule: requests with `method` (None: any) whose path (with the query) matches `path` (a regex, searched)
    are answered with `status` (a Kubernetes Status error) after `delay_s`, or, with `status` None, forwarded after
    `delay_s`. `watch`: only watch requests (True), only the others (False), or both (None). `times`: how many
    matching requests are faulted (None: every one); `probability`: the chance that a matching one is."""

    method: str | None
    path: str
    status: int | None = None
    delay_s: float = 0.0
    watch: bool | None = None
    times: int | None = 1
    probability: float = 1.0
    injected: int = 0
    _pattern: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._pattern = re.compile(self.path)

    def matches(self, method: str, path_qs: str, is_watch: bool, rng: random.Random) -> bool:
        if self.times is not None and self.injected >= self.times:
            return False
        if self.method is not None and self.method != method:
            return False
        if self.watch is not None and self.watch != is_watch:
            return False
        if not self._pattern.search(path_qs):
            return False
        return self.probability >= 1.0 or rng.random() < self.probability


def verb_and_resource(method: str, path: str, is_watch: bool) -> tuple[str, str]:
    """The audit log's verb and resource ("pods", "inferenceservices/status") of a request."""
    m = _VERB_PATH.match(path)
    if not m:
        return method.lower(), path
    resource, name, sub = m.group(1), m.group(2), m.group(3)
    full = f"{resource}/{sub}" if sub else resource
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
    if verb is None:
        verb = "watch" if is_watch else ("get" if name else "list")
    return verb, full


def status_body(code: int, message: str) -> dict[str, Any]:
    reason = REASONS.get(code, "InternalError")
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FaultProxy:
    """The proxy; `running()` serves it on 127.0.0.1 from a thread of its own."""

    def __init__(self, upstream: str, *, ca_file: str | None = None, ca_pem: str | None = None,
                 seed: int = 0) -> None:
        self.upstream = upstream.rstrip("/")
        self.ca_file, self.ca_pem = ca_file, ca_pem
        self.faults: list[Fault] = []
        self.requests: Counter[tuple[str, str]] = Counter()
        self.token: str | None = None
        self.port = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._session: aiohttp.ClientSession | None = None
        # response bodies being copied (watches last minutes) -> the handler that waits for each
        self._pumps: dict[asyncio.Task[None], asyncio.Task[Any]] = {}

    @classmethod
    def for_kubeconfig(cls, kubeconfig: Path, *, seed: int = 0) -> FaultProxy:
        """In front of the API server of `kubeconfig`'s current context, with its token passed through."""
        config = yaml.safe_load(kubeconfig.read_text())
        context_name = config.get("current-context")
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        users = config.get("users") or ()
        user: dict[str, Any] = next((u["user"] for u in users if u["name"] == context.get("user")), {})
        if user.get("client-certificate") or user.get("client-certificate-data"):
            raise ValueError(f"{kubeconfig}: the fault proxy passes a bearer token through, not a client "
                             "certificate; give it a kubeconfig with a token (or none)")
        data = cluster.get("certificate-authority-data")
        proxy = cls(cluster["server"], ca_file=cluster.get("certificate-authority"),
                    ca_pem=base64.b64decode(data).decode() if data else None, seed=seed)
        proxy.token = user.get("token")
        return proxy

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def write_kubeconfig(self, path: Path) -> Path:
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "proxy", "user": user}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
        }))
        return path

    def _match(self, method: str, path_qs: str, is_watch: bool) -> Fault | None:
        with self._lock:
            verb, resource = verb_and_resource(method, path_qs.partition("?")[0], is_watch)
            self.requests[(verb, resource)] += 1
            for fault in self.faults:
                if fault.matches(method, path_qs, is_watch, self._rng):
                    fault.injected += 1
                    return fault
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path_qs = request.rel_url.raw_path_qs
        is_watch = request.query.get("watch") in ("true", "1")
        fault = self._match(request.method, path_qs, is_watch)
        if fault is not None:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.status is not None:
                return web.json_response(status_body(fault.status, f"injected by the fault proxy: {fault.path}"),
                                         status=fault.status)
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        try:
            body = await request.read()
        except ConnectionResetError:  # the client went while sending (e.g. a controller killed mid-write)
            return web.Response(status=499, text="client closed the request")
        async with self._session.request(request.method, self.upstream + path_qs, headers=headers,
                                         data=body or None, allow_redirects=False) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP})
            await response.prepare(request)
            # The body is copied by a task of its own, which stop() cancels (a watch lasts minutes): the handler
            # then ends its response and returns, so that the runner's cleanup finds no handler to cancel.
            # (aiohttp 3.14 logs InvalidStateError tracebacks for a handler it cancels at shutdown.)
            pump = asyncio.create_task(self._pump(upstream, response))
            handler = asyncio.current_task()
            assert handler is not None
            self._pumps[pump] = handler
            try:
                await pump
            except asyncio.CancelledError:
                if handler.cancelling():
                    raise  # this handler is cancelled, not only its pump
            finally:
                del self._pumps[pump]
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
            return response

    @staticmethod
    async def _pump(upstream: aiohttp.ClientResponse, response: web.StreamResponse) -> None:
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)

    @contextlib.contextmanager
    def running(self) -> Iterator[FaultProxy]:
        thread = LoopThread("fault-proxy")
        runner: web.AppRunner | None = None

        async def start() -> None:
            nonlocal runner
            context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_pem) \
                if self.ca_file or self.ca_pem else None
            # no total timeout: watches last minutes; the client under test has its own timeouts
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=context if context is not None else True, limit=0),
                timeout=aiohttp.ClientTimeout(total=None, connect=5), auto_decompress=False)
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handle)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
            await web.SockSite(runner, sock).start()

        async def stop() -> None:
            try:
                handlers = set(self._pumps.values())
                for pump in list(self._pumps):  # their handlers then return (see _handle)
                    pump.cancel()
                if handlers:
                    await asyncio.wait(handlers, timeout=5)
                if runner is not None:
                    await runner.cleanup()
            finally:
                if self._session is not None:
                    await self._session.close()

        try:
            thread.call(start)
            yield self
        finally:
            with contextlib.suppress(Exception):
                thread.call(stop, timeout_s=10)
            thread.stop()
