"""`python -m loadgen` (also `infer-ctl loadgen`): the command line of the open-loop load generator."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from loadgen.body import DEFAULT_TRACE_BODY, BodyTemplate, TemplateError, parse_template
from loadgen.durations import parse_duration_s
from loadgen.schedule import ArrivalChunk, Arrivals, RateCurve, curve_arrivals, limit_chunks
from loadgen.shapes import ShapeError, parse_shape
from loadgen.traces import (
    CountTrace,
    RequestTrace,
    TraceError,
    count_trace_curve,
    load_trace,
    request_trace_chunks,
)

if TYPE_CHECKING:  # the client imports aiohttp and httpx; `--help` and input errors do not need them
    from loadgen.client import ClientConfig
    from loadgen.runner import Runner, RunOutcome

EXIT_OK = 0
EXIT_ERROR_RATIO = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130

EPILOG = """\
shapes (--shape):
  100                          100 req/s for --duration
  50@60s,500@120s,2@60s        steps
  10..500@2m                   a linear ramp; steps and ramps mix: 10@30s,10..400@1m,400@5m
  sine:mean=100,amplitude=80,period=10m,duration=1h[,phase=2m]
                               diurnal: mean + amplitude * sin(2 pi (t + phase) / period)
  bursts:base=20,burst=400,on=5s,off=55s,duration=10m
                               Markov-modulated bursts with exponential lengths (mean on) and gaps (mean off)
  Durations: 90, 90s, 1.5m, 1h30m, 250ms.

traces (--trace):
  Azure LLM inference CSV (TIMESTAMP,ContextTokens,GeneratedTokens): every request at its own time, with its
  token counts in the body (default body {"prompt_tokens": N, "max_tokens": M}, POST).
  Count CSV (a timestamp column and a count column per fixed bucket, e.g. DateTime,Calls): each bucket is a
  constant rate of count / bucket seconds.
  --compress 60 plays a trace minute per second; --rate-scale 2 doubles the rate at the same speed.

body templates (--body): ${context_tokens}, ${generated_tokens}, ${seq}; $$ is a literal $. @FILE reads a file.

what is measured:
  Open loop: each request is sent at its scheduled time whether or not earlier ones were answered. Latency is
  measured from the scheduled time (so a slow server shows as latency, not as a lower rate); send lag is the
  actual minus the scheduled send time. Percentiles come from a log-linear histogram (relative error <= 0.1 %).
  --json keys: target_rps achieved_rps sent ok errors p50_ms p95_ms p99_ms max_send_lag_ms_p99 (the worst
  per-second p99 of send lag), then details: send_lag_ms_p99 (run-wide), errors_by_kind, statuses, ...

exit status:
  0  the run completed and the error ratio was at most --max-error-ratio
  1  the run completed with more errors than --max-error-ratio allows
  2  bad usage or input: options, shape, trace file, body template (the message names the token or line)
  3  no request got any HTTP response (e.g. connection refused); a summary of what was tried is printed
  130 interrupted (Ctrl-C / SIGTERM): scheduling stopped, the summary covers what was sent
"""


class UsageError(Exception):
    pass


def _duration_arg(text: str) -> float:
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number > 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be in [0, 1]")
    return value


def _phases_arg(text: str) -> tuple[tuple[str, float], ...]:
    """`[NAME=]START,...`: phases by their start (a duration, increasing); unnamed ones are named by their start."""
    out: list[tuple[str, float]] = []
    for token in (t.strip() for t in text.split(",")):
        name, _, when = token.rpartition("=")
        try:
            start = parse_duration_s(when)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"phase {token!r}: {exc}") from None
        if out and start <= out[-1][1]:
            raise argparse.ArgumentTypeError(
                f"phase {token!r}: starts at {start:g} s, not after the previous phase ({out[-1][1]:g} s)"
            )
        out.append((name.strip() or f"from {start:g}s", start))
    return tuple(out)


def build_parser(prog: str = "loadgen") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Open-loop HTTP load generator: traffic shapes, trace replay, latency without "
        "coordinated omission.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url", help="target URL, http:// or https://, e.g. http://127.0.0.1:8080/v1/infer")

    traffic = p.add_argument_group("traffic (one of --shape or --trace)")
    src = traffic.add_mutually_exclusive_group(required=True)
    src.add_argument("--shape", metavar="SPEC", help="traffic shape (see below)")
    src.add_argument("--trace", metavar="CSV", help="replay a trace file (see below)")
    traffic.add_argument(
        "--duration",
        type=_duration_arg,
        metavar="D",
        help="run length: required with a bare rate; cuts longer shapes and traces short",
    )
    traffic.add_argument(
        "--arrivals",
        choices=[a.value for a in Arrivals],
        help="request spacing: evenly by the rate curve, or a Poisson process "
        "(default: deterministic; poisson for bursts)",
    )
    traffic.add_argument(
        "--seed", type=int, help="seed for Poisson arrivals, bursts and trace thinning (default: random, printed)"
    )
    traffic.add_argument(
        "--compress", type=_positive_float, default=1.0, metavar="F", help="trace time compression (default 1)"
    )
    traffic.add_argument(
        "--rate-scale", type=_positive_float, default=1.0, metavar="F", help="trace rate multiplier (default 1)"
    )
    traffic.add_argument(
        "--trace-skip", type=_duration_arg, default=0.0, metavar="D", help="start this far into the trace (trace time)"
    )
    traffic.add_argument(
        "--count-column", metavar="NAME", help="count column of a count trace (default: the only non-time column)"
    )
    traffic.add_argument(
        "--bucket",
        type=_duration_arg,
        metavar="D",
        help="bucket width of a count trace (default: the most common spacing)",
    )
    traffic.add_argument(
        "--gaps", choices=("zero", "skip"), default="zero", help="missing buckets of a count trace: rate 0, or left out"
    )

    req = p.add_argument_group("requests")
    req.add_argument("-X", "--method", help="HTTP method (default: POST with a body, else GET)")
    req.add_argument(
        "-H", "--header", action="append", default=[], metavar="'NAME: VALUE'", help="extra header (repeatable)"
    )
    req.add_argument(
        "--body", metavar="TEMPLATE|@FILE", help="request body template (JSON; content-type application/json)"
    )
    req.add_argument(
        "--tokens",
        default="512,128",
        metavar="CTX,GEN",
        help="token counts for ${context_tokens} and ${generated_tokens} when not replaying a trace (default 512,128)",
    )
    req.add_argument(
        "--timeout",
        type=_duration_arg,
        default=30.0,
        metavar="D",
        help="per-request timeout: waiting for a connection, and for the response (default 30s)",
    )
    req.add_argument(
        "--connect-timeout", type=_duration_arg, default=5.0, metavar="D", help="TCP/TLS connect timeout (default 5s)"
    )
    req.add_argument(
        "--connections",
        type=_positive_int,
        default=512,
        metavar="N",
        help="connection pool size, opened on demand, kept alive (default 512)",
    )
    req.add_argument(
        "--max-in-flight",
        type=_positive_int,
        metavar="N",
        help="cap on requests in flight; due requests queue and their wait counts as latency; reported when it binds",
    )
    req.add_argument(
        "--transport",
        choices=("aiohttp", "httpx"),
        default="aiohttp",
        help="the HTTP client: aiohttp (default; HTTP/1.1, the fastest per core) or httpx (its own transport, "
        "httpcore: --http2; about a third of aiohttp's rate per core)",
    )
    req.add_argument("--http2", action="store_true", help="HTTP/2 (with --transport httpx; needs the h2 package)")
    req.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")

    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    out.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="live one-line progress on stderr (default: when stderr is a terminal)",
    )
    out.add_argument("--timeline", metavar="FILE", help="per-second timeline, CSV (or JSON for *.json)")
    out.add_argument(
        "--phases",
        type=_phases_arg,
        metavar="[NAME=]START,...",
        help="also summarize the run in phases starting at these scheduled times, e.g. "
        "'steady=0,step=60s,drop=3m' (a phase lasts until the next starts)",
    )
    out.add_argument("--plot", metavar="PNG", help="plot rate and latency over time to a PNG file")
    out.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on 127.0.0.1:PORT (0: any free port, printed)",
    )
    out.add_argument(
        "--max-error-ratio",
        type=_ratio,
        default=0.01,
        metavar="R",
        help="exit 1 when errors / sent exceeds this (default 0.01)",
    )
    return p


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """What will be sent: the arrivals and the figures the summary compares them with."""

    chunks: Iterator[ArrivalChunk]
    expected_requests: float
    duration_s: float
    description: str
    arrivals: str
    target_of: Callable[[int], float] | None
    rate_now: Callable[[float], float] | None
    is_trace_with_tokens: bool


def _plan_curve(
    curve: RateCurve, arrivals: Arrivals, rng: np.random.Generator, limit_s: float | None, desc: str
) -> Plan:
    duration = curve.duration_s if limit_s is None else min(limit_s, curve.duration_s)
    chunks = curve_arrivals(curve, arrivals, rng)
    if duration < curve.duration_s:
        chunks = limit_chunks(chunks, duration)
    return Plan(
        chunks,
        curve.expected_until(duration),
        duration,
        desc,
        arrivals.value,
        curve.expected_in_second,
        curve.rate_at,
        False,
    )


def build_plan(args: argparse.Namespace, rng: np.random.Generator) -> Plan:
    if args.shape is not None:
        shape = parse_shape(args.shape, args.duration)
        arrivals = Arrivals(args.arrivals) if args.arrivals else shape.default_arrivals
        limit = args.duration if "@" in args.shape or ":" in args.shape else None
        return _plan_curve(shape.curve(rng), arrivals, rng, limit, shape.describe())
    trace = load_trace(args.trace, count_column=args.count_column, bucket_s=args.bucket)
    desc = f"trace {Path(trace.path).name} compress {args.compress:g} rate-scale {args.rate_scale:g}"
    if args.trace_skip:
        desc += f" skip {args.trace_skip:g}s"
    if isinstance(trace, CountTrace):
        if args.trace_skip >= trace.span_s:
            raise UsageError(f"--trace-skip {args.trace_skip:g}s is past the end of the trace ({trace.span_s:g}s)")
        curve = count_trace_curve(trace, args.compress, args.rate_scale, args.trace_skip, args.gaps)
        arrivals = Arrivals(args.arrivals) if args.arrivals else Arrivals.DETERMINISTIC
        return _plan_curve(curve, arrivals, rng, args.duration, desc)
    assert isinstance(trace, RequestTrace)
    if args.arrivals:
        raise UsageError("--arrivals does not apply to a per-request trace: each request keeps its own time")
    if args.trace_skip > trace.span_s:
        raise UsageError(f"--trace-skip {args.trace_skip:g}s is past the end of the trace ({trace.span_s:g}s)")
    duration = (trace.span_s - args.trace_skip) / args.compress
    chunks: Iterator[ArrivalChunk] = request_trace_chunks(
        trace, compress=args.compress, rate_scale=args.rate_scale, skip_s=args.trace_skip, rng=rng
    )
    window_end = trace.span_s
    if args.duration is not None and args.duration < duration:
        duration = args.duration
        chunks = limit_chunks(chunks, duration)
        window_end = args.trace_skip + duration * args.compress
    lo = int(np.searchsorted(trace.offsets_s, args.trace_skip, side="left"))
    hi = int(np.searchsorted(trace.offsets_s, window_end, side="right" if window_end >= trace.span_s else "left"))
    return Plan(chunks, (hi - lo) * args.rate_scale, duration, desc, "trace", None, None, True)


def _body(args: argparse.Namespace, plan: Plan) -> BodyTemplate | None:
    text: str | None = args.body
    if text is not None and text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise UsageError(f"--body {args.body}: cannot read: {exc.strerror or exc}") from None
    if text is None and plan.is_trace_with_tokens:
        text = DEFAULT_TRACE_BODY
    return parse_template(text) if text is not None else None


def _headers(values: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for h in values:
        name, colon, value = h.partition(":")
        if not colon or not name.strip() or any(c.isspace() for c in name.strip()):
            raise UsageError(f"--header {h!r} is not 'Name: value'")
        out.append((name.strip(), value.strip()))
    return tuple(out)


def _tokens(text: str) -> tuple[int, int]:
    ctx, comma, gen = text.partition(",")
    if not comma or not ctx.strip().isdigit() or not gen.strip().isdigit():
        raise UsageError(f"--tokens {text!r} is not CONTEXT,GENERATED (two whole numbers)")
    return int(ctx), int(gen)


def _check_url(url: str) -> None:
    import httpx

    try:
        parsed = httpx.URL(url)
    except Exception as exc:
        raise UsageError(f"URL {url!r}: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageError(f"URL {url!r}: need http://HOST[:PORT]/PATH or https://...")


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))


class Progress:
    """The live line: a carriage-return-updated line on a terminal, one line per second otherwise."""

    def __init__(self, stream: TextIO, rate_now: Callable[[float], float] | None) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.rate_now = rate_now
        self.last_sent = 0
        self.last_ok = 0
        self.last_err = 0

    def tick(self, runner: Runner, second: int) -> None:
        s = runner.stats
        p50, p99 = s.window_latency_us.quantiles((0.5, 0.99))
        s.window_latency_us.reset()
        sent, ok, err = s.sent - self.last_sent, s.ok - self.last_ok, s.errors - self.last_err
        self.last_sent, self.last_ok, self.last_err = s.sent, s.ok, s.errors
        target = f"target {self.rate_now(second - 0.5):7.1f}/s " if self.rate_now is not None else ""
        queued = f" queued {runner.queued}" if runner.queued else ""
        line = (
            f"[{second:5d}s] {target}sent {sent:6d}/s ok {ok:6d}/s err {err:4d}/s | in-flight {s.in_flight:5d}{queued}"
            f" | p50 {p50 / 1000:8.2f} ms p99 {p99 / 1000:8.2f} ms | errors {s.errors}"
        )
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


async def _run(args: argparse.Namespace, plan: Plan, cfg: ClientConfig, *, seed: int, out: TextIO, err: TextIO) -> int:
    from loadgen.runner import Runner
    from loadgen.stats import RunStats

    show_progress = args.progress if args.progress is not None else err.isatty()
    progress = Progress(err, plan.rate_now) if show_progress else None
    runner = Runner(cfg, RunStats(args.phases or ()), target_of=plan.target_of,
                    on_tick=progress.tick if progress else None)
    metrics_server = _serve_metrics(args.metrics_port, plan, runner, err) if args.metrics_port is not None else None
    try:
        outcome = await _run_until_signalled(runner, plan)
    finally:
        if progress is not None:
            progress.close()
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
    return _report(args, plan, cfg, outcome, seed=seed, out=out, err=err)


def _serve_metrics(port: int, plan: Plan, runner: Runner, err: TextIO) -> Any:
    """Start the Prometheus exporter of the run's stats on `port`; returns the server (stop it with shutdown)."""
    from loadgen.metrics import serve_metrics

    def rate_now() -> float | None:
        return plan.rate_now(float(runner.current_second)) if plan.rate_now is not None else None

    try:
        metrics_server, _thread = serve_metrics(runner.stats, rate_now, port)
    except OSError as exc:
        raise UsageError(f"--metrics-port {port}: {exc.strerror or exc}") from None
    print(f"loadgen: metrics on http://127.0.0.1:{metrics_server.server_port}/metrics", file=err, flush=True)
    return metrics_server


async def _run_until_signalled(runner: Runner, plan: Plan) -> RunOutcome:
    """Run the plan; the first SIGINT or SIGTERM stops sending (the responses are still awaited), a second one
    aborts."""
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        runner.stop()
        if signals > 1:
            runner.abort()

    # Signals reach only the main thread; embedded in another thread (tests, tools), the caller owns them.
    handle_signals = threading.current_thread() is threading.main_thread()
    if handle_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
    try:
        return await runner.run(plan.chunks, duration_s=plan.duration_s)
    finally:
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


def _report(
    args: argparse.Namespace, plan: Plan, cfg: ClientConfig, outcome: RunOutcome, *, seed: int, out: TextIO, err: TextIO
) -> int:
    """Print the summary (and write the timeline and plot when asked); returns the exit code."""
    from loadgen.report import plot_timeline, render_text, render_unreachable, summarize, write_timeline

    summary = summarize(
        outcome,
        expected_requests=plan.expected_requests,
        schedule_duration_s=plan.duration_s,
        in_flight_cap=cfg.max_in_flight,
        context={
            "url": args.url,
            "method": cfg.method,
            "shape": plan.description,
            "arrivals": plan.arrivals,
            "seed": seed,
            "transport": cfg.transport,
        },
    )
    if args.timeline:
        write_timeline(outcome.stats.rows, args.timeline)
    if args.plot:
        plot_timeline(outcome.stats.rows, args.plot, f"{cfg.method} {args.url} — {plan.description}")
    unreachable = outcome.stats.sent > 0 and not outcome.stats.statuses
    if args.json:
        print(json.dumps(summary), file=out, flush=True)
    else:
        print(render_text(summary), file=out, flush=True)
    if unreachable:
        print(render_unreachable(summary), file=err, flush=True)
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    if unreachable:
        return EXIT_UNREACHABLE
    if outcome.stats.sent and outcome.stats.errors / outcome.stats.sent > args.max_error_ratio:
        return EXIT_ERROR_RATIO
    return EXIT_OK


def main(
    argv: Sequence[str] | None = None, prog: str = "loadgen", out: TextIO | None = None, err: TextIO | None = None
) -> int:
    from loadgen.client import ClientConfig

    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    rng = np.random.default_rng(seed)
    try:
        _check_url(args.url)
        plan = build_plan(args, rng)
        body = _body(args, plan)
        if args.http2 and args.transport != "httpx":
            raise UsageError("--http2 needs --transport httpx")
        if args.http2 and importlib.util.find_spec("h2") is None:
            raise UsageError("--http2 needs the h2 package (pip install h2)")
        cfg = ClientConfig(
            url=args.url,
            method=(args.method or ("POST" if body is not None else "GET")).upper(),
            headers=_headers(args.header),
            body=body,
            default_tokens=_tokens(args.tokens),
            timeout_s=args.timeout,
            connect_timeout_s=args.connect_timeout,
            connections=args.connections,
            max_in_flight=args.max_in_flight,
            transport=args.transport,
            verify_tls=not args.insecure,
            http2=args.http2,
        )
    except (UsageError, ShapeError, TraceError, TemplateError) as exc:
        print(f"{prog}: error: {exc}", file=err)
        return EXIT_USAGE
    _raise_fd_limit()
    try:
        return asyncio.run(_run(args, plan, cfg, seed=seed, out=out, err=err))
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=err)
        return EXIT_USAGE
