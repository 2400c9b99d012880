"""Command-line option types the simulator's benchmarks share. Standard library only: `benchdoc`, which runs the
benchmarks as commands, imports this and not the simulator."""

from __future__ import annotations

import argparse


def jobs_option(value: str) -> int:
    """The `type` of the benchmarks' `--jobs` option (bench_autoscaling, bench_fleet, benchdoc): worker processes,
    at least one."""
    try:
        jobs = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of worker processes, not {value!r}") from None
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {jobs}")
    return jobs
