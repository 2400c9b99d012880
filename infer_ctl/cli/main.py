"""`infer-ctl`: one explicit table of subcommands, each in a module of its own.

A subcommand module exposes `register(subparsers) -> None`, which adds its parser and sets
`func=run` where `run(args) -> int` returns the exit code. Modules are imported lazily by name so that
`infer-ctl validate` does not pay for importing kopf or statsmodels.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from infer_ctl.cli.extras import MissingExtra

# (subcommand module under infer_ctl.cli, one-line help). Order is the order shown in --help.
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("validate", "check InferenceService manifests against the CRD, its CEL rules and the catalog"),
    ("demo", "run the whole loop on the local sandbox: controller, Prometheus, loadgen's step profile"),
    ("controller", "run the InferenceService controller (kopf) against a cluster or the sandbox"),
    ("explain", "say at which layer each replica of an InferenceService that is not running stopped"),
    ("bench", "benchmarks: GPU placement policies on the openb trace"),
    ("sandbox", "the local sandbox cluster: API server, GPU nodes with DRA, scheduler, model servers"),
    ("loadgen", "open-loop HTTP load generator: traffic shapes, trace replay, latency percentiles"),
    ("simulate", "replay a traffic trace against infer-ctl and the peers' autoscalers in simulated time"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infer-ctl",
        description="Forecast-driven, fragmentation-aware GPU inference autoscaling for Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, _help in SUBCOMMANDS:
        module = importlib.import_module(f"infer_ctl.cli.{name.replace('-', '_')}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except MissingExtra as exc:
        print(f"infer-ctl {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `infer-ctl validate ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
