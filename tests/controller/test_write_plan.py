"""`Actuator.write_plan` alone, its writers replaced by recorders (a unit test of one piece: the order of the
writes, not what they write; the end-to-end tests of the sleeping tier write for real). A plan that wakes sleepers
creates its new replicas beside the wakes, not after them; a wake refused has the plan made again, on the Pods as
they are now when the first plan's replicas were written, and its creations written once."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from infer_ctl.controller.apply import Actuator

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
WAKE_S = 0.2  # what a wake takes here: the weights over the bus


def plan(name: str, *, create: int = 0, wake: tuple[str, ...] = (), displace: tuple[str, ...] = (),
         claims: tuple[str, ...] = ()) -> Any:
    placements = tuple(SimpleNamespace(claim=SimpleNamespace(claim={"metadata": {"name": c}})) for c in claims)
    return SimpleNamespace(name=name, create=tuple(range(create)), actions=SimpleNamespace(wake=wake),
                           displace=displace, placements=placements)


class Writers(Actuator):
    """The actuator with its writers replaced: records each write's start and end, in order; the moves of a plan
    with wakes take WAKE_S, and refuse the wakes named in `refuse` (once)."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:  # no client, view or units: none is used here
        self.log: list[str] = []
        self.refuse = set(refuse)
        self.unpinned: list[str] = []
        self.replanned: list[bool] = []
        self.assumptions = SimpleNamespace(unpin=lambda ns, name: self.unpinned.append(name))  # type: ignore[assignment]

    async def write_moves(self, body: Any, svc: Any, p: Any, *_: Any) -> list[str]:
        self.log.append(f"moves {p.name} start")
        if p.actions.wake:
            await asyncio.sleep(WAKE_S)
        refused = [w for w in p.actions.wake if w in self.refuse]
        self.refuse -= set(refused)
        self.log.append(f"moves {p.name} end")
        return refused

    async def write_new(self, svc: Any, memory: Any, p: Any, *_: Any) -> str:
        self.log.append(f"new {p.name} ({len(p.create)})")
        return ""

    async def replan(self, now_seen: bool) -> tuple[Any, dict[str, Any], dict[str, str]]:
        self.replanned.append(now_seen)
        return plan("again", create=1), {}, {}


async def write(writers: Writers, p: Any, new_hosts: dict[str, Any] | None = None) -> tuple[Any, frozenset[str], str]:
    svc = SimpleNamespace(meta=SimpleNamespace(namespace="default"))
    return await writers.write_plan({}, svc, None, p, (new_hosts or {}, {}), NOW,  # type: ignore[arg-type]
                                    orphaned=frozenset(), addresses={}, replan=writers.replan)


async def test_new_replicas_are_created_while_the_sleepers_wake_not_after() -> None:
    writers = Writers()
    written, woken, refused = await write(writers, plan("first", create=4, wake=("s1", "s2"), displace=("lender",)))
    assert writers.log == ["moves first start", "new first (4)", "moves first end"], writers.log
    assert written.name == "first" and woken == {"s1", "s2"} and refused == "" and writers.replanned == []


async def test_without_a_wake_the_moves_come_first() -> None:
    writers = Writers()
    await write(writers, plan("first", create=2))
    assert writers.log == ["moves first start", "moves first end", "new first (2)"], writers.log


async def test_a_wake_refused_beside_new_replicas_is_planned_again_on_the_pods_as_they_are() -> None:
    writers = Writers(refuse=("s2",))
    written, woken, _ = await write(writers, plan("first", create=1, wake=("s1", "s2"), claims=("c1",)),
                                    new_hosts={"host-1": {}})
    # the first plan's replica was written beside the wakes: the new plan sees it (replan(True)); nothing is
    # unpinned (its claim exists), and the new plan's creations are written once, after its moves
    assert writers.replanned == [True] and writers.unpinned == [], (writers.replanned, writers.unpinned)
    assert writers.log == ["moves first start", "new first (1)", "moves first end", "moves again start",
                           "moves again end", "new again (1)"], writers.log
    assert written.name == "again" and woken == {"s1", "s2"}


async def test_a_wake_refused_without_new_replicas_frees_the_first_plans_pins() -> None:
    writers = Writers(refuse=("s1",))
    await write(writers, plan("first", wake=("s1",), claims=("c1",)), new_hosts={"host-1": {}})
    assert writers.replanned == [False] and writers.unpinned == ["c1", "host-1"], writers.unpinned
    assert writers.log == ["moves first start", "moves first end", "moves again start", "moves again end",
                           "new again (1)"], writers.log
