"""The actuator alone (`infer_ctl.controller.apply`), its units real and the Kubernetes client, the view and the
model server fakes that record every call: the order in which a plan is written (what leaves traffic, then what
joins it, then the new replicas, then the orphan claims), a refused wake, and a new sleeper's warm host."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from infer_ctl.actuate.metrics import ControllerMetrics
from infer_ctl.controller.apply import Actuator
from infer_ctl.controller.assume import Assumptions
from infer_ctl.controller.clock import FakeClock
from infer_ctl.controller.events import FakeRecorder
from infer_ctl.controller.memory import ServiceMemory
from infer_ctl.controller.modelcache import ModelCacheMounts
from infer_ctl.controller.objects import KubeWrites
from infer_ctl.controller.observe import node_of
from infer_ctl.controller.settings import Settings
from infer_ctl.controller.sleepwake import WAKE_REFUSED_PERIODS, SleepWake
from infer_ctl.engine.cycle import CyclePlan, NewReplica
from infer_ctl.engine.replicas import ReplicaActions
from infer_ctl.kube.labels import LABEL_ROLE
from tests.controller.fakes import FakeEngine, FakeKube, FakeView, direct
from tests.controller.test_status import POLICIES, a_plan, service

T0 = datetime(2026, 12, 8, 1, 0, tzinfo=UTC)


class Rig:
    """An actuator over fakes, and what it was asked."""

    def __init__(self, engine: FakeEngine | None = None) -> None:
        self.kube, self.view, self.clock = FakeKube(), FakeView(), FakeClock(T0)
        self.events = FakeRecorder(self.clock)
        self.engine = engine or FakeEngine()
        self.settings = Settings(POLICIES)
        writes = KubeWrites(self.kube, direct, self.view)  # type: ignore[arg-type]
        self.sleepwake = SleepWake(self.engine, self.settings, self.events, writes, self.view,  # type: ignore[arg-type]
                                   self.clock)
        cache = ModelCacheMounts(self.kube, direct, self.settings, self.events, writes)  # type: ignore[arg-type]
        self.actuator = Actuator(self.kube, direct, self.view, self.settings, self.events, writes,  # type: ignore[arg-type]
                                 self.sleepwake, cache, Assumptions(self.view, self.settings, self.clock),  # type: ignore[arg-type]
                                 ControllerMetrics())
        self.memory = ServiceMemory()
        self.replanned: list[bool] = []

    async def write(self, plan: CyclePlan, *, again: CyclePlan | None = None, addresses: dict[str, str] | None = None,
                    orphaned: frozenset[str] = frozenset(), new_hosts: dict[str, dict[str, Any]] | None = None,
                    host_nodes: dict[str, str] | None = None) -> tuple[CyclePlan, frozenset[str], str]:
        async def replan(now_seen: bool) -> tuple[CyclePlan, dict[str, dict[str, Any]], dict[str, str]]:
            self.replanned.append(now_seen)
            assert again is not None, "planned again though no wake was refused"
            return again, {}, {}

        svc = service()
        return await self.actuator.write_plan(
            {"metadata": {"name": svc.meta.name, "namespace": svc.meta.namespace, "uid": svc.meta.uid}}, svc,
            self.memory, plan, (new_hosts or {}, host_nodes or {}), T0, orphaned=orphaned,
            addresses=addresses or {}, replan=replan)


def moves(**actions: Any) -> CyclePlan:
    plan, _ = a_plan(service(), actions=ReplicaActions(**actions), create=())
    return plan


async def test_a_plan_is_written_leaving_traffic_first_then_joining_it_then_the_orphan_claims() -> None:
    rig = Rig()
    plan = replace(moves(demote=("llm-r1",), sleep=("llm-r2",), remove=("llm-r3",), promote=("llm-r4",),
                         wake=("llm-r5",)),
                   release_claims=("llm-r3-gpu",), delete_claims=("llm-r9-gpu",))
    written, woken, refused = await rig.write(plan, addresses={"llm-r5": "10.0.0.5:8000"},
                                              orphaned=frozenset({"llm-r3"}))
    assert rig.kube.verbs("patch", "delete", "create") == [
        ("patch", "Pod", "llm-r1"), ("patch", "Pod", "llm-r2"), ("delete", "Pod", "llm-r3"),
        ("delete", "ResourceClaim", "llm-r3-gpu"), ("patch", "Pod", "llm-r4"), ("patch", "Pod", "llm-r5"),
        ("delete", "ResourceClaim", "llm-r9-gpu")]
    patches = {name: detail for verb, _, name, detail in rig.kube.calls if verb == "patch"}
    assert patches["llm-r1"]["metadata"]["labels"][LABEL_ROLE] == "standby"
    assert patches["llm-r2"]["metadata"]["annotations"] == {"infer-ctl.io/asleep": "true"}
    assert patches["llm-r4"]["metadata"]["labels"][LABEL_ROLE] == "serving"
    assert patches["llm-r5"]["metadata"]["annotations"]["infer-ctl.io/asleep"] is None  # woken, back in traffic
    # a Pod whose Node is gone is deleted at once; the others drain for their grace period
    assert [d for v, k, n, d in rig.kube.calls if v == "delete" and k == "Pod"] == [0]
    assert rig.engine.asked == [("wake", "10.0.0.5:8000")]  # llm-r2 has no address yet: no sleep asked
    assert written is plan and woken == {"llm-r5"} and refused == "" and rig.replanned == []


async def test_a_refused_wake_is_an_event_remembered_for_three_periods_and_the_plan_made_again() -> None:
    rig = Rig(FakeEngine(refuse_wake={"10.0.0.5:8000": "409 DeviceMemory"}))
    again = moves(promote=("llm-r4",))
    written, woken, _ = await rig.write(moves(wake=("llm-r5",)), again=again, addresses={"llm-r5": "10.0.0.5:8000"})
    assert rig.events.reasons() == ["WakeRefused"]
    why, until_s = rig.memory.wake_refused["llm-r5"]
    assert why == "409 DeviceMemory" and until_s == T0.timestamp() + WAKE_REFUSED_PERIODS * rig.settings.period_s
    # planned again from the Pods as the cycle began (nothing new was written beside the wake), and written
    assert rig.replanned == [False] and written is again and woken == {"llm-r5"}
    assert rig.kube.verbs("patch") == [("patch", "Pod", "llm-r4")]


async def test_a_new_sleepers_warm_host_is_created_before_its_pod_after_the_moves() -> None:
    rig = Rig()
    host = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "warm-node-1-gpu-0"}}
    plan = replace(moves(demote=("llm-r1",)),
                   create=(NewReplica("llm-r6", standby=True, sleeping=True, warm_host="warm-node-1-gpu-0"),))
    _, _, refused = await rig.write(plan, new_hosts={"warm-node-1-gpu-0": host},
                                    host_nodes={"warm-node-1-gpu-0": "node-1"})
    assert refused == ""
    assert rig.kube.verbs("patch", "create") == [
        ("patch", "Pod", "llm-r1"), ("create", "ResourceClaim", "warm-node-1-gpu-0"), ("create", "Pod", "llm-r6")]
    pod = rig.kube.objects[("Pod", "default", "llm-r6")]
    assert node_of(pod) == "node-1"  # on its warm host's node
    assert rig.events.reasons() == ["Placed"] and ("Pod", "llm-r6") in rig.view.wrote_objects


@pytest.mark.parametrize("status", [403, 422], ids=["forbidden", "invalid"])
async def test_a_refused_replica_stops_the_creations_and_says_why(status: int) -> None:
    from infer_ctl.kube.client import KubeError

    rig = Rig()
    rig.kube.refuse[("create", "Pod", "llm-r6")] = KubeError(status, "Refused", "denied by a webhook")
    host = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "warm-a"}}
    plan = replace(moves(), create=(NewReplica("llm-r6", standby=True, sleeping=True, warm_host="warm-a"),
                                    NewReplica("llm-r7", standby=True, sleeping=True, warm_host="warm-a")))
    _, _, refused = await rig.write(plan, new_hosts={"warm-a": host})
    assert refused == "the API server refused replica llm-r6: denied by a webhook"
    assert rig.kube.verbs("create") == [("create", "ResourceClaim", "warm-a"), ("create", "Pod", "llm-r6")]
    assert rig.events.reasons() == ["FailedCreate"]
