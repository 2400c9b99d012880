"""The demo's day with and without the sleeping tier: `python -m infer_ctl.cli.bench_demo [--duration S]
[--rate-scale X] [--control-plane emulator|kube] [--out DIR] [--runs order]`.

Runs `infer-ctl demo` twice on this machine, one after the other, with the same arguments: once with the chat
service's sleeping tier off (`--no-sleep`: every unannounced step is met by cold starts) and once as shipped
(deploy/demo/chat.yaml: `prewarm.sleep: true`), then prints one table per phase of the day: p95 and errors of
each run, and the replicas serving and asleep; below it each run's requests, errors and GPU-hours held (the GPUs
its Pods' claims hold, a warm host's GPU once). Each run's own output, summary.json, timelines and plot are in
`--out`/no-sleep and `--out`/sleep. `--runs sleep,no-sleep` changes the order (the machine's load drifts).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RUNS = {"no-sleep": ["--no-sleep"], "sleep": []}


def _demo(name: str, args: argparse.Namespace) -> dict[str, Any]:
    out = args.out / name
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "infer_ctl.cli.main", "demo", "--duration", str(args.duration),
           "--rate-scale", str(args.rate_scale), "--control-plane", args.control_plane, "--out", str(out),
           *RUNS[name]]
    print(f"[{name}] {' '.join(cmd[2:])}", flush=True)
    started = time.monotonic()
    with (out / "demo.out").open("w") as log:
        result = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    took = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"[{name}] the demo failed (exit {result.returncode}): see {out / 'demo.out'}")
    print(f"[{name}] done in {took:.0f} s", flush=True)
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def table(summaries: dict[str, dict[str, Any]]) -> list[str]:
    names = list(summaries)
    first = summaries[names[0]]
    head = f"{'phase':<15} {'req/s':>9}" + "".join(
        f" | {n + ' p95':>15} {'errors':>7} {'serving':>7} {'asleep':>6}" for n in names)
    lines = [head, "-" * len(head)]
    for i, phase in enumerate(first["phases"]):
        row = f"{phase['name']:<15} {phase['rate']:>9}"
        for n in names:
            p = summaries[n]["phases"][i]
            row += f" | {p['p95']:>15} {p['errors']:>7} {p['serving']:>7} {p.get('sleeping', '-'):>6}"
        lines.append(row)
    lines.append("")
    for n in names:
        s = summaries[n]
        lg = s.get("loadgen") or {}
        lines.append(f"{n:<9} {lg.get('sent', 0)} requests, {lg.get('errors', 0)} errors, p95 "
                     f"{lg.get('p95_ms', float('nan')):.0f} ms overall; peak {s['peak_serving']} serving; "
                     f"{s['gpu_hours']:.3f} GPU-hours held")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infer_ctl.cli.bench_demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=360.0, help="the demo's day in seconds (default 360)")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="the demo's --rate-scale (default 1)")
    ap.add_argument("--control-plane", choices=("emulator", "kube"), default="emulator")
    ap.add_argument("--out", type=Path, default=Path(".bench-demo"))
    ap.add_argument("--runs", default="no-sleep,sleep", help="which runs, in this order (default no-sleep,sleep)")
    args = ap.parse_args(argv)
    order = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = [r for r in order if r not in RUNS]
    if unknown or not order:
        ap.error(f"--runs: {', '.join(unknown) or 'nothing'} not among {', '.join(RUNS)}")
    summaries = {}
    for name in order:
        summaries[name] = _demo(name, args)
    print(f"\nthe demo's day ({args.duration:g} s, rate scale {args.rate_scale:g}, {args.control_plane}), "
          "one run each on this machine:")
    for line in table(summaries):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
