"""`infer-ctl loadgen ...`: an alias of `python -m loadgen ...`; every argument goes to loadgen's own CLI."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    # prefix_chars="\0": this parser claims no options (not even -h), so `--help`, `--shape ...` and the rest
    # all reach loadgen's parser, which documents them.
    parser = subparsers.add_parser(
        "loadgen",
        help="open-loop HTTP load generator: traffic shapes, trace replay, latency percentiles",
        add_help=False,
        prefix_chars="\0",
    )
    parser.add_argument("loadgen_args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from loadgen.cli import main

    return main(args.loadgen_args, prog="infer-ctl loadgen")
