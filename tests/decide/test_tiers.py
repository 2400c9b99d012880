"""The warm-tier ladder (infer_ctl/decide/tiers.py): the docstring's example, and properties over any needs and
room: coverage is never lost (a shortfall passes up, it is not dropped), no tier holds more than its room, the
plan is the cheapest one that covers every horizon, and more room never costs more."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.decide.tiers import Room, Tier, TierPlan, TierTimes, horizons, ladder

ALL = frozenset(Tier)
COST = {"awake": 1000, "sleeping": 10, "cached": 1}  # per replica: a GPU >> host memory >> disk


def test_the_docstring_example() -> None:
    times = TierTimes(wake_s=3, cached_s=20, cold_s=120)
    h = horizons(times, 10, ALL)
    assert h == {Tier.STANDBY: 13, Tier.SLEEPING: 30, Tier.CACHED: 130}
    plan = ladder({Tier.STANDBY: 4, Tier.SLEEPING: 6, Tier.CACHED: 9}, Room(sleeping=1, cached=5))
    assert (plan.awake, plan.sleeping, plan.cached) == (5, 1, 3)
    assert plan.passed_up == ((Tier.SLEEPING, 1),)
    assert plan.message == "5 awake, 1 sleeping, 3 from node caches; 1 passed up from sleeping (no room)"


@pytest.mark.parametrize(("allowed", "expected"), [
    (frozenset({Tier.SERVING, Tier.STANDBY}), {Tier.STANDBY: 130}),  # no slow tier: awake covers the cold start
    (frozenset({Tier.SLEEPING}), {Tier.STANDBY: 13, Tier.SLEEPING: 130}),
    (frozenset({Tier.CACHED}), {Tier.STANDBY: 30, Tier.CACHED: 130}),
])
def test_each_held_tier_covers_until_the_next_allowed_slower_one_could_serve(
        allowed: frozenset[Tier], expected: dict[Tier, float]) -> None:
    assert horizons(TierTimes(3, 20, 120), 10, allowed) == expected


def test_times_must_be_ordered_and_needs_not_negative() -> None:
    with pytest.raises(ValueError, match="wake_s <= cached_s"):
        TierTimes(wake_s=30, cached_s=20, cold_s=120)
    with pytest.raises(ValueError, match="negative"):
        ladder({Tier.STANDBY: -1}, Room())
    with pytest.raises(ValueError, match="awake tier"):
        ladder({Tier.SLEEPING: 1}, Room(sleeping=1))


needs_st = st.lists(st.integers(0, 12), min_size=1, max_size=3)
room_st = st.builds(Room, sleeping=st.integers(0, 12), cached=st.integers(0, 12))
tiers_st = st.sampled_from([(Tier.STANDBY,), (Tier.STANDBY, Tier.SLEEPING), (Tier.STANDBY, Tier.CACHED),
                            (Tier.STANDBY, Tier.SLEEPING, Tier.CACHED)])


def as_needs(tiers: tuple[Tier, ...], values: list[int]) -> dict[Tier, int]:
    values = (values * 3)[:len(tiers)]
    return dict(zip(tiers, values, strict=True))


def covered(needs: dict[Tier, int], awake: int, sleeping: int, cached: int) -> bool:
    """Every horizon's need is met by the tiers fast enough for it."""
    have = {Tier.STANDBY: awake, Tier.SLEEPING: awake + sleeping, Tier.CACHED: awake + sleeping + cached}
    return all(have[t] >= max(n for u, n in needs.items() if list(needs).index(u) <= list(needs).index(t))
               for t in needs)


@given(tiers=tiers_st, values=needs_st, room=room_st)
def test_coverage_is_never_lost_and_room_never_exceeded(tiers: tuple[Tier, ...], values: list[int],
                                                        room: Room) -> None:
    needs = as_needs(tiers, values)
    plan = ladder(needs, room)
    assert covered(needs, plan.awake, plan.sleeping, plan.cached)
    assert plan.sleeping <= room.sleeping and plan.cached <= room.cached
    assert (plan.sleeping == 0 or Tier.SLEEPING in needs) and (plan.cached == 0 or Tier.CACHED in needs)
    # nothing is held beyond the longest horizon's need
    assert plan.awake + plan.sleeping + plan.cached == max(needs.values())


@given(tiers=tiers_st, values=needs_st, room=room_st)
def test_the_plan_is_the_cheapest_that_covers_every_horizon(tiers: tuple[Tier, ...], values: list[int],
                                                            room: Room) -> None:
    needs = as_needs(tiers, values)
    plan = ladder(needs, room)
    top = max(needs.values())
    sleep_max = room.sleeping if Tier.SLEEPING in needs else 0
    cache_max = room.cached if Tier.CACHED in needs else 0
    best = min(COST["awake"] * a + COST["sleeping"] * s + COST["cached"] * c
               for a, s, c in itertools.product(range(top + 1), range(sleep_max + 1), range(cache_max + 1))
               if covered(needs, a, s, c))
    assert COST["awake"] * plan.awake + COST["sleeping"] * plan.sleeping + COST["cached"] * plan.cached == best


@given(tiers=tiers_st, values=needs_st, room=room_st, more=st.integers(1, 5))
def test_more_room_never_adds_awake_replicas(tiers: tuple[Tier, ...], values: list[int], room: Room,
                                             more: int) -> None:
    needs = as_needs(tiers, values)
    base = ladder(needs, room)
    for bigger in (Room(room.sleeping + more, room.cached), Room(room.sleeping, room.cached + more)):
        assert ladder(needs, bigger).awake <= base.awake


def test_awake_replicas_on_warm_hosts_are_room_for_sleepers_once_not_needed_awake() -> None:
    # 1 awake on a GPU of its own, 2 awake on warm hosts, no other room: as the need falls from 3 to 1 the two on
    # warm hosts can sleep where they are (the one elsewhere stays awake first)
    room = Room(sleeping=0, in_place=2, awake_elsewhere=1)
    assert [room.sleeping_room(awake) for awake in (3, 2, 1, 0)] == [0, 1, 2, 2]
    assert ladder({Tier.STANDBY: 1, Tier.SLEEPING: 3}, room) == TierPlan(awake=1, sleeping=2, cached=0)
    # all three needed awake: nothing sleeps, the slots are theirs
    assert ladder({Tier.STANDBY: 3, Tier.SLEEPING: 5}, room).sleeping == 0
    # new room adds to it
    assert Room(sleeping=1, in_place=2, awake_elsewhere=1).sleeping_room(2) == 2


def test_the_window_holds_what_there_is_the_docstring_example() -> None:
    # 5 of 11 needed awake (8 on GPUs of their own, 3 on warm hosts), 1 sleeper, a window of 14
    room = Room(sleeping=5, in_place=3, awake_elsewhere=8, asleep=1)
    assert room.window_hold(5, 11, 14, 20) == (12, 3)
    assert room.window_hold(5, 11, 14, 6) == (10, 1)  # maxReplicas 6: one held awake
    assert room.window_hold(0, 11, 14, 0) == (4, 0)  # scaling to zero: only what sleeps, or can, is held
    # a window of 4 with 1 replica and nothing else: nothing to hold, and no sleeper loaded to hold it
    assert Room(sleeping=5, awake_elsewhere=1).window_hold(1, 1, 4, 20) == (1, 0)


@given(awake=st.integers(0, 10), elsewhere=st.integers(0, 10), in_place=st.integers(0, 10),
       asleep=st.integers(0, 10), window=st.integers(0, 30), most=st.integers(0, 20))
def test_the_window_never_holds_more_than_it_remembers_nor_loads_a_sleeper_for_it(  # noqa: PLR0917
        awake: int, elsewhere: int, in_place: int, asleep: int, window: int, most: int) -> None:
    current = elsewhere + in_place
    room = Room(in_place=in_place, awake_elsewhere=elsewhere, asleep=asleep)
    held, held_awake = room.window_hold(awake, current, window, most)
    assert held <= window and held_awake >= 0
    assert held_awake <= max(0, most - awake)  # never beyond maxReplicas awake, none when scaling to zero
    # kept awake: only replicas on GPUs of their own beyond the awake need (they cannot sleep where they are)
    assert held_awake <= max(0, elsewhere - awake)
    # the replicas there are, never more: the awake need, the sleepers, the surplus that can sleep where it is,
    # and the surplus kept awake
    there = awake + asleep + min(in_place, max(0, current - awake))
    assert held <= there + held_awake
    # and all of those there are asleep or can sleep, up to what the window remembers
    assert held >= min(window, there)
