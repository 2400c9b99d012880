"""Status conditions in the Kubernetes convention, updated as values.

`set_condition` keeps `lastTransitionTime` when a condition's status does not change (only its reason or
message may), as `meta.SetStatusCondition` does in apimachinery; `now` is given by the caller.
"""

from __future__ import annotations

from datetime import UTC, datetime

from infer_ctl.core.api import Condition


def rfc3339(now: datetime) -> str:
    """A timestamp as Kubernetes writes it: UTC, whole seconds, `Z`."""
    return now.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: tuple[Condition, ...], *, type: str, status: str, reason: str, message: str,
                  now: datetime, generation: int) -> tuple[Condition, ...]:
    """`conditions` with `type` set; its transition time moves only when its status changes."""
    if status not in ("True", "False", "Unknown"):
        raise ValueError(f"condition status must be True, False or Unknown, got {status!r}")
    previous = next((c for c in conditions if c.type == type), None)
    since = previous.last_transition_time if previous is not None and previous.status == status else rfc3339(now)
    updated = Condition(type=type, status=status, reason=reason, message=message, last_transition_time=since,
                        observed_generation=generation)
    if previous is None:
        return (*conditions, updated)
    return tuple(updated if c.type == type else c for c in conditions)


def find(conditions: tuple[Condition, ...], type: str) -> Condition | None:
    return next((c for c in conditions if c.type == type), None)
