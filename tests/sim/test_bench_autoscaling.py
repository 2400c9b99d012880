"""The autoscaling benchmark's report on the step profile (the real traces are the benchmark's, run by hand)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from infer_ctl.sim.bench_autoscaling import main, parse_seeds, tiers_against_plain, verdict
from infer_ctl.sim.service import default_settings
from infer_ctl.sim.suite import run_policies
from infer_ctl.sim.trace import step_profile


def test_the_report_has_means_over_seeds_each_preset_the_references_and_the_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--scenarios", "step", "--starts", "warm", "--cold-starts", "120", "--seeds", "0-1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "means over seeds 0,1; infer-ctl reached 99% in 0 of 2" in out
    rows = {m.group(1) for m in re.finditer(r"^  (\S+)\s+\d+\.\d+%\s+\d+\.\d+%", out, re.MULTILINE)}
    assert rows == {"infer-ctl", "infer-ctl+tiers", "infer-ctl+aim", "infer-ctl/latency-critical", "hpa", "kpa",
                    "keda", "ray-serve", "aibrix-apa", "fma-pool", "kserve-cache", "oracle"}
    assert "reference: the cheapest constant fleet at >= 99% is" in out
    assert "reference: none of 518 peak-hold rules reaches 99%" in out
    assert "out of reach of every peak-hold rule too" in out


def test_infer_ctl_on_another_preset_is_not_a_baseline_that_dominates_it() -> None:
    results = run_policies(step_profile((50.0, 300.0, 2.0), 300.0), ("infer-ctl", "kpa", "oracle"),
                           default_settings(120.0), tick_s=5.0)
    ours = results[0]
    better = replace(ours, policy="infer-ctl/latency-critical", slo_attainment=ours.slo_attainment + 0.01,
                     gpu_hours=ours.gpu_hours - 1.0)
    assert "no baseline dominates: met" in "\n".join(verdict([*results, better]))
    as_peer = replace(better, policy="ray-serve")
    assert "no baseline dominates: MISSED (ray-serve)" in "\n".join(verdict([*results, as_peer]))


def test_the_tiers_are_reported_against_infer_ctl_without_them() -> None:
    base = run_policies(step_profile((50.0, 300.0, 2.0), 300.0), ("infer-ctl",), default_settings(120.0),
                        tick_s=5.0)[0]

    def line(d_att: float, d_gpu: float) -> str:
        tiers = replace(base, policy="infer-ctl+tiers", slo_attainment=base.slo_attainment + d_att,
                        gpu_hours=base.gpu_hours + d_gpu)
        [out] = tiers_against_plain([base, tiers])
        return out

    assert "dominates it (+1.00 points" in line(0.01, -1.0)
    assert "dominates it" in line(0.0, -1.0)
    assert "DOMINATED by it (-1.00 points" in line(-0.01, 1.0)
    assert "DOMINATED by it" in line(-0.01, 0.0)
    assert "a trade-off" in line(-0.01, -1.0) and "a trade-off" in line(0.01, 1.0)
    assert ": the same (" in line(0.0, 0.0)
    assert tiers_against_plain([base]) == []


def test_seeds_are_ranges_or_lists() -> None:
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("3,7") == [3, 7]
    with pytest.raises(ValueError, match="no seeds"):
        parse_seeds(",")


def test_the_trace_scenarios_run_at_the_tick_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--scenarios", "step", "--starts", "warm", "--cold-starts", "120", "--seeds", "0",
            "--policies", "infer-ctl", "--hindsight", "", "--trace-tick-s", "2"]
    assert main(argv) == 0
    assert re.search(r"^step: step-50-500-2 x1, [0-9.]+ days, tick 2 s,", capsys.readouterr().out, re.MULTILINE)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--starts", "cold", "--starts: unknown 'cold'; expected warm, first-minute-mean"),
    ("--scenarios", "azure,stepp", "--scenarios: unknown 'stepp'"),
    ("--policies", "infer-ctl,hap", "--policies: unknown policy hap"),
    ("--cold-starts", "120,-5", "--cold-starts: '120,-5': each cold start must be > 0 s"),
    ("--seeds", "0-x", "--seeds: '0-x' is not seeds"),
    ("--presets", "fast", "--presets: unknown 'fast'"),
    ("--hindsight", "bank", "--hindsight: unknown 'bank'"),
])
def test_a_bad_option_is_a_usage_error_that_names_it_before_any_trace_is_read(
        option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--azure", "/nonexistent/azure.csv", "--bank", "/nonexistent/bank.csv", option, value])
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
