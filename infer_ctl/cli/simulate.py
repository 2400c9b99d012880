"""`infer-ctl simulate`: replay a traffic trace against infer-ctl and the peers' autoscalers in simulated time.

    infer-ctl simulate --trace ../shared/data/traces/bank_calls_5min.csv --trace-format counts-csv \\
        --rate-scale 200 --cold-start-s 360 --policy all --json

prints one JSON list with a row per policy: policy, slo_attainment, gpu_hours, cold_starts, p95_latency_ms,
p99_latency_ms, scale_events, wall_s. `--trace-format step --trace 50,500,2` replays the classic step profile
(each level for `--step-s`, 600 s by default).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="replay a trace against infer-ctl and the peers' autoscalers in simulated time",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--trace", required=True, help="trace file, or the levels (requests/s) for --trace-format step")
    p.add_argument("--trace-format", required=True, choices=("azure-llm", "counts-csv", "step"))
    p.add_argument("--bucket-s", type=float, default=None, help="bucket width of the trace (default: inferred)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply the trace's request rate")
    p.add_argument("--service", default=None, help="an InferenceService manifest (capacity, SLO, bounds, preset)")
    p.add_argument("--cold-start-s", type=float, default=None, help="median cold start of a replica (default 120)")
    p.add_argument(
        "--policy", default="all",
        help="all, or a comma list of: infer-ctl,infer-ctl+tiers,hpa,kpa,keda,ray-serve,aibrix-apa,fma-pool,"
        "kserve-cache,oracle"
    )
    p.add_argument(
        "--tick-s",
        type=float,
        default=None,
        help="simulation tick (default: 5 s, 30 s for traces in buckets of 5 minutes or more)",
    )
    p.add_argument("--step-s", type=float, default=600.0, help="duration of each level of a step profile")
    p.add_argument("--max-days", type=float, default=None, help="replay only the first days of the trace")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--warmup-s",
        type=float,
        default=0.0,
        help="leave the first seconds out of the scores (every policy still runs them)",
    )
    p.add_argument(
        "--start",
        choices=("warm", "first-minute-mean"),
        default="warm",
        help="initial replicas of every policy: warm (sized for the first cold start's traffic, as the oracle "
        "would; default) or first-minute-mean (the first minute's mean rate, the earlier protocol)",
    )
    p.add_argument("--json", action="store_true", help="print the results as one JSON list")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="draw traffic, forecast and replicas")
    p.add_argument(
        "--progress",
        choices=("auto", "always", "never"),
        default="auto",
        help="progress bar on stderr (auto: on long runs)",
    )
    p.set_defaults(func=run)


def _progress_printer(total_ticks: int, mode: str) -> Any:
    # auto: on long runs, and only where someone watches (a terminal); a pipe or a log file gets no bar
    show = mode == "always" or (mode == "auto" and total_ticks >= 100_000 and sys.stderr.isatty())
    if not show:
        return None
    state = {"last": -1}

    def bar(name: str, frac: float) -> None:
        pct = int(frac * 100)
        if pct == state["last"]:
            return
        state["last"] = pct
        filled = pct // 4
        sys.stderr.write(f"\r{name:>11} [{'#' * filled}{'.' * (25 - filled)}] {pct:3d}%")
        if pct >= 100:
            sys.stderr.write("\n")
            state["last"] = -1
        sys.stderr.flush()

    return bar


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from infer_ctl.cli.extras import require

    if args.plot:
        require("plot", "--plot")

    from infer_ctl.core.errors import SpecError
    from infer_ctl.sim.catalogue import parse_policy_names
    from infer_ctl.sim.service import default_settings, settings_from_manifest
    from infer_ctl.sim.suite import run_policies
    from infer_ctl.sim.trace import Trace, TraceError, load_trace, step_profile

    try:
        names = parse_policy_names(args.policy)
        if args.trace_format == "step":
            try:
                levels = tuple(float(x) for x in args.trace.split(","))
            except ValueError:
                raise TraceError(f"--trace {args.trace!r}: a step profile is a comma list of rates") from None
            trace = step_profile(levels, args.step_s)
        else:
            trace = load_trace(args.trace, args.trace_format, args.bucket_s)
        if args.max_days is not None:
            keep = int(args.max_days * 86400 / trace.bucket_s)
            trace = Trace(trace.name, trace.start_s, trace.bucket_s, trace.counts[:keep])
        settings = (
            settings_from_manifest(Path(args.service), args.cold_start_s)
            if args.service
            else default_settings(args.cold_start_s)
        )
    except (TraceError, SpecError, ValueError) as exc:
        print(f"infer-ctl simulate: {exc}", file=sys.stderr)
        return 2
    tick_s = args.tick_s or (30.0 if trace.bucket_s >= 300 else 5.0)
    if args.rate_scale <= 0:
        print("infer-ctl simulate: --rate-scale must be > 0", file=sys.stderr)
        return 2
    progress = _progress_printer(int(trace.duration_s / tick_s) * len(names), args.progress)
    try:
        results = run_policies(
            trace,
            names,
            settings,
            tick_s=tick_s,
            rate_scale=args.rate_scale,
            seed=args.seed,
            score_from_s=args.warmup_s,
            start=args.start,
            progress=progress,
        )
    except ValueError as exc:
        print(f"infer-ctl simulate: {exc}", file=sys.stderr)
        return 2
    rows = [r.row() for r in results]
    if args.json:
        print(json.dumps(rows))
    else:
        cols = (
            "policy",
            "slo_attainment",
            "gpu_hours",
            "cold_starts",
            "p95_latency_ms",
            "p99_latency_ms",
            "scale_events",
            "wall_s",
        )
        print("  ".join(f"{c:>14}" for c in cols))
        for row in rows:
            print("  ".join(f"{row[c]:>14}" for c in cols))
    if args.plot:
        from infer_ctl.sim.plot import plot_results

        title = (
            f"{trace.name} x{args.rate_scale:g}, cold start {settings.model.cold_start_s:.0f} s, "
            f"SLO {settings.model.slo_latency_s:g} s at {settings.model.target_rps_per_replica:g} rps/replica"
        )
        plot_results(results, Path(args.plot), title, settings.model.target_rps_per_replica)
    return 0
