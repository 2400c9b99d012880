from __future__ import annotations

import math

import pytest

from infer_ctl.decide.decision import DecideInputs, DecidePolicy, DecideState, Reason, decide


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
