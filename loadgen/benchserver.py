"""A minimal, fast HTTP/1.1 endpoint for benchmarks: `python -m loadgen.benchserver --port N`.

It answers every request with `200 ok` (2 bytes), keeps connections alive, reads Content-Length bodies and
handles pipelined requests, all in one asyncio protocol with no framework, so that on one core it is several
times faster than the client under test and the benchmark measures the client. It prints `ready PORT` on
stdout once listening. Not a general server: no chunked request bodies, no TLS.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Endpoint(asyncio.Protocol):
    __slots__ = ("buf", "transport")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            length = 0
            lower = bytes(buf[:end]).lower()
            at = lower.find(b"\r\ncontent-length:")
            if at >= 0:
                line_end = lower.find(b"\r\n", at + 2)
                value = lower[at + 17 : line_end if line_end >= 0 else end].strip()
                if not value.isdigit():
                    assert self.transport is not None
                    self.transport.write(BAD_REQUEST)
                    self.transport.close()
                    return
                length = int(value)
            if len(buf) < end + 4 + length:
                break
            del buf[: end + 4 + length]
            out.append(RESPONSE)
        if out:
            assert self.transport is not None
            self.transport.write(b"".join(out))


async def serve(port: int, host: str = "127.0.0.1") -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Endpoint, host, port, backlog=1024)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"ready {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadgen.benchserver", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free port)")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
