"""`plan_tiers`: the replica plan with the sleeping tier. A serving shortfall wakes sleepers before anything is
created, an awake replica the plan would remove goes to sleep while sleepers are short (only a ready, up-to-date
one on a warm host), a surplus of sleepers is removed, out-of-date sleepers are replaced; with no sleeper wanted
or held it is `plan_replicas` itself."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.core.api import ReplicaState as S
from infer_ctl.engine.replicas import Replica, ReplicaActions, plan_replicas, plan_tiers
from tests.engine.test_replicas import replica_lists_of, serving


def asleep(name: str, *, up_to_date: bool = True) -> Replica:
    return Replica(name, S.SLEEPING, standby=True, up_to_date=up_to_date)


def everywhere(_: str) -> bool:
    return True


CASES = [
    pytest.param([serving("a"), serving("b"), asleep("s1"), asleep("s2"), asleep("s3")], 4, 0, 2,
                 ReplicaActions(wake=("s3", "s2"), create_sleeping=1),
                 id="the docstring's example: a shortfall wakes sleepers, and the sleeper pool is refilled"),
    pytest.param([serving("a"), asleep("s1")], 3, 0, 0, ReplicaActions(create_serving=1, wake=("s1",)),
                 id="what the sleepers cannot cover is created"),
    pytest.param([serving("a"), serving("b"), serving("c")], 1, 0, 2, ReplicaActions(sleep=("a", "b")),
                 id="a surplus goes to sleep instead of being removed while sleepers are short"),
    pytest.param([serving("a"), serving("b"), serving("c")], 1, 0, 1, ReplicaActions(remove=("b",), sleep=("a",)),
                 id="beyond the sleepers wanted the surplus is removed"),
    pytest.param([serving("a"), asleep("s1"), asleep("s2")], 1, 0, 1, ReplicaActions(remove=("s1",)),
                 id="a surplus of sleepers is removed"),
    pytest.param([serving("a"), asleep("old", up_to_date=False)], 1, 0, 1,
                 ReplicaActions(remove=("old",), create_sleeping=1), id="an out-of-date sleeper is replaced"),
    pytest.param([serving("a"), serving("b", S.LOADING), serving("c")], 1, 0, 1,
                 ReplicaActions(sleep=("a",)),
                 id="a loading replica is neither removed nor put to sleep"),
]


@pytest.mark.parametrize(("replicas", "want_serving", "want_standby", "want_sleeping", "expected"), CASES)
def test_tier_actions(replicas: list[Replica], want_serving: int, want_standby: int, want_sleeping: int,
                      expected: ReplicaActions) -> None:
    assert plan_tiers(replicas, want_serving, want_standby, want_sleeping, on_warm_host=everywhere) == expected


def test_only_a_replica_on_a_warm_host_can_sleep() -> None:
    actions = plan_tiers([serving("a"), serving("b"), serving("c")], 1, 0, 2, on_warm_host=lambda n: n == "b")
    assert actions.sleep == ("b",) and actions.remove == ("a",) and actions.create_sleeping == 1


@given(replica_lists_of(list(S)), st.integers(0, 6), st.integers(0, 3))
def test_without_the_sleeping_tier_it_is_plan_replicas(replicas: list[Replica], want_serving: int,
                                                       want_standby: int) -> None:
    awake = [r for r in replicas if r.state is not S.SLEEPING]
    assert plan_tiers(awake, want_serving, want_standby, 0, on_warm_host=everywhere) == \
        plan_replicas(awake, want_serving, want_standby)


@given(replica_lists_of(list(S)), st.integers(0, 6), st.integers(0, 3), st.integers(0, 4),
       st.sets(st.text("abcdefgh", max_size=3)))
def test_invariants(replicas: list[Replica], want_serving: int, want_standby: int, want_sleeping: int,
                    warm: set[str]) -> None:
    actions = plan_tiers(replicas, want_serving, want_standby, want_sleeping, on_warm_host=warm.__contains__)
    by_name = {r.name: r for r in replicas}
    touched = [*actions.promote, *actions.demote, *actions.remove, *actions.wake, *actions.sleep]
    assert len(touched) == len(set(touched)), "a replica gets at most one action"
    assert all(by_name[n].state is S.SLEEPING and by_name[n].up_to_date for n in actions.wake)
    assert all(n in warm and by_name[n].up_to_date and by_name[n].state in (S.SERVING, S.STANDBY)
               for n in actions.sleep)
    assert all(by_name[n].state is not S.LOADING for n in actions.remove), "never remove a loading replica"
    # the sleepers after the plan are exactly those wanted
    sleepers = [r for r in replicas if r.state is S.SLEEPING]
    after = (len(sleepers) - len(actions.wake) - sum(by_name[n].state is S.SLEEPING for n in actions.remove)
             + len(actions.sleep) + actions.create_sleeping)
    assert after == want_sleeping
    # a wake replaces a creation, never adds to it: serving short by as much as without sleepers, or less
    base = plan_replicas([r for r in replicas if r.state is not S.SLEEPING], want_serving, want_standby)
    assert actions.create_serving + len(actions.wake) == base.create_serving


def test_a_sleeper_within_its_first_load_is_not_surplus() -> None:
    # the forecast moved one cycle after the sleepers were made: 3 loading, 1 wanted; the old code removed 2 of
    # them (their load paid), now they are kept until loaded, and no sleeper is created meanwhile
    replicas = [serving("a"), asleep("s1"), asleep("s2"), asleep("s3")]
    starting = frozenset({"s1", "s2", "s3"})
    actions = plan_tiers(replicas, 1, 0, 1, on_warm_host=everywhere, starting=starting)
    assert actions == ReplicaActions()
    # a loaded sleeper is surplus before a loading one
    actions = plan_tiers([*replicas, asleep("s4")], 1, 0, 1, on_warm_host=everywhere, starting=starting)
    assert actions == ReplicaActions(remove=("s4",))


def test_a_loading_sleeper_goes_when_out_of_date_or_paused() -> None:
    replicas = [serving("a"), asleep("s1"), asleep("old", up_to_date=False)]
    starting = frozenset({"s1", "old"})
    assert plan_tiers(replicas, 1, 0, 1, on_warm_host=everywhere, starting=starting).remove == ("old",)
    paused = plan_tiers(replicas, 1, 0, 0, on_warm_host=everywhere, starting=starting, hold_starting=False)
    assert set(paused.remove) == {"old", "s1"}


NAMES = st.sets(st.text("abcdefgh", max_size=3))


@given(replica_lists_of(list(S)), st.integers(0, 6), st.integers(0, 3), st.integers(0, 4), st.tuples(NAMES, NAMES))
def test_loading_sleepers_stay_and_the_sleepers_wanted_are_kept(replicas: list[Replica], want_serving: int,
                                                                want_standby: int, want_sleeping: int,
                                                                warm_and_loading: tuple[set[str], set[str]]) -> None:
    warm, loading = warm_and_loading
    starting = frozenset(r.name for r in replicas if r.state is S.SLEEPING and r.name in loading)
    actions = plan_tiers(replicas, want_serving, want_standby, want_sleeping, on_warm_host=warm.__contains__,
                         starting=starting)
    by_name = {r.name: r for r in replicas}
    assert not set(actions.wake) & starting, "a sleeper still loading is never woken"
    assert all(not by_name[n].up_to_date for n in actions.remove if n in starting), \
        "a sleeper within its first load is removed only when out of date"
    sleepers = [r for r in replicas if r.state is S.SLEEPING]
    after = (len(sleepers) - len(actions.wake) - sum(by_name[n].state is S.SLEEPING for n in actions.remove)
             + len(actions.sleep) + actions.create_sleeping)
    held = sum(by_name[n].up_to_date for n in starting)
    # never fewer sleepers than wanted (demotion never below the forecast's need); more only by loading ones
    assert want_sleeping <= after <= max(want_sleeping, held + len(actions.sleep))
    assert actions.create_sleeping == 0 or after == want_sleeping
