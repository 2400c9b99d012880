"""status.slo's aim: the quantile and stabilization the scaling runs with, when they move with the attainment, and
the aim a controller started again reads back from it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from infer_ctl.config.policies import load_policies
from infer_ctl.controller.observe import measured_attainment, recorded_aim
from infer_ctl.controller.status import with_aim
from infer_ctl.core import api
from infer_ctl.core.runtime import token_objectives
from infer_ctl.core.slo import Attainment
from infer_ctl.engine.aim import AimState, RecordedAim
from infer_ctl.engine.cycle import CycleState, service_policy
from tests.engine.test_aim import ADAPTIVE, FIXED, slo_service

SLO = api.SloStatus(objective=0.99, latency_ms=500, window_s=3600, attainment=0.98, requests=10_000)
T = datetime(2026, 12, 5, 1, 0, tzinfo=UTC).timestamp()
MOVE = "aim up to q0.99 / 600 s: 98.00 % of 10000 requests within the SLO over the last 3600 s"


def test_the_aim_is_shown_where_it_moves_with_its_last_move() -> None:
    spec = slo_service().spec  # type: ignore[attr-defined]
    state = CycleState(resolved=(spec, service_policy(spec, ADAPTIVE)), aim=AimState(1, T))
    assert with_aim(SLO, state) == replace(SLO, aim=api.AimStatus(0.95, 300, "2026-12-05T01:00:00Z"))
    moved = replace(state, aim=AimState(2, T + 3600, MOVE))
    shown = with_aim(SLO, moved)
    assert shown is not None and shown.to_dict()["aim"] == {
        "quantile": "0.99", "scaleDownStabilizationSeconds": 600, "since": "2026-12-05T02:00:00Z", "lastMove": MOVE}


def test_no_aim_is_shown_where_it_does_not_move_or_nothing_was_measured() -> None:
    spec = slo_service().spec  # type: ignore[attr-defined]
    fixed = CycleState(resolved=(spec, service_policy(spec, FIXED)), aim=AimState())
    assert with_aim(SLO, fixed) == SLO
    assert with_aim(None, CycleState()) is None


def test_the_status_a_controller_wrote_is_the_aim_the_next_one_reads() -> None:
    spec = slo_service().spec  # type: ignore[attr-defined]
    state = CycleState(resolved=(spec, service_policy(spec, ADAPTIVE)), aim=AimState(2, T, MOVE))
    shown = with_aim(SLO, state)
    assert shown is not None
    body = {"status": {"slo": shown.to_dict()}}
    assert recorded_aim(body) == RecordedAim(0.99, 600, T, MOVE)


@pytest.mark.parametrize("aim", [
    None,
    "q0.95 / 300 s (as calibrated for the objective)",  # the string an older controller wrote
    {"quantile": "0.95", "scaleDownStabilizationSeconds": 300},  # no since
    {"quantile": "high", "scaleDownStabilizationSeconds": 300, "since": "2026-12-05T01:00:00Z"},
    {"quantile": "0.95", "scaleDownStabilizationSeconds": 300, "since": "yesterday"},
])
def test_an_aim_the_status_does_not_record_readably_is_none(aim: object) -> None:
    assert recorded_aim({"status": {"slo": {"aim": aim}}}) is None
    assert recorded_aim({}) is None


def test_a_headroom_rung_is_shown_and_read_back() -> None:
    spec = slo_service().spec  # type: ignore[attr-defined]
    policy = service_policy(spec, ADAPTIVE)
    x2 = policy.aim_rungs.index(next(r for r in policy.aim_rungs if r.headroom == 2))
    shown = with_aim(SLO, CycleState(resolved=(spec, policy), aim=AimState(x2, T, "aim up to q0.99 / 600 s x2: ...")))
    assert shown is not None and shown.to_dict()["aim"] == {
        "quantile": "0.99", "scaleDownStabilizationSeconds": 600, "headroom": "2", "since": "2026-12-05T01:00:00Z",
        "lastMove": "aim up to q0.99 / 600 s x2: ..."}
    recorded = recorded_aim({"status": {"slo": shown.to_dict()}})
    assert recorded == RecordedAim(0.99, 600, T, "aim up to q0.99 / 600 s x2: ...", headroom=2.0)


def test_the_token_objectives_are_shown_beside_the_end_to_end_one_and_the_aim_moves_on_the_furthest() -> None:
    ttft = api.LatencyObjectiveStatus(500, 0.95, 8_000, "vllm:time_to_first_token_seconds_bucket from Prometheus")
    itl = api.LatencyObjectiveStatus(50, 0.999, 400_000, "vllm:inter_token_latency_seconds_bucket from Prometheus")
    both = replace(SLO, time_to_first_token=ttft, inter_token_latency=itl)
    shown = both.to_dict()
    assert shown["timeToFirstToken"] == {"latencyMs": "500", "requests": 8000, "attainment": "0.95",
                                         "message": "vllm:time_to_first_token_seconds_bucket from Prometheus"}
    assert shown["interTokenLatency"]["intervals"] == 400_000 and shown["attainment"] == "0.98"
    assert measured_attainment(both) == Attainment(0.95, 8_000.0, 3600)  # the lowest share of the three
    assert measured_attainment(SLO) == Attainment(0.98, 10_000.0, 3600)
    # token objectives only: no end-to-end figures; nothing measured yet: nothing to move on
    only = api.SloStatus(0.99, None, 3600, time_to_first_token=api.LatencyObjectiveStatus(500, message="not read"))
    assert only.to_dict() == {"windowSeconds": 3600, "objective": "0.99",
                              "timeToFirstToken": {"latencyMs": "500", "requests": 0, "message": "not read"}}
    assert measured_attainment(only) is None


def test_the_token_objectives_are_read_off_the_engines_histograms_named_in_its_profile() -> None:
    spec = slo_service().spec  # type: ignore[attr-defined]
    stated = replace(spec, slo=replace(spec.slo, time_to_first_token_p95_ms=300.0, inter_token_latency_p95_ms=40.0))
    (first, between) = token_objectives(stated, load_policies().runtimes)
    assert (first.key, first.latency_ms, first.failed) == ("timeToFirstToken", 300.0, True)
    assert first.selector == 'vllm:time_to_first_token_seconds_bucket{namespace="{{namespace}}",service="{{name}}"}'
    assert (between.key, between.bucket_metric, between.failed) == (
        "interTokenLatency", "vllm:inter_token_latency_seconds_bucket", False)
    assert token_objectives(spec, load_policies().runtimes) == ()
