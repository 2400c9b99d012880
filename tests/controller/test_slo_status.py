"""status.slo's aim: the quantile and stabilization the scaling runs with, when they move with the attainment."""

from __future__ import annotations

from dataclasses import replace

from infer_ctl.controller.reconciler import _with_aim
from infer_ctl.core import api
from infer_ctl.engine.aim import AimState
from infer_ctl.engine.cycle import CycleState, service_policy
from tests.engine.test_aim import ADAPTIVE, FIXED, slo_service

SLO = api.SloStatus(objective=0.99, latency_ms=500, window_s=3600, attainment=0.98, requests=10_000)


def test_the_aim_is_shown_where_it_moves_with_its_last_move() -> None:
    spec = slo_service().spec  # type: ignore[attr-defined]
    state = CycleState(resolved=(spec, service_policy(spec, ADAPTIVE)), aim=AimState(1, 0.0))
    assert _with_aim(SLO, state) == replace(SLO, aim="q0.95 / 300 s (as calibrated for the objective)")
    moved = replace(state, aim=AimState(2, 3600.0, "aim up to q0.99 / 600 s: 98.00 % of ..."))
    assert _with_aim(SLO, moved).aim == "q0.99 / 600 s (last moved: aim up to q0.99 / 600 s: 98.00 % of ...)"  # type: ignore[union-attr]


def test_no_aim_is_shown_where_it_does_not_move_or_nothing_was_measured() -> None:
    spec = slo_service().spec  # type: ignore[attr-defined]
    fixed = CycleState(resolved=(spec, service_policy(spec, FIXED)), aim=AimState())
    assert _with_aim(SLO, fixed) == SLO
    assert _with_aim(None, CycleState()) is None
