"""Pod addresses: each Pod of the sandbox gets a loopback address of its own, as each Pod of a cluster gets an IP.

Linux routes all of 127.0.0.0/8 to the loopback interface, so a process can bind 127.1.0.7:8000 while another binds
127.1.0.8:8000, with no privileges and no set-up: two replicas on one node both listen on their container port, and
the controller, the front door and Prometheus address a replica as `<podIP>:<containerPort>`, as in a cluster.
(Network namespaces would isolate better but need root and a bridge to reach them; the loopback range needs neither.)

An agent holds one block 127.<b>.0.0/16 (b in 1..254; never 127.0.x.x, where 127.0.0.1 lives) for its lifetime,
claimed with an exclusive lock on a file, so the agents of several sandboxes on one machine (parallel test
processes) never hand out the same address. Within its block an address is never given to a second Pod while a
Pod holds it, and a freed one goes to the back of the line, so a late packet to a deleted Pod's address does not
reach its successor at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import random
import tempfile
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


class AddressesExhausted(RuntimeError):
    pass


def _lock_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"infer-ctl-podnet-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _claim_block(rng: random.Random) -> tuple[int, IO[bytes]]:
    """A free second octet, with its lock file held open (the lock goes with the process)."""
    blocks = list(range(1, 255))
    rng.shuffle(blocks)
    directory = _lock_dir()
    for block in blocks:
        handle = (directory / f"127.{block}.lock").open("ab")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        return block, handle
    raise AddressesExhausted("every loopback block 127.1-254.0.0/16 is held by another node agent")


@dataclass
class PodAddresses:
    """Allocates and frees Pod IPs in the agent's block (by Pod uid)."""

    rng: random.Random = field(default_factory=random.Random)
    block: int = 0
    held: dict[str, str] = field(default_factory=dict)  # pod uid -> address
    _free: deque[int] = field(default_factory=deque)
    _lock: IO[bytes] | None = None

    def _ensure_block(self) -> None:
        if self._lock is None:
            self.block, self._lock = _claim_block(self.rng)
            # host parts 0.1 .. 255.254 (x.0 and x.255 are avoided: they read as network/broadcast addresses)
            self._free = deque(high * 256 + low for high in range(256) for low in range(1, 255))

    def allocate(self, uid: str) -> str:
        if uid in self.held:
            return self.held[uid]
        self._ensure_block()
        if not self._free:
            raise AddressesExhausted(f"the {len(self.held)} addresses of 127.{self.block}.0.0/16 are all held")
        host = self._free.popleft()
        address = str(ipaddress.IPv4Address(f"127.{self.block}.0.0") + host)
        self.held[uid] = address
        return address

    def release(self, uid: str) -> None:
        address = self.held.pop(uid, None)
        if address is not None:
            self._free.append(int(ipaddress.IPv4Address(address)) - int(ipaddress.IPv4Address(f"127.{self.block}.0.0")))

    def close(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                self._lock.close()
            self._lock = None


def serving_port(pod: Mapping[str, Any]) -> int | None:
    """The port a replica serves on: its (first) container's port named `http`, else its first declared port (what
    an InferencePool's targetPort or a PodMonitor's port names); None when it declares none."""
    ports = [p for c in (pod.get("spec") or {}).get("containers") or () for p in c.get("ports") or ()]
    named = next((p for p in ports if p.get("name") == "http"), None)
    chosen = named or (ports[0] if ports else None)
    return int(chosen["containerPort"]) if chosen and chosen.get("containerPort") else None


def pod_endpoint(pod: Mapping[str, Any]) -> str | None:
    """`<podIP>:<port>` of a Pod that has an address and a serving port, as a cluster's endpoints list it."""
    ip = (pod.get("status") or {}).get("podIP")
    port = serving_port(pod)
    return f"{ip}:{port}" if ip and port else None
