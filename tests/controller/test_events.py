"""The Event recorder alone (`infer_ctl.controller.events`), over a fake client and a clock moved by hand: one
Event for a repeating condition, its series written at most every EVENT_SERIES_WRITE_S, a new Event once the
window passed or the Event expired, and a refused post never failing the caller."""

from __future__ import annotations

from datetime import UTC, datetime

from infer_ctl.controller.clock import FakeClock
from infer_ctl.controller.events import (
    EVENT_NOTE_MAX,
    EVENT_SERIES_WINDOW_S,
    EVENT_SERIES_WRITE_S,
    EventRecorder,
    FakeRecorder,
)
from infer_ctl.kube.client import KubeError
from tests.controller.fakes import FakeKube, direct

T0 = datetime(2026, 12, 8, 1, 0, tzinfo=UTC)
SVC = {"apiVersion": "infer-ctl.io/v1alpha1", "kind": "InferenceService",
       "metadata": {"name": "llm", "namespace": "default", "uid": "uid-llm"}}


def recorder() -> tuple[EventRecorder, FakeKube, FakeClock]:
    kube, clock = FakeKube(), FakeClock(T0)
    return EventRecorder(kube, direct, clock), kube, clock  # type: ignore[arg-type]


async def test_a_repeating_event_is_posted_once_and_counted_in_its_series_every_five_minutes() -> None:
    events, kube, clock = recorder()
    for _ in range(121):  # every 10 s for 20 min
        await events.record(SVC, "PlacementFailed", "1 replica(s) cannot be placed", "Warning", "Place")
        clock.step(10)
    assert [c[0] for c in kube.calls].count("event") == 1
    # written when 5 min passed since the last write: at 5, 10, 15 and 20 min, counting every occurrence
    assert [c[3][0] for c in kube.calls if c[0] == "series"] == [31, 61, 91, 121]
    assert EVENT_SERIES_WRITE_S == 300.0


async def test_another_note_or_reason_is_another_event() -> None:
    events, kube, _ = recorder()
    await events.record(SVC, "Scaled", "1 -> 2", "Normal", "Scale")
    await events.record(SVC, "Scaled", "2 -> 3", "Normal", "Scale")
    await events.record(SVC, "Placed", "1 -> 2", "Normal", "Place")
    assert [c[3][:2] for c in kube.calls if c[0] == "event"] == [
        ("Scaled", "1 -> 2"), ("Scaled", "2 -> 3"), ("Placed", "1 -> 2")]


async def test_an_event_is_posted_anew_once_its_window_passed_without_it() -> None:
    events, kube, clock = recorder()
    await events.record(SVC, "MetricsUnavailable", "no rate", "Warning", "ReadMetrics")
    clock.step(EVENT_SERIES_WINDOW_S - 1)
    await events.record(SVC, "MetricsUnavailable", "no rate", "Warning", "ReadMetrics")  # counted
    clock.step(EVENT_SERIES_WINDOW_S)
    await events.record(SVC, "MetricsUnavailable", "no rate", "Warning", "ReadMetrics")  # a new one
    assert [c[0] for c in kube.calls] == ["event", "series", "event"]


async def test_an_expired_event_is_posted_anew_the_next_time() -> None:
    events, kube, clock = recorder()
    await events.record(SVC, "NameTaken", "Pod llm-r0 exists", "Warning", "Create")
    clock.step(EVENT_SERIES_WRITE_S)
    kube.refuse[("series", "Event", "llm.1")] = KubeError(404, "NotFound", "events.events.k8s.io llm.1 not found")
    await events.record(SVC, "NameTaken", "Pod llm-r0 exists", "Warning", "Create")  # its TTL passed: no error
    clock.step(10)
    await events.record(SVC, "NameTaken", "Pod llm-r0 exists", "Warning", "Create")
    assert [c[0] for c in kube.calls] == ["event", "series", "event"]


async def test_a_refused_post_is_a_log_line_not_a_failure() -> None:
    events, kube, _ = recorder()
    kube.refuse[("event", "Event", "Scaled")] = KubeError(403, "Forbidden", "events is forbidden")
    await events.record(SVC, "Scaled", "1 -> 2", "Normal", "Scale")  # does not raise
    await events.record(SVC, "Scaled", "1 -> 2", "Normal", "Scale")  # not remembered as posted: posted now
    assert [c[0] for c in kube.calls] == ["event"]


async def test_the_note_is_cut_to_the_api_limit_and_the_time_is_the_callers_or_the_clocks() -> None:
    events, kube, clock = recorder()
    await events.record(SVC, "InvalidSpec", "x" * 5000, "Warning", "Validate")
    cycle_at = T0.replace(hour=3)
    await events.record(SVC, "Scaled", "1 -> 2", "Normal", "Scale", cycle_at)
    (_, note, at), (_, _, then) = [c[3] for c in kube.calls if c[0] == "event"]
    assert len(note) == EVENT_NOTE_MAX and at == clock.now() and then == cycle_at


async def test_the_fake_recorder_remembers_what_it_was_asked_in_order() -> None:
    clock = FakeClock(T0)
    fake = FakeRecorder(clock)
    await fake.record(SVC, "Scaled", "1 -> 2", "Normal", "Scale")
    clock.step(5)
    await fake.record(SVC, "Scaled", "1 -> 2", "Normal", "Scale")
    assert fake.reasons() == ["Scaled", "Scaled"] and [r.at for r in fake.recorded] == [T0, clock.now()]
