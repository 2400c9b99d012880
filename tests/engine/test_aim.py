"""The aim moved along the calibrated ladder from the measured attainment (`infer_ctl.engine.aim`), alone and in
`plan_cycle`: in-memory values, time moved by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infer_ctl.core.slo import Attainment
from infer_ctl.engine.aim import AimState, RecordedAim, Rung, adapt, ladder, resume
from infer_ctl.engine.cycle import CyclePolicies, CycleState, plan_cycle, service_policy
from tests.engine.test_cycle import CYCLE, POLICIES, T0, observe, ready, service

RUNGS = (Rung(0.8, 300), Rung(0.95, 300), Rung(0.99, 600))
# the shipped aimHeadroom: the top aim with capacity for 1.25 .. 3 times the forecast
LADDER = (*RUNGS, *(Rung(0.99, 600, h) for h in (1.25, 1.5, 2, 2.5, 3)))
HOUR = 3600.0


def measured(share: float, requests: float = 10_000) -> Attainment:
    return Attainment(share, requests, HOUR)


def test_the_ladder_is_the_tables_distinct_aims_lowest_first_then_its_top_with_headroom() -> None:
    assert ladder(POLICIES.scaling.aims) == RUNGS
    assert POLICIES.scaling.aim_headroom == (1.25, 1.5, 2, 2.5, 3)
    assert ladder(POLICIES.scaling.aims, POLICIES.scaling.aim_headroom) == LADDER
    assert ladder((), (2.0,)) == ()


def test_a_service_starts_at_the_rung_calibrated_for_its_objective() -> None:
    assert adapt(AimState(), RUNGS, 1, 0.99, None, now_s=T0, window_s=HOUR) == AimState(1, T0)


@pytest.mark.parametrize(("share", "rung"), [
    (0.985, 2),  # below 99 %: up
    (0.99, 1),  # at the objective, missing more than half the allowance: stays
    (0.9949, 1),
    (0.995, 0),  # missing at most half of the 1 % allowed: down
    (1.0, 0),
])
def test_after_a_window_below_the_objective_it_steps_up_and_well_above_it_steps_down(share: float, rung: int) -> None:
    aim = adapt(AimState(1, T0), RUNGS, 1, 0.99, measured(share), now_s=T0 + HOUR, window_s=HOUR)
    assert aim.rung == rung
    assert (aim.since_s == T0 + HOUR) == (rung != 1)
    if rung != 1:
        assert aim.note.startswith(f"aim {'up' if rung > 1 else 'down'} to q{RUNGS[rung].quantile:g}")


def test_it_waits_a_whole_window_of_the_current_aim_and_enough_requests() -> None:
    low = measured(0.5)
    # a direct scrape's measure covers only the time since the controller started: 10 minutes do not move it
    short = Attainment(0.5, 10_000, 600.0)
    assert adapt(AimState(1, T0), RUNGS, 1, 0.99, short, now_s=T0 + HOUR, window_s=HOUR).rung == 1
    assert adapt(AimState(1, T0), RUNGS, 1, 0.99, low, now_s=T0 + HOUR - 1, window_s=HOUR).rung == 1
    assert adapt(AimState(1, T0), RUNGS, 1, 0.99, measured(0.5, requests=999), now_s=T0 + HOUR, window_s=HOUR).rung == 1
    assert adapt(AimState(1, T0), RUNGS, 1, 0.99, Attainment(None, 0, HOUR), now_s=T0 + HOUR, window_s=HOUR).rung == 1
    assert adapt(AimState(1, T0), RUNGS, 1, 0.99, None, now_s=T0 + HOUR, window_s=HOUR).rung == 1


def test_the_ends_of_the_ladder_hold() -> None:
    assert adapt(AimState(2, T0), RUNGS, 1, 0.99, measured(0.5), now_s=T0 + HOUR, window_s=HOUR) == AimState(2, T0)
    assert adapt(AimState(0, T0), RUNGS, 1, 0.99, measured(1.0), now_s=T0 + HOUR, window_s=HOUR) == AimState(0, T0)


ADAPTIVE = CyclePolicies(replace(POLICIES, scaling=replace(POLICIES.scaling, adapt_aim=True)), CYCLE.placement)
FIXED = CyclePolicies(replace(POLICIES, scaling=replace(POLICIES.scaling, adapt_aim=False)), CYCLE.placement)


def test_the_shipped_policies_move_the_aim_and_a_file_without_a_table_does_not() -> None:
    import yaml

    from infer_ctl.core.errors import SpecError
    from infer_ctl.core.policy import parse_scaling_policy
    from tests.engine.test_cycle import ROOT

    assert POLICIES.scaling.adapt_aim
    doc = yaml.safe_load((ROOT / "policies" / "scaling.yaml").read_text())
    del doc["adaptAim"]
    assert parse_scaling_policy(doc).adapt_aim  # unstated: on, with a table and a histogram
    assert not parse_scaling_policy({**doc, "latencyHistogram": ""}).adapt_aim
    with pytest.raises(SpecError, match=r"adaptAim: .*needs both"):
        parse_scaling_policy({**doc, "latencyHistogram": "", "adaptAim": True})


def slo_service(**fields: object) -> object:
    return service(spec__slo={"latencyP95Ms": 500}, spec__scaling__preset="balanced", **fields)


def test_only_a_service_with_a_latency_objective_and_the_aim_unstated_moves() -> None:
    assert service_policy(slo_service().spec, ADAPTIVE).aim_rungs == LADDER  # type: ignore[attr-defined]
    assert service_policy(slo_service().spec, ADAPTIVE).aim_start == 1  # type: ignore[attr-defined]
    assert not service_policy(slo_service().spec, FIXED).aim_rungs  # type: ignore[attr-defined]  # adaptAim off
    assert not service_policy(service().spec, ADAPTIVE).aim_rungs  # no latency to measure against
    pinned = slo_service(spec__scaling__forecast={"quantile": 0.9})
    assert not service_policy(pinned.spec, ADAPTIVE).aim_rungs  # type: ignore[attr-defined]
    window = slo_service(spec__scaling__scaleDownStabilizationSeconds=60)
    assert not service_policy(window.spec, ADAPTIVE).aim_rungs  # type: ignore[attr-defined]


def test_in_the_cycle_the_aim_moves_the_stabilization_and_refits_the_forecast_at_the_new_quantile() -> None:
    svc = slo_service()
    replicas = (ready("llm-r0"), ready("llm-r1"))
    state = CycleState()
    for i in range(0, int(HOUR), 30):  # an hour of a steady rate: a forecast at the calibrated q0.95
        plan, state = plan_cycle(observe(svc, *replicas, rate=5.0 + i % 7, now=T0 + i), state, ADAPTIVE,  # type: ignore[arg-type]
                                 T0 + i)
        assert state.aim == AimState(1, T0)
    assert plan.output.forecast is not None and plan.output.forecast.quantile == 0.95
    # an hour on, 98 % of 10,000 requests within the SLO: up to q0.99 / 600 s, said in the decision's message
    now = T0 + HOUR
    observation = replace(observe(svc, *replicas, rate=5.0, now=now), attainment=measured(0.98))  # type: ignore[arg-type]
    plan, after = plan_cycle(observation, state, ADAPTIVE, now)
    assert after.aim.rung == 2 and after.aim.since_s == now
    assert "aim up to q0.99 / 600 s: 98.00 % of 10000 requests within the SLO over the last 3600 s (below the " \
           "objective, 99 %)" in plan.message
    # the forecast was refitted this cycle at the new quantile
    assert plan.output.forecast is not None and plan.output.forecast.quantile == 0.99
    # the next cycle holds it (a whole window must pass under the new aim) and says nothing more
    later = replace(observe(svc, *replicas, rate=5.0, now=now + 10), attainment=measured(0.98))  # type: ignore[arg-type]
    plan, held = plan_cycle(later, after, ADAPTIVE, now + 10)
    assert held.aim == after.aim and "aim up" not in plan.message


def test_a_recorded_aim_is_resumed_on_the_first_cycle_and_moves_a_window_after_its_own_move() -> None:
    recorded = RecordedAim(0.99, 600, T0 - HOUR / 2, "aim up to q0.99 / 600 s: ...")
    resumed = adapt(AimState(), RUNGS, 1, 0.99, measured(1.0), now_s=T0, window_s=HOUR, recorded=recorded)
    assert resumed == AimState(2, T0 - HOUR / 2, recorded.note)
    # the window counts from the recorded move, not from the restart
    assert adapt(resumed, RUNGS, 1, 0.99, measured(1.0), now_s=T0 + HOUR / 2 - 1, window_s=HOUR).rung == 2
    assert adapt(resumed, RUNGS, 1, 0.99, measured(1.0), now_s=T0 + HOUR / 2, window_s=HOUR).rung == 1
    # only on the first cycle: a running controller's own state wins over what the status said
    assert adapt(AimState(0, T0), RUNGS, 1, 0.99, None, now_s=T0, window_s=HOUR, recorded=recorded) == AimState(0, T0)


def test_a_recorded_aim_that_is_no_rung_or_from_another_clock() -> None:
    # the table was edited: no rung q0.9 / 300 s any more, the calibrated rung
    assert resume(RecordedAim(0.9, 300, T0), RUNGS, T0) is None
    assert adapt(AimState(), RUNGS, 1, 0.99, None, now_s=T0, window_s=HOUR,
                 recorded=RecordedAim(0.9, 300, T0 - HOUR)) == AimState(1, T0)
    assert resume(RecordedAim(0.95, 600, T0), RUNGS, T0) is None  # a quantile of the table with another window
    # a since in the future (another clock): counted from now, so a whole window passes before a move
    assert resume(RecordedAim(0.8, 300, T0 + HOUR), RUNGS, T0) == AimState(0, T0)


def test_in_the_cycle_a_recorded_aim_sizes_the_first_decision() -> None:
    svc = slo_service()
    replicas = (ready("llm-r0"), ready("llm-r1"))
    observation = replace(observe(svc, *replicas, rate=5.0, now=T0),  # type: ignore[arg-type]
                          recorded_aim=RecordedAim(0.99, 600, T0 - HOUR / 2))
    plan, state = plan_cycle(observation, CycleState(), ADAPTIVE, T0)
    assert state.aim == AimState(2, T0 - HOUR / 2)
    # the rung's stabilization (the calibrated rung's is 300 s; no forecast yet on a first cycle without history)
    assert plan.output.decision.message == "1 wanted, holding 2 (highest recommendation in the last 600 s is 2)"
    assert "aim " not in plan.message


def test_above_the_tables_top_a_service_below_its_objective_climbs_the_headroom_rungs_and_comes_back() -> None:
    aim = adapt(AimState(2, T0), LADDER, 1, 0.99, measured(0.95), now_s=T0 + HOUR, window_s=HOUR)
    assert aim.rung == 3 and aim.note.startswith("aim up to q0.99 / 600 s x1.25: 95.00 % of 10000 requests")
    top = adapt(AimState(7, T0), LADDER, 1, 0.99, measured(0.95), now_s=T0 + HOUR, window_s=HOUR)
    assert top == AimState(7, T0)  # x3 is the top: it stays
    down = adapt(AimState(7, T0), LADDER, 1, 0.99, measured(0.999), now_s=T0 + HOUR, window_s=HOUR)
    assert down.rung == 6 and down.note.startswith("aim down to q0.99 / 600 s x2.5: ")


def test_at_a_headroom_rung_the_replicas_hold_that_many_times_the_forecast() -> None:
    svc = slo_service(spec__scaling__targetRequestsPerReplica=10, spec__scaling__maxReplicas=50)
    replicas = tuple(ready(f"llm-r{i}") for i in range(4))
    sized = {}
    for rung in (2, 5):  # q0.99 / 600 s, then the same with x2
        state = CycleState(aim=AimState(rung, T0))
        plan, _ = plan_cycle(observe(svc, *replicas, rate=40.0, now=T0 + 10), state, ADAPTIVE,  # type: ignore[arg-type]
                             T0 + 10)
        sized[rung] = plan.output.decision.serving
    assert sized == {2: 4, 5: 8}, sized  # 40 req/s at 10 per replica; at x2, 5 per replica


def test_a_recorded_headroom_rung_is_resumed_and_one_the_ladder_has_not_is_not() -> None:
    assert resume(RecordedAim(0.99, 600, T0, headroom=2), LADDER, T0) == AimState(5, T0)
    assert resume(RecordedAim(0.99, 600, T0, headroom=4), LADDER, T0) is None
    assert resume(RecordedAim(0.99, 600, T0, headroom=2), RUNGS, T0) is None  # aimHeadroom emptied
