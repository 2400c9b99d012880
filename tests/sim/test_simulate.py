"""The simulation loop and the `infer-ctl simulate` command, end to end on small generated traces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from infer_ctl.cli.main import main
from infer_ctl.sim.catalogue import POLICY_NAMES
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.policies import Oracle
from infer_ctl.sim.run import simulate
from infer_ctl.sim.service import default_settings, settings_from_manifest
from infer_ctl.sim.suite import run_policies
from infer_ctl.sim.tick import SimConfig
from infer_ctl.sim.trace import Trace, step_profile

KEYS = {
    "policy",
    "slo_attainment",
    "gpu_hours",
    "cold_starts",
    "p95_latency_ms",
    "p99_latency_ms",
    "scale_events",
    "wall_s",
}


def test_gpu_hours_count_from_creation_including_loading() -> None:
    arrivals = np.zeros(3600)
    desired = np.full(3600, 2.0)
    result = simulate(arrivals, Oracle(desired, 1.0), ServiceModel(), SimConfig(tick_s=1.0), initial_replicas=0)
    assert result.cold_starts == 2
    assert result.gpu_hours == pytest.approx(2.0, rel=1e-3)


def test_requests_with_no_ready_replica_wait_for_the_cold_start() -> None:
    arrivals = np.full(600, 5.0)  # 5 rps for 10 minutes, nothing ready at first
    model = ServiceModel(cold_start_s=120.0, cold_start_sigma=0.0)
    result = simulate(arrivals, Oracle(np.full(600, 1.0), 1.0), model, SimConfig(tick_s=1.0), initial_replicas=0)
    # the 600 requests queued during the cold start drain at mu - 5 = 6.8 rps: about 88 s more of waiting
    drained_s = 120 + 600 / (model.service_rate_rps - 5.0)
    assert result.slo_attainment == pytest.approx((600 - drained_s) / 600, abs=0.02)
    assert result.p99_latency_ms > 100_000


def test_the_oracle_meets_the_slo_on_a_step_that_every_reactive_policy_misses() -> None:
    results = {
        r.policy: r
        for r in run_policies(
            step_profile((50.0, 300.0, 2.0), 600.0), POLICY_NAMES, default_settings(120.0), tick_s=5.0
        )
    }
    assert results["oracle"].slo_attainment >= 0.99
    for name in ("hpa", "kpa", "keda", "aibrix-apa"):
        assert results[name].slo_attainment < 0.99


def test_infer_ctl_prewarms_a_daily_pattern_that_reactive_policies_miss() -> None:
    # 5-minute buckets: 100 requests/s from 08:00 to 18:00, nothing at night
    day = np.concatenate([np.zeros(96), np.full(120, 100.0 * 300), np.zeros(72)])
    trace = Trace("office", 0.0, 300.0, np.tile(day, 9))
    results = {
        r.policy: r for r in run_policies(trace, ("infer-ctl", "hpa", "oracle"), default_settings(300.0), tick_s=60.0)
    }
    assert results["infer-ctl"].slo_attainment > results["hpa"].slo_attainment
    assert results["infer-ctl"].slo_attainment >= 0.98  # the first two days are reactive: no season learned yet


def test_simulate_prints_one_json_row_per_policy(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(
        [
            "simulate",
            "--trace",
            "20,80,5",
            "--trace-format",
            "step",
            "--step-s",
            "300",
            "--policy",
            "infer-ctl,hpa,oracle",
            "--json",
            "--plot",
            str(tmp_path / "p.png"),
        ]
    )
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in rows] == ["infer-ctl", "hpa", "oracle"]
    assert all(set(r) == KEYS for r in rows)
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_simulate_reports_a_bad_trace_line_and_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("t,c\n0,1\n60,lots\n")
    assert main(["simulate", "--trace", str(bad), "--trace-format", "counts-csv", "--policy", "hpa"]) == 2
    assert "bad.csv:3: count 'lots' is not a number" in capsys.readouterr().err


def test_simulate_refuses_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--trace", "1,2", "--trace-format", "step", "--policy", "magic"]) == 2
    assert "unknown policy magic" in capsys.readouterr().err


def test_simulate_takes_capacity_slo_and_preset_from_a_manifest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = tmp_path / "svc.yaml"
    manifest.write_text(
        """
apiVersion: infer-ctl.io/v1alpha1
kind: InferenceService
metadata: {name: chat, namespace: default}
spec:
  model: {name: m, memory: 20Gi}
  runtime: {image: vllm/vllm-openai:v0.11.0, coldStartSeconds: 60}
  accelerator: {products: [H100-80GB]}
  scaling: {minReplicas: 1, maxReplicas: 8, targetRequestsPerReplica: 40, preset: latency-critical}
  slo: {latencyP95Ms: 800}
"""
    )
    settings = settings_from_manifest(manifest)
    assert settings.model.target_rps_per_replica == 40
    assert settings.model.slo_latency_s == 0.8
    assert settings.model.cold_start_s == 60
    assert settings.quantile == 0.99  # the latency-critical preset
    code = main(
        [
            "simulate",
            "--trace",
            "20,80",
            "--trace-format",
            "step",
            "--step-s",
            "300",
            "--service",
            str(manifest),
            "--policy",
            "infer-ctl",
            "--json",
        ]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)[0]["policy"] == "infer-ctl"


def test_simulate_reports_an_invalid_manifest_by_field(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    manifest = tmp_path / "svc.yaml"
    manifest.write_text("apiVersion: infer-ctl.io/v1alpha1\nkind: InferenceService\nmetadata: {name: x}\nspec: {}\n")
    assert main(["simulate", "--trace", "1", "--trace-format", "step", "--service", str(manifest)]) == 2
    assert "spec.model" in capsys.readouterr().err


def burst_at_start() -> Trace:
    """10 req/s, with a 60 s burst of 80 req/s starting at 30 s: inside the first cold start."""
    rates = np.full(900, 10.0)
    rates[30:90] = 80.0
    return Trace("burst-at-start", 0.0, 1.0, rates)


def test_every_policy_starts_warm_with_the_replicas_the_first_cold_start_needs() -> None:
    settings = default_settings(120.0)
    results = run_policies(burst_at_start(), POLICY_NAMES, settings, tick_s=5.0)
    # 80 req/s at 8 req/s per replica within the SLO: 10 ready replicas at t = 0, the same for every policy
    assert {int(r.ready[0]) for r in results} == {10}
    oracle = next(r for r in results if r.policy == "oracle")
    assert oracle.slo_attainment >= 0.99


def test_the_first_minute_mean_start_loses_a_burst_in_the_first_cold_start_even_for_the_oracle() -> None:
    settings = default_settings(120.0)
    results = run_policies(burst_at_start(), ("oracle",), settings, tick_s=5.0, start="first-minute-mean")
    assert int(results[0].ready[0]) == math.ceil((30 * 10 + 30 * 80) / 60 / 8)
    assert results[0].slo_attainment < 0.99


def test_an_unknown_start_protocol_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown start protocol 'hot'"):
        run_policies(burst_at_start(), ("hpa",), default_settings(120.0), tick_s=5.0, start="hot")
