"""The ports the sandbox names before a server binds them, and the wait for a component started on a LoopThread."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from infer_ctl.sandbox import ports
from infer_ctl.sandbox.ports import ephemeral_range, free_port
from infer_ctl.sandbox.threaded import LoopThread, wait_started


def test_the_ephemeral_range_is_read_from_the_kernel_and_defaults_to_linux_s() -> None:
    assert ephemeral_range("32768\t60999\n") == (32768, 60999)
    assert ephemeral_range("40000 50000") == (40000, 50000)
    assert ephemeral_range("garbage") == (32768, 60999)


def test_a_free_port_is_below_the_ephemeral_range_where_outgoing_connections_take_theirs() -> None:
    low, _ = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert 10_000 <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: nothing holds it


def test_a_port_another_socket_holds_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        other = free_port()
        draws: Iterator[int] = iter([taken, taken, other])
        monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(draws))
        assert free_port() == other


def test_with_no_room_below_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (10_500, 60999))
    port = free_port()
    assert port > 0 and not 10_000 <= port < 10_500


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread("test")
    yield thread
    thread.stop()


def test_a_component_that_fails_before_it_is_ready_raises_its_own_error_at_once(loop: LoopThread) -> None:
    async def fails() -> None:
        await asyncio.sleep(0.05)
        raise OSError(98, "Address already in use")

    ready = threading.Event()
    start = time.monotonic()
    with pytest.raises(OSError, match="Address already in use"):
        wait_started(ready, asyncio.run_coroutine_threadsafe(fails(), loop.loop), "kopf", timeout_s=30)
    assert time.monotonic() - start < 10


def test_a_component_that_ends_or_hangs_before_it_is_ready_is_named(loop: LoopThread) -> None:
    async def ends() -> None:
        return None

    with pytest.raises(RuntimeError, match="kopf ended before it was ready"):
        wait_started(threading.Event(), asyncio.run_coroutine_threadsafe(ends(), loop.loop), "kopf")
    hangs = asyncio.run_coroutine_threadsafe(asyncio.sleep(30), loop.loop)
    with pytest.raises(TimeoutError, match=r"kopf was not ready within 0\.3 s"):
        wait_started(threading.Event(), hangs, "kopf", timeout_s=0.3)
    hangs.cancel()


def test_a_ready_component_is_waited_for_no_longer(loop: LoopThread) -> None:
    ready = threading.Event()

    async def starts() -> None:
        await asyncio.sleep(0.05)
        ready.set()
        await asyncio.sleep(30)

    running = asyncio.run_coroutine_threadsafe(starts(), loop.loop)
    wait_started(ready, running, "kopf")
    assert not running.done()
    running.cancel()
