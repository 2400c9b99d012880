"""The model-server stand-ins the node agent runs per Pod: `python -m infer_ctl.sandbox.modelserver vllm|sglang ARGS`.

`vllm ARGS` takes `vllm serve`'s arguments and speaks vLLM's interface, `sglang ARGS` takes
`python -m sglang.launch_server`'s and speaks SGLang's (infer_ctl.sandbox.engines); the simulated device comes from
`INFER_CTL_SANDBOX_*` in the environment (engines.hardware). Like the engines, a stand-in listens only once its
(simulated) load is over; SIGTERM stops accepting connections, lets the requests in flight finish within
`INFER_CTL_SANDBOX_DRAIN_S`, and exits.

`--zygote` is the node agent's fork server: it imports all of this once and forks one child per JSON line
`{"id": ..., "args": [...], "env": {...}}` on stdin; the child replaces its environment with `env` and runs
`main(args)`. Lines on stdout: `<id> PID <pid>`, the child's `<id> LISTENING <host>:<port>`, `<id> EXITED <code>`.
Each Pod is still its own process, but a start costs a fork (milliseconds) instead of an interpreter start (0.2 s of
CPU), which is what lets 100 Pods start within seconds on two cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from infer_ctl.sandbox.engines import sglang, vllm
from infer_ctl.sandbox.engines.hardware import Hardware, hardware_from_env
from infer_ctl.sandbox.engines.http import Answer, HttpServer

ENGINES = ("vllm", "sglang")


class Engine(Protocol):
    hw: Hardware
    emit: Callable[[str], None]

    def watched(self, method: str, path: str) -> bool: ...

    async def route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> Answer: ...

    async def drain(self) -> None: ...


def _print(message: str) -> None:
    print(message, flush=True)


def build(argv: Sequence[str], env: dict[str, str]) -> tuple[Engine, str, int]:
    """The engine for `argv` (`vllm ...` or `sglang ...`), and the host and port it listens on; a bad flag exits
    with argparse's error (status 2), as the engine's CLI does."""
    if not argv or argv[0] not in ENGINES:
        sys.stderr.write(f"usage: python -m infer_ctl.sandbox.modelserver {{{','.join(ENGINES)}}} ARGS | --zygote\n")
        raise SystemExit(2)
    hardware = hardware_from_env(env)
    if argv[0] == "vllm":
        args = vllm.parse_args(argv[1:])
        # vLLM binds every interface when --host is absent; the node agent always gives the Pod's address.
        return vllm.VllmEngine(args, hardware, env), args.host or "0.0.0.0", args.port
    sargs = sglang.parse_args(argv[1:])
    return sglang.SglangEngine(sargs, hardware), sargs.host, sargs.port


async def serve(engine: Engine, host: str, port: int, emit: Callable[[str], None] = _print) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    crashed = getattr(engine, "crashed", None)
    loading = asyncio.ensure_future(asyncio.sleep(engine.hw.cold_start_s))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        loading.cancel()
        return 0
    engine.emit = emit
    server = HttpServer(engine.route, engine.watched)
    bound_host, bound_port = await server.start(host, port)
    emit(f"LISTENING {bound_host}:{bound_port}")
    waiters = {stopping}
    if isinstance(crashed, asyncio.Event):
        waiters.add(asyncio.ensure_future(crashed.wait()))
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    if isinstance(crashed, asyncio.Event) and crashed.is_set():
        return 1  # the engine's scheduler died (SGLang's assertion on a busy memory release): the server with it
    server.stop_accepting()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(engine.drain(), engine.hw.drain_s)
    return 0


def run(argv: Sequence[str], env: dict[str, str], emit: Callable[[str], None] = _print) -> int:
    engine, host, port = build(argv, env)
    return asyncio.run(serve(engine, host, port, emit))


def zygote() -> int:
    """Fork server: one child per command line on stdin; stdin closing stops every child and the zygote."""
    out = sys.stdout
    children: dict[int, str] = {}

    def write(line: str) -> None:
        out.write(line + "\n")
        out.flush()

    def reap(_signum: int = 0, _frame: object = None) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            ident = children.pop(pid, None)
            if ident is not None:
                write(f"{ident} EXITED {os.waitstatus_to_exitcode(status)}")

    signal.signal(signal.SIGCHLD, reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent stops the zygote by closing its stdin
    for line in sys.stdin:
        try:
            command = json.loads(line)
            ident, argv = str(command["id"]), [str(a) for a in command["args"]]
            env = {str(k): str(v) for k, v in dict(command.get("env") or {}).items()}
        except (ValueError, KeyError, TypeError) as e:
            write(f"- ERROR {e!r}")
            continue
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # record the pid before its exit is reaped
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            os.setsid()
            os.close(0)
            os.environ.clear()
            os.environ.update(env)

            def emit(message: str, prefix: str = ident) -> None:
                write(f"{prefix} {message}")

            code = 1
            try:
                code = run(argv, env, emit)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        children[pid] = ident
        write(f"{ident} PID {pid}")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments == ["--zygote"]:
        return zygote()
    return run(arguments, dict(os.environ))


if __name__ == "__main__":
    sys.exit(main())
