"""`infer-ctl demo`: the README's main job.

Today it does the most useful real thing the project can do without a cluster: it loads the policies, checks
every example InferenceService under `deploy/examples/` exactly as `infer-ctl validate` does (CRD schema, CEL
rules, parser, catalog) and explains what each asks for and where it could run. The live demo on the local
sandbox (controller, Prometheus, loadgen's 50 -> 500 -> 2 req/s step) replaces it once the controller lands.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"


def register(sub: Any) -> None:
    parser = sub.add_parser("demo", help="run the local demo", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=Path, default=EXAMPLES, help="folder of InferenceService manifests")
    parser.add_argument("--policies", type=Path, default=None, help="policies folder")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from infer_ctl.cli import validate
    from infer_ctl.config.policies import load_policies
    from infer_ctl.core.quantity import format_bytes

    files = sorted(args.examples.glob("*.yaml"))
    if not files:
        print(f"infer-ctl demo: no manifests in {args.examples}", file=sys.stderr)
        return 2
    policies = load_policies(args.policies)
    print("Accelerator catalog (policies/accelerators.yaml):")
    for acc in policies.catalog.accelerators:
        mig = ", ".join(p.name for p in acc.mig_profiles) or "no MIG"
        print(f"  {acc.name:<11} {format_bytes(acc.memory_bytes):>8}  cc {acc.compute_capability[0]}."
              f"{acc.compute_capability[1]}  x{acc.relative_throughput:<5g} ${acc.price_per_hour_usd:.2f}/h  {mig}")
    print()
    code: int = validate.run(argparse.Namespace(files=files, policies=args.policies, quiet=False))
    print("\nThe live demo on the local sandbox (controller, Prometheus, loadgen) is not built yet; "
          "until it is, this command validates and explains the examples.")
    return code
