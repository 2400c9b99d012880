"""The node agent's model-server zygote: signals to a child whose fork it has not reported yet."""

from __future__ import annotations

import asyncio
import signal
import sys

from infer_ctl.sandbox.nodeagent import Zygote


def server_args(cold_start_s: float) -> list[str]:
    """The vLLM stand-in's argv (its load time is the sandbox's hardware, in the env: `server_env`)."""
    del cold_start_s
    return ["vllm", "m", "--host", "127.0.0.1", "--port", "0"]


def server_env(cold_start_s: float) -> dict[str, str]:
    return {"INFER_CTL_SANDBOX_COLD_START_S": str(cold_start_s), "INFER_CTL_SANDBOX_DRAIN_S": "60"}


async def test_a_signal_sent_before_the_fork_is_reported_reaches_the_child_when_it_is() -> None:
    """A Pod deleted while the zygote is still busy (importing, on a loaded machine): the SIGTERM is sent before
    the pid is known. It waits for the pid instead of being dropped, so the loading server stops at once rather
    than at the end of a 60 s grace period."""
    zygote = Zygote(sys.executable)
    await zygote.start()
    try:
        child = await zygote.spawn(server_args(cold_start_s=600), server_env(600), lambda line: None)
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
        child = await zygote.spawn(server_args(cold_start_s=600), server_env(600), lambda line: None)
        assert child.pid is None
        child.signal(signal.SIGKILL)
        child.signal(signal.SIGTERM)
        assert await asyncio.wait_for(asyncio.shield(child.exited), timeout=30) == -signal.SIGKILL
    finally:
        await zygote.stop()
