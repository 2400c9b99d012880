"""A free TCP port on 127.0.0.1 for a server whose port must be named before it starts (a kubeconfig's server, a
component's flag, a metrics port a test scrapes).

The usual trick, bind port 0 and close, hands out a port of the kernel's ephemeral range
(`/proc/sys/net/ipv4/ip_local_port_range`), which is also where every outgoing connection on the machine takes its
local port: on a busy machine (the test workers' thousands of HTTP requests) a connection can take it before the
server binds it, and the server fails with EADDRINUSE. A port below that range is taken only by a server that asks
for it by number, so the port is drawn at random there and checked free by binding it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # below: the well-known ports and the fixed ones local services commonly take (9090, 8080)
_TRIES = 200


def ephemeral_range(text: str | None = None) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default when it cannot be read)."""
    try:
        low, high = (int(v) for v in (text if text is not None else _RANGE_FILE.read_text()).split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port no socket on `host` holds now, below the ephemeral range when the range leaves room for it."""
    low, _ = ephemeral_range()
    if low - _LOWEST >= 1000:
        for _ in range(_TRIES):
            port = random.randrange(_LOWEST, low)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # the range leaves no room (or all tried are taken): the kernel's choice
        s.bind((host, 0))
        return int(s.getsockname()[1])
