from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from infer_ctl.core.conditions import find, rfc3339, set_condition

T0 = datetime(2026, 12, 2, 12, 0, 0, 123456, tzinfo=UTC)


def test_a_new_condition_starts_at_now_in_kubernetes_format() -> None:
    (c,) = set_condition((), type="Valid", status="True", reason="SpecValid", message="ok", now=T0, generation=3)
    assert c.last_transition_time == "2026-12-02T12:00:00Z"
    assert c.to_dict()["observedGeneration"] == 3


def test_the_transition_time_moves_only_when_the_status_changes() -> None:
    conds = set_condition((), type="Ready", status="False", reason="Loading", message="0/2", now=T0, generation=1)
    later = T0 + timedelta(minutes=3)
    same = set_condition(conds, type="Ready", status="False", reason="Loading", message="1/2", now=later,
                         generation=1)
    assert find(same, "Ready").last_transition_time == rfc3339(T0)  # type: ignore[union-attr]
    assert find(same, "Ready").message == "1/2"  # type: ignore[union-attr]
    flipped = set_condition(same, type="Ready", status="True", reason="Ready", message="2/2", now=later,
                            generation=1)
    assert find(flipped, "Ready").last_transition_time == rfc3339(later)  # type: ignore[union-attr]
    assert len(flipped) == 1


def test_other_conditions_are_kept_in_place() -> None:
    conds = set_condition((), type="Valid", status="True", reason="A", message="", now=T0, generation=1)
    conds = set_condition(conds, type="Ready", status="True", reason="B", message="", now=T0, generation=1)
    conds = set_condition(conds, type="Valid", status="False", reason="C", message="", now=T0, generation=2)
    assert [c.type for c in conds] == ["Valid", "Ready"]


def test_a_status_outside_the_convention_is_refused() -> None:
    with pytest.raises(ValueError, match="True, False or Unknown"):
        set_condition((), type="Ready", status="yes", reason="X", message="", now=T0, generation=1)
