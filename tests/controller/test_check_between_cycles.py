"""`check_between_cycles` alone (the operator's burst-check timer calls it with the service's cycle lock): a check
that comes while the service's cycle runs waits for that cycle's end and looks at once; it never reads while the
cycle runs. Time is the event loop's (looptime): no real waiting."""

from __future__ import annotations

import asyncio

import pytest

from infer_ctl.controller.operator import check_between_cycles

CYCLE_S = 4.0  # a cycle that wakes sleepers: seconds


@pytest.mark.looptime
async def test_a_check_during_a_cycle_looks_as_soon_as_the_cycle_ends() -> None:
    loop = asyncio.get_running_loop()
    lock = asyncio.Lock()
    looked: list[tuple[float, bool]] = []  # when the check read, and whether a cycle ran then

    async def cycle() -> None:
        async with lock:
            await asyncio.sleep(CYCLE_S)

    async def check() -> str:
        looked.append((loop.time(), lock.locked()))
        return "a queue beyond what the replicas hold"

    started = loop.time()
    running = asyncio.create_task(cycle())
    await asyncio.sleep(1.0)  # the check's timer fires 1 s into the cycle
    why = await check_between_cycles(lock, check)
    await running
    assert why == "a queue beyond what the replicas hold"
    assert looked == [(started + CYCLE_S, False)], looked


@pytest.mark.looptime
async def test_between_cycles_the_check_looks_at_once() -> None:
    loop = asyncio.get_running_loop()
    looked: list[float] = []

    async def check() -> str:
        looked.append(loop.time())
        return ""

    started = loop.time()
    assert await check_between_cycles(asyncio.Lock(), check) == ""
    assert looked == [started]
