"""The benchmarks' simulations in worker processes (`--jobs`): the same figures, in the same order, as one after
another in the process, but for the wall times."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import numpy as np
import pytest

from infer_ctl.core.api import Preset
from infer_ctl.sim.bench_autoscaling import main
from infer_ctl.sim.bench_fleet import run_policies as fleet_policies
from infer_ctl.sim.cluster import ClusterSpec
from infer_ctl.sim.fleet_state import FleetService
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.recipe import service_settings
from infer_ctl.sim.service import default_settings, with_preset
from infer_ctl.sim.suite import PolicyRun, run_grid, run_policies
from infer_ctl.sim.tick import SimConfig
from infer_ctl.sim.trace import step_profile

TRACE = step_profile((50.0, 300.0, 2.0), 300.0)
NAMES = ("infer-ctl", "infer-ctl+tiers", "hpa", "kpa", "oracle")


def same(a: Any, b: Any, path: str = "result") -> None:
    """a == b field by field, arrays element by element (NaN equal to NaN), every wall time aside."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            if f.name != "wall_s":
                same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b, equal_nan=True), path
    elif isinstance(a, tuple | list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert a == b, path


def test_the_policies_in_two_workers_give_the_results_of_one_after_another_in_their_order() -> None:
    settings = default_settings(120.0)
    one = run_policies(TRACE, NAMES, settings, tick_s=5.0, seed=3)
    heard: list[tuple[str, float]] = []
    two = run_policies(TRACE, NAMES, settings, tick_s=5.0, seed=3, jobs=2,
                       progress=lambda name, frac: heard.append((name, frac)))
    assert [r.policy for r in two] == list(NAMES)
    # the policies' figures differ, so that results put in another order would not pass for these
    assert len({(r.slo_attainment, r.gpu_hours) for r in one}) == len(NAMES)
    same(two, one)
    assert heard == [(name, 1.0) for name in NAMES]  # a worker's run is heard of once, when it is done


def test_a_grid_of_seeds_and_presets_in_workers_is_each_run_as_alone_in_the_order_given() -> None:
    base = default_settings(120.0)
    tuned = with_preset(base, Preset.LATENCY_CRITICAL)
    runs = [PolicyRun(name, settings, seed) for seed in (0, 1) for name, settings in
            (("infer-ctl", base), ("hpa", base), ("infer-ctl", tuned), ("oracle", base))]
    two = run_grid(TRACE, runs, tick_s=5.0, rate_scale=1.5, score_from_s=60.0, jobs=2)
    alone = [run_policies(TRACE, (r.name,), r.settings, tick_s=5.0, rate_scale=1.5, score_from_s=60.0,
                          seed=r.seed)[0] for r in runs]
    # infer-ctl's runs on the two seeds and the two presets differ: their order matters as much as the names'
    assert len({(r.slo_attainment, r.gpu_hours, r.cold_starts) for r in alone if r.policy == "infer-ctl"}) == 4
    same(two, alone)


def test_jobs_below_one_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="jobs: 0 must be >= 1"):
        run_policies(TRACE, ("hpa",), default_settings(120.0), tick_s=5.0, jobs=0)
    with pytest.raises(SystemExit):
        main(["--scenarios", "step", "--jobs", "0"])
    assert "argument --jobs: must be >= 1, not 0" in capsys.readouterr().err


def test_a_failing_run_in_a_worker_fails_the_grid() -> None:
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        run_grid(TRACE, [PolicyRun("hpa", default_settings(120.0)), PolicyRun("nope", default_settings(120.0))],
                 tick_s=5.0, jobs=2)


def test_the_fleet_policies_in_two_workers_give_the_results_of_one_after_another() -> None:
    rng = np.random.default_rng(5)
    rates = (np.repeat([4.0, 30.0, 2.0, 20.0], 90), np.repeat([10.0, 1.0, 40.0, 5.0], 90))
    fleet = tuple(FleetService(f"svc-{i}", rng.poisson(r * 5.0).astype(np.float64),
                               service_settings(f"svc-{i}", ServiceModel(min_replicas=0)), i)
                  for i, r in enumerate(rates))
    fleets = {p: tuple(dataclasses.replace(s, settings=with_preset(s.settings, p)) for s in fleet)
              for p in (Preset.BALANCED, Preset.LATENCY_CRITICAL)}
    names = ("infer-ctl", "hpa", "oracle")
    cluster, config = ClusterSpec(nodes=2), SimConfig(tick_s=5.0)
    one = fleet_policies(names, cluster, config, fleets)
    two = fleet_policies(names, cluster, config, fleets, jobs=2)
    assert [r.policy for r in two] == ["infer-ctl", "infer-ctl/latency-critical", "hpa", "oracle"]
    same(two, one)


def masked(out: str) -> str:
    """The benchmark's output with its wall times (the header's, the `wall s` column's) masked."""
    lines, column = [], None
    for raw in out.splitlines():
        line = re.sub(r"wall \d+ s", "wall - s", raw)
        if line.startswith("  policy "):
            end = line.index("wall s") + len("wall s")  # the column's figures are right-aligned under it
            column = slice(end - 7, end)
        elif column is not None and re.match(r"  \S+\s+\d+\.\d+% ", line):  # a row of the table
            assert re.fullmatch(r" *\d+\.\d", line[column]), line
            line = line[:column.start] + " " * 7 + line[column.stop:]
        else:  # the table is over
            column = None
        lines.append(line)
    return "\n".join(lines)


def test_the_benchmark_prints_the_same_figures_with_two_jobs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--scenarios", "step", "--starts", "warm", "--cold-starts", "120", "--seeds", "0-1", "--hindsight", "",
            "--policies", "infer-ctl,infer-ctl+tiers,hpa", "--presets", "balanced,latency-critical"]
    assert main(argv) == 0
    one = capsys.readouterr().out
    assert main([*argv, "--jobs", "2"]) == 0
    two = capsys.readouterr().out
    assert "infer-ctl/latency-critical" in one
    assert masked(two) == masked(one)
