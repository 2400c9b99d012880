"""`python -m loadgen.bench`: loadgen's open-loop rate and send lag against a fast local endpoint, beside wrk.

What it does, all on 127.0.0.1:
1. starts `python -m loadgen.benchserver` in its own process, pinned to one core (--server-core);
2. runs `python -m loadgen` as a separate process pinned to another core (--client-core), so "one core" is
   literal: at 1,000 req/s constant (send lag and rate accuracy), on a step shape (rate accuracy per step),
   and at rising constant rates until the achieved rate falls more than 1 % short of the target;
3. runs wrk (closed loop: each connection sends its next request when the last one is answered; one thread,
   pinned to the same client core) against the same endpoint, for the endpoint's and the machine's ceiling;
4. optionally (--memory-minutes) runs loadgen for minutes at a constant rate, sampling its resident memory.

With `--clients aiohttp,httpx` it instead compares loadgen's HTTP clients (its --transport values): each at each
of --rates, --repeat times, interleaved so that all see the same machine state, and prints medians with their
spread (min-max) and, per client, the highest sustained rate (the median run achieves >= 99 % of the target,
error-free, with a send-lag p99 <= 10 ms). A run still going a minute past its shape gets Ctrl-C (and is killed
20 s later, counting as sending nothing).

It prints a table and, with --json, every figure as one JSON object. Figures depend on the machine and on what
else runs on it (the load average is printed); run it on an otherwise idle machine for numbers to quote.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class LoadgenRun:
    shape: str
    summary: dict[str, Any]
    cpu_s: float
    wall_s: float
    max_rss_mib: float
    preempted: int = 0  # involuntary context switches: the process was ready to run but another one ran
    rss_samples_mib: list[tuple[float, float]] = field(default_factory=list)
    timeline: list[dict[str, str]] = field(default_factory=list)

    @property
    def target(self) -> float:
        return float(self.summary["target_rps"])

    @property
    def achieved(self) -> float:
        return float(self.summary["achieved_rps"])

    @property
    def within_1pct(self) -> bool:
        return abs(self.achieved - self.target) <= 0.01 * self.target

    @property
    def cpu_us_per_request(self) -> float:
        """CPU per request sent, start-up (imports, about 0.5 s of CPU) included."""
        sent = int(self.summary["sent"])
        return self.cpu_s / sent * 1e6 if sent else 0.0

    @property
    def cpu_share(self) -> float:
        """CPU seconds per wall second of the loadgen process: 1.0 is one core fully busy."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


def _pin(core: int | None) -> Any:
    if core is None:
        return None
    return lambda: os.sched_setaffinity(0, {core})


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def start_server(core: int | None) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen.benchserver", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_pin(core),  # noqa: PLW1509 - only sched_setaffinity, before exec
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.match(r"ready (\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"benchserver did not start: {line!r}")
    return proc, int(m.group(1))


def _time_limit_s(shape: str) -> float:
    """The shape's length (sum of the `@...s` steps) plus a minute for start-up and the drain."""
    return sum(float(x) for x in re.findall(r"@([\d.]+)s", shape)) + 60.0


def run_loadgen(
    url: str, shape: str, core: int | None, extra: list[str] | None = None, sample_every_s: float = 0.0
) -> LoadgenRun:
    with tempfile.TemporaryDirectory() as tmp:
        timeline_path = Path(tmp) / "timeline.csv"
        cmd = [
            sys.executable, "-m", "loadgen", url, "--shape", shape, "--json", "--no-progress",
            "--max-error-ratio", "1", "--timeout", "10s", "--timeline", str(timeline_path), *(extra or []),
        ]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_pin(core))  # noqa: PLW1509
        samples: list[tuple[float, float]] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(sample_every_s):
                rss = _rss_mib(proc.pid)
                if rss is not None:
                    samples.append((round(time.monotonic() - started, 1), round(rss, 1)))

        # An overloaded client may take long to drain: past the time limit it gets Ctrl-C (loadgen then stops,
        # prints its summary and exits 130), and is killed 20 s later.
        limit_s = _time_limit_s(shape)
        interrupt = threading.Timer(limit_s, proc.send_signal, (signal.SIGINT,))
        kill = threading.Timer(limit_s + 20, proc.kill)
        interrupt.start()
        kill.start()
        sampler = threading.Thread(target=sample, daemon=True) if sample_every_s > 0 else None
        if sampler is not None:
            sampler.start()
        assert proc.stdout is not None and proc.stderr is not None
        out = proc.stdout.read()
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        interrupt.cancel()
        kill.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - started
        done.set()
        if sampler is not None:
            sampler.join()
        if not out.strip():
            raise RuntimeError(f"loadgen {shape} printed no summary (exit {proc.returncode}): {err[-2000:]}")
        timeline = list(csv.DictReader(timeline_path.open())) if timeline_path.exists() else []
    return LoadgenRun(
        shape=shape,
        summary=json.loads(out),
        cpu_s=usage.ru_utime + usage.ru_stime,
        wall_s=wall,
        max_rss_mib=usage.ru_maxrss / 1024.0,
        preempted=usage.ru_nivcsw,
        rss_samples_mib=samples,
        timeline=timeline,
    )


def run_wrk(url: str, connections: int, duration_s: int, core: int | None) -> dict[str, Any]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "--latency", url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, preexec_fn=_pin(core)).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    lat = {p: re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\b", out, re.M) for p in ("50", "99")}

    def ms(m: re.Match[str] | None) -> float | None:
        if m is None:
            return None
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    return {
        "connections": connections,
        "rps": float(rps.group(1)) if rps else None,
        "p50_ms": ms(lat["50"]),
        "p99_ms": ms(lat["99"]),
    }


def step_accuracy(run: LoadgenRun, steps: list[tuple[float, float]]) -> list[dict[str, float]]:
    """Per step: target rate, and the rate achieved over the step's seconds (by actual send second)."""
    out = []
    t = 0.0
    sent_by_second = {int(r["t_s"]): int(r["sent"]) for r in run.timeline}
    for rate, dur in steps:
        seconds = range(int(t), int(t + dur))
        sent = sum(sent_by_second.get(s, 0) for s in seconds)
        out.append({"target_rps": rate, "achieved_rps": round(sent / dur, 2)})
        t += dur
    return out


LAG_P99_BOUND_MS = 10.0  # a rate is sustained when the median run meets it within 1 %, error-free, under this


def _median_spread(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[0], ordered[-1]


def _point(rate: float, runs: list[LoadgenRun]) -> dict[str, Any]:
    """One (client, rate) point over its repeats: medians and spreads (min, max) of what matters."""
    achieved = _median_spread([r.achieved for r in runs])
    lag = _median_spread([float(r.summary.get("send_lag_ms_p99") or 0.0) for r in runs])
    latency = _median_spread([float(r.summary.get("p99_ms") or 0.0) for r in runs])
    cpu = _median_spread([r.cpu_us_per_request for r in runs])
    errors = sum(int(r.summary["errors"]) for r in runs)
    sustained = achieved[0] >= 0.99 * rate and errors == 0 and lag[0] <= LAG_P99_BOUND_MS
    return {"rate": rate, "achieved": achieved, "lag_p99_ms": lag, "latency_p99_ms": latency,
            "cpu_us_per_request": cpu, "errors": errors, "sustained": sustained,
            "preempted": [r.preempted for r in runs]}  # fmt: skip


def _fmt(ms: tuple[float, float, float], digits: int) -> str:
    return f"{ms[0]:.{digits}f} ({ms[1]:.{digits}f}-{ms[2]:.{digits}f})"


def _run_or_fail(url: str, shape: str, core: int | None, client: str) -> LoadgenRun:
    """A run; one that printed no summary (killed past its time limit) counts as sending nothing, one error."""
    try:
        return run_loadgen(url, shape, core, ["--transport", client])
    except RuntimeError as exc:
        print(f"  {client} {shape}: {str(exc)[:200]}", flush=True)
        target = float(shape.split("@", maxsplit=1)[0])
        failed = {"target_rps": target, "achieved_rps": 0.0, "sent": 0, "errors": 1, "no_summary": str(exc)[:200]}
        return LoadgenRun(shape=shape, summary=failed, cpu_s=0.0, wall_s=0.0, max_rss_mib=0.0)


def compare_clients(url: str, clients: list[str], rates: list[float], *, repeat: int, d: int,
                    core: int | None) -> dict[str, Any]:  # fmt: skip
    """Every client at every rate, `repeat` times, interleaved (rate by rate, repeat by repeat, client by
    client) so that all clients see the same machine state; a client stops after two unsustained rates."""
    points: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
    misses = dict.fromkeys(clients, 0)
    print(f"\nclients {', '.join(clients)}: {repeat} runs of {d} s per rate, interleaved; sustained = median "
          f"achieved >= 99 % of target, no errors, median send-lag p99 <= {LAG_P99_BOUND_MS:g} ms")  # fmt: skip
    print(f"  {'client':>8} {'target/s':>8}  {'achieved/s median (min-max)':>30}  {'send-lag p99 ms':>22}  "
          f"{'latency p99 ms':>22}  {'CPU us/req':>16}  {'errors':>6}  sustained")  # fmt: skip
    for rate in rates:
        active = [c for c in clients if misses[c] < 2]
        if not active:
            break
        runs: dict[str, list[LoadgenRun]] = {c: [] for c in active}
        for _ in range(repeat):
            for c in active:
                runs[c].append(_run_or_fail(url, f"{rate:g}@{d}s", core, c))
        for c in active:
            pt = _point(rate, runs[c])
            points[c].append(pt)
            misses[c] = 0 if pt["sustained"] else misses[c] + 1
            print(f"  {c:>8} {rate:>8.0f}  {_fmt(pt['achieved'], 1):>30}  {_fmt(pt['lag_p99_ms'], 2):>22}  "
                  f"{_fmt(pt['latency_p99_ms'], 2):>22}  {_fmt(pt['cpu_us_per_request'], 0):>16}  "
                  f"{pt['errors']:>6}  {'yes' if pt['sustained'] else 'NO'}", flush=True)  # fmt: skip
    best = {c: max((p["rate"] for p in points[c] if p["sustained"]), default=0.0) for c in clients}
    print("  highest sustained rate: " + ", ".join(f"{c} {best[c]:.0f}/s" for c in clients), flush=True)
    return {"points": points, "highest_sustained_rps": best, "lag_p99_bound_ms": LAG_P99_BOUND_MS}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadgen.bench", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=int, default=10, help="seconds per run (default 10)")
    p.add_argument("--rates", default="1000,2000,3000,4000,5000,6000,8000", help="open-loop rates to try, ascending")
    p.add_argument("--wrk-connections", default="8,64", help="wrk connection counts (default 8,64)")
    p.add_argument("--server-core", type=int, default=0)
    p.add_argument("--client-core", type=int, default=1)
    p.add_argument("--memory-minutes", type=float, default=0.0, help="also run this long for memory (default 0: skip)")
    p.add_argument("--memory-rate", type=int, default=1000, help="rate of the memory run (default 1000)")
    p.add_argument("--memory-only", action="store_true", help="only the memory run (with --memory-minutes)")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to cores (on a busy shared machine)")
    p.add_argument("--json", action="store_true", help="print every figure as one JSON object at the end")
    p.add_argument("--clients", default="", help="compare these --transport values (e.g. aiohttp,httpx) instead")
    p.add_argument("--repeat", type=int, default=3, help="runs per client and rate with --clients (default 3)")
    args = p.parse_args(argv)
    cores = os.sched_getaffinity(0)
    server_core = args.server_core if args.server_core in cores and not args.no_pin else None
    client_core = args.client_core if args.client_core in cores and not args.no_pin else None
    d = args.duration

    server, port = start_server(server_core)
    url = f"http://127.0.0.1:{port}/"
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(),
            "server_core": server_core,
            "client_core": client_core,
            "python": sys.version.split()[0],
        }
    }
    try:
        print(f"endpoint {url} (benchserver on core {server_core}); clients on core {client_core}; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip

        if args.clients:
            rates = [float(r) for r in args.rates.split(",")]
            clients = args.clients.split(",")
            report["clients"] = compare_clients(url, clients, rates, repeat=args.repeat, d=d, core=client_core)
        elif not args.memory_only:
            print(f"\nopen loop, loadgen, deterministic arrivals, {d} s per run", flush=True)
            header = (f"  {'target/s':>9} {'achieved/s':>11} {'±1%':>4}  {'lag p50':>8} {'lag p99':>8} "
                      f"{'worst-s p99':>11}  {'lat p50':>8} {'lat p99':>8}  {'errors':>6}  {'CPU':>5} "
                      f"{'us/req':>6} {'preempted':>9}")  # fmt: skip
            print(header)
            runs: list[LoadgenRun] = []
            max_ok = 0.0
            max_ok_lag5 = 0.0
            misses = 0
            for rate in [float(r) for r in args.rates.split(",")]:
                run = run_loadgen(url, f"{rate:g}@{d}s", client_core)
                runs.append(run)
                s = run.summary
                print(
                    f"  {rate:>9.0f} {run.achieved:>11.1f} {'yes' if run.within_1pct else 'NO':>4}  "
                    f"{s['send_lag_ms_p50']:>8.2f} {s['send_lag_ms_p99']:>8.2f} {s['max_send_lag_ms_p99']:>11.2f}  "
                    f"{s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f}  {s['errors']:>6}  {run.cpu_share:>5.2f} "
                    f"{run.cpu_us_per_request:>6.0f} {run.preempted:>9}",
                    flush=True,
                )
                if run.within_1pct and s["errors"] == 0:
                    max_ok = max(max_ok, rate)
                    if s["send_lag_ms_p99"] <= 5.0:
                        max_ok_lag5 = max(max_ok_lag5, rate)
                    misses = 0
                else:
                    misses += 1
                    if misses >= 2:
                        break
            print(f"  max sustained (achieved within 1 % of target, no errors): {max_ok:.0f} req/s; "
                  f"of those with send-lag p99 <= 5 ms: {max_ok_lag5:.0f} req/s")  # fmt: skip
            report["open_loop"] = [
                {
                    "shape": r.shape,
                    "cpu_share": round(r.cpu_share, 3),
                    "cpu_us_per_request": round(r.cpu_us_per_request, 1),
                    "preempted": r.preempted,
                    **r.summary,
                }
                for r in runs
            ]
            report["max_sustained_rps"] = max_ok
            report["max_sustained_rps_lag_p99_le_5ms"] = max_ok_lag5

            steps = [(500.0, float(d)), (2000.0, float(d)), (1000.0, float(d))]
            spec = ",".join(f"{r:g}@{t:g}s" for r, t in steps)
            step_run = run_loadgen(url, spec, client_core)
            per_step = step_accuracy(step_run, steps)
            print(f"\nsteps {spec}: overall target {step_run.target:.1f}/s achieved {step_run.achieved:.1f}/s "
                  f"({'within' if step_run.within_1pct else 'NOT within'} 1 %); per step: "
                  + ", ".join(f"{x['target_rps']:g} -> {x['achieved_rps']:g}" for x in per_step)
                  + f"; send-lag p99 {step_run.summary['send_lag_ms_p99']:.2f} ms")  # fmt: skip
            report["steps"] = {"shape": spec, "per_step": per_step, **step_run.summary}

            if shutil.which("wrk"):
                print(f"\nwrk (closed loop, 1 thread on core {client_core}), {d} s per run")
                report["wrk"] = []
                for c in [int(x) for x in args.wrk_connections.split(",")]:
                    w = run_wrk(url, c, d, client_core)
                    report["wrk"].append(w)
                    print(
                        f"  -c {c:>4}: {w['rps']:>10.0f} req/s   "
                        f"latency p50 {w['p50_ms']:.3f} ms  p99 {w['p99_ms']:.3f} ms"
                    )
            else:
                print("\nwrk not found: apt-get install -y wrk (skipped)")

        if args.memory_minutes > 0:
            secs = int(args.memory_minutes * 60)
            print(f"\nmemory: loadgen at {args.memory_rate} req/s for {secs} s, resident memory every 10 s", flush=True)
            mem = run_loadgen(url, f"{args.memory_rate}@{secs}s", client_core, sample_every_s=10.0)
            samples = mem.rss_samples_mib
            print("  RSS MiB: " + " ".join(f"{t:.0f}s:{m:.1f}" for t, m in samples))
            if len(samples) >= 3:
                first_min = [m for t, m in samples if t <= 60]
                base = first_min[-1] if first_min else samples[0][1]
                print(f"  after the first minute {base:.1f} MiB, at the end {samples[-1][1]:.1f} MiB, "
                      f"peak {mem.max_rss_mib:.1f} MiB; sent {mem.summary['sent']}, achieved "
                      f"{mem.achieved:.1f}/s, send-lag p99 {mem.summary['send_lag_ms_p99']:.2f} ms")  # fmt: skip
            report["memory"] = {
                "rate_rps": args.memory_rate,
                "seconds": secs,
                "rss_samples_mib": samples,
                "max_rss_mib": mem.max_rss_mib,
                **mem.summary,
            }
        report["machine"]["load_average_at_end"] = os.getloadavg()
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if args.json:
        print(json.dumps(report, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
