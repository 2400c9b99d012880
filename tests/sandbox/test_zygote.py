"""The node agent's model-server zygote: signals to a child whose fork it has not reported yet."""

from __future__ import annotations

import asyncio
import signal
import sys

from infer_ctl.sandbox.modelserver import parse_args
from infer_ctl.sandbox.nodeagent import Zygote


def server_args(cold_start_s: float) -> list[str]:
    args = ["--namespace", "default", "--service", "s", "--pod", "p", "--model", "m", "--accelerator", "H100-80GB",
            "--cold-start-s", str(cold_start_s), "--drain-s", "60"]
    parse_args(args)  # the zygote refuses a command line its server would not take
    return args


async def test_a_signal_sent_before_the_fork_is_reported_reaches_the_child_when_it_is() -> None:
    """A Pod deleted while the zygote is still busy (importing, on a loaded machine): the SIGTERM is sent before
    the pid is known. It waits for the pid instead of being dropped, so the loading server stops at once rather
    than at the end of a 60 s grace period."""
    zygote = Zygote(sys.executable)
    await zygote.start()
    try:
        child = await zygote.spawn(server_args(cold_start_s=600), {}, lambda line: None)
        assert child.pid is None  # the zygote has not answered: the reader has not run since the command went out
        child.signal(signal.SIGTERM)
        code = await asyncio.wait_for(asyncio.shield(child.exited), timeout=30)
        assert child.pid is not None
        assert code in (0, -signal.SIGTERM)  # drained (nothing in flight), or ended before its handler was set
    finally:
        await zygote.stop()


async def test_a_kill_sent_before_the_fork_is_not_weakened_by_a_later_term() -> None:
    zygote = Zygote(sys.executable)
    await zygote.start()
    try:
        child = await zygote.spawn(server_args(cold_start_s=600), {}, lambda line: None)
        assert child.pid is None
        child.signal(signal.SIGKILL)
        child.signal(signal.SIGTERM)
        assert await asyncio.wait_for(asyncio.shield(child.exited), timeout=30) == -signal.SIGKILL
    finally:
        await zygote.stop()
