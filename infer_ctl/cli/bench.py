"""`infer-ctl bench placement`: the openb placement benchmark (the FGD paper's protocol).

    infer-ctl bench placement --nodes NODES.csv --pods PODS.csv --policy fgd,infer-ctl --seeds 42,43 \
        [--tune 1.3] [--json] [--plot alloc.png]

Prints one row per (policy, seed); with --json one JSON list. A progress bar goes to stderr on a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DEFAULT_DATA = Path("../shared/data/openb")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks (placement on the openb trace)")
    sub = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    p = sub.add_parser("placement", help="openb GPU placement: allocation, fragmentation, latency per policy")
    p.add_argument("--nodes", type=Path, default=DEFAULT_DATA / "openb_node_list_gpu_node.csv",
                   help="openb node list CSV (default: %(default)s)")
    p.add_argument("--pods", type=Path, default=DEFAULT_DATA / "openb_pod_list_default.csv",
                   help="openb pod list CSV (default: %(default)s)")
    p.add_argument("--policy", default="fgd,infer-ctl",
                   help="comma-separated: random, dotprod, clustering, packing, bestfit, fgd, infer-ctl")
    p.add_argument("--seeds", default="42", help="comma-separated seeds, e.g. 42,43 or a range 42-51")
    p.add_argument("--tune", type=float, default=1.3, help="arrivals up to this multiple of GPU capacity")
    p.add_argument("--placement-policy", type=Path, default=None,
                   help="placement weights YAML for infer-ctl (default: the policies/placement.yaml scores)")
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of allocation vs arrived workload")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        else:
            seeds.append(int(part))
    return seeds


class _Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.last = -1

    def __call__(self, policy: str, seed: int, done: int, total: int) -> None:
        if not self.enabled:
            return
        pct = int(100 * done / max(total, 1))
        if pct == self.last and done != total:
            return
        self.last = pct
        bar = "#" * (pct // 4) + "." * (25 - pct // 4)
        sys.stderr.write(f"\r{policy:>10} seed {seed}: [{bar}] {pct:3d}% ({done}/{total} pods)")
        if done == total:
            sys.stderr.write("\n")
            self.last = -1
        sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    import yaml

    from infer_ctl.cli.extras import require

    if args.plot is not None:
        require("plot", "--plot")

    from infer_ctl.sim.openb.data import OpenbError
    from infer_ctl.sim.openb.runner import POLICIES
    from infer_ctl.sim.openb.runner import run as run_bench

    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        print(f"infer-ctl bench placement: unknown policy {unknown[0]!r} (known: {', '.join(POLICIES)})",
              file=sys.stderr)
        return 2
    try:
        seeds = _seeds(args.seeds)
    except ValueError:
        print(f"infer-ctl bench placement: --seeds: {args.seeds!r} is not a list of integers", file=sys.stderr)
        return 2
    config: dict[str, object] | None = None
    policy_file = args.placement_policy or Path("policies/placement.yaml")
    if policy_file.exists():
        from infer_ctl.core.errors import SpecError
        from infer_ctl.core.policy import parse_placement_policy

        try:
            policy = parse_placement_policy(yaml.safe_load(policy_file.read_text()) or {}, str(policy_file))
        except (SpecError, yaml.YAMLError) as exc:
            print(f"infer-ctl bench placement: {exc}", file=sys.stderr)
            return 2
        config = {"filters": list(policy.filters), "scores": dict(policy.score_weights)}
    elif args.placement_policy is not None:
        print(f"infer-ctl bench placement: {policy_file}: no such file", file=sys.stderr)
        return 2
    for path in (args.nodes, args.pods):
        if not path.exists():
            print(f"infer-ctl bench placement: {path}: no such file", file=sys.stderr)
            return 2
    progress = _Progress(not args.no_progress and sys.stderr.isatty())
    try:
        results = run_bench(args.nodes, args.pods, policies, seeds, tune=args.tune, placement_config=config,
                            progress=progress)
    except (OpenbError, ValueError) as exc:
        print(f"infer-ctl bench placement: {exc}", file=sys.stderr)
        return 2
    rows = [r.row() for r in results]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        keys = ["policy", "seed", "alloc_pct_at_100", "alloc_pct_at_130", "unallocated_gpus_at_130",
                "frag_ratio_pct_at_90", "decision_ms_p50", "decision_ms_p99", "wall_s"]
        print("  ".join(f"{k:>12}" for k in keys))
        for row in rows:
            print("  ".join(f"{row[k]!s:>12}" for k in keys))
    if args.plot is not None:
        _plot(results, args.plot)
    return 0


def _plot(results: list[Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    grid = np.linspace(0, 130, 261)
    for policy in dict.fromkeys(r.policy for r in results):
        curves = []
        for r in results:
            if r.policy != policy or not r.curve:
                continue
            xs, ys = zip(*r.curve, strict=True)
            curves.append(np.interp(grid, xs, ys, right=np.nan))
        if curves:
            stacked = np.array(curves)
            # Points past a run's last arrival are NaN; average what is there, leave the rest blank.
            counts = (~np.isnan(stacked)).sum(axis=0)
            mean = np.where(counts > 0, np.nansum(stacked, axis=0) / np.maximum(counts, 1), np.nan)
            ax.plot(grid, mean, label=policy)
    ax.plot([0, 100], [0, 100], color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("arrived GPU request (% of GPU capacity)")
    ax.set_ylabel("allocated GPUs (% of capacity)")
    ax.set_title("openb: GPU allocation vs arrived workload (mean over seeds)")
    ax.set_xlim(0, 130)
    ax.set_ylim(0, 100)
    ax.legend(loc="lower right")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
