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

# Subcommand modules under infer_ctl.cli, in the order --help shows them. Each module's `register` gives its parser
# the one-line help --help prints (one place for it: a copy here once drifted from what validate checks).
SUBCOMMANDS: tuple[str, ...] = ("validate", "demo", "controller", "explain", "bench", "sandbox", "loadgen", "simulate",
                                "node-cache-reporter")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="infer-ctl",
        description="Forecast-driven, fragmentation-aware GPU inference autoscaling for Kubernetes.",
    )
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the version, the git commit it was built from (and how that is known), and the "
                             "Python version, then exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"infer_ctl.cli.{name.replace('-', '_')}")
        module.register(sub)
    return parser


class _Version(argparse.Action):
    """argparse's own "version" action takes its text when the parser is built: this one asks git only when
    --version is given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from infer_ctl.version import build_info

        print(build_info().line())
        parser.exit()


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
