from __future__ import annotations

import math

import pytest

from infer_ctl.core.api import ReplicaState
from infer_ctl.decide.decision import DecideInputs, DecidePolicy, DecideState, Reason, ReplicaView, decide


@pytest.mark.parametrize(
    ("min_replicas", "standby", "observed", "serving", "spare"),
    [
        pytest.param(3, 1, math.nan, 3, 1, id="minReplicas serve and the standby spare comes on top"),
        pytest.param(1, 1, 25.0, 3, 1, id="what the traffic needs serves, the spare stays out of traffic"),
        pytest.param(2, 0, 0.0, 2, 0, id="no preset spare means no standby"),
        pytest.param(9, 2, 0.0, 9, 1, id="at maxReplicas the standby spare goes first"),
    ],
)
def test_min_replicas_counts_serving_replicas(min_replicas: int, standby: int, observed: float, serving: int,
                                              spare: int) -> None:
    policy = DecidePolicy(target_rps_per_replica=10, min_replicas=min_replicas, max_replicas=10,
                          standby_replicas=standby)
    decision, _ = decide(DecideInputs(0.0, observed, (), 30.0, None), DecideState(), policy)
    assert (decision.serving, decision.standby) == (serving, spare)
    if observed == 0.0 and min_replicas > 1:
        assert decision.reason in (Reason.AT_MIN, Reason.AT_MAX)


def _ready(n: int) -> tuple[ReplicaView, ...]:
    return tuple(ReplicaView(f"r{i}", ReplicaState.SERVING, 0.0) for i in range(n))


@pytest.mark.parametrize(
    ("observed", "history", "standby", "reason", "split"),
    [
        pytest.param(math.nan, (), 0, Reason.HOLD_MISSING_METRICS, (7, 0),
                     id="replicas held while the rate is missing keep serving"),
        pytest.param(10.0, ((900.0, 7),), 0, Reason.STABILIZING, (7, 0),
                     id="replicas held by the stabilization window keep serving"),
        pytest.param(10.0, ((900.0, 7),), 1, Reason.STABILIZING, (6, 1),
                     id="held replicas keep serving and only the preset's spare is out of traffic"),
        pytest.param(math.nan, (), 2, Reason.HOLD_MISSING_METRICS, (5, 2),
                     id="with a rate missing the preset's spares stay spares, the rest serve"),
    ],
)
def test_only_the_presets_spares_leave_traffic(observed: float, history: tuple[tuple[float, int], ...],
                                              standby: int, reason: Reason, split: tuple[int, int]) -> None:
    policy = DecidePolicy(target_rps_per_replica=10, min_replicas=1, max_replicas=20, standby_replicas=standby)
    decision, _ = decide(DecideInputs(1000.0, observed, _ready(7), 30.0, None), DecideState(tuple(history)), policy)
    assert (decision.reason, (decision.serving, decision.standby)) == (reason, split), decision.message
