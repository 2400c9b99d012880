from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.core.api import ReplicaState as S
from infer_ctl.engine.replicas import Replica, ReplicaActions, plan_replicas


def serving(name: str, state: S = S.SERVING, *, up_to_date: bool = True) -> Replica:
    return Replica(name, state, standby=False, up_to_date=up_to_date)


def standby(name: str, state: S = S.STANDBY, *, up_to_date: bool = True) -> Replica:
    return Replica(name, state, standby=True, up_to_date=up_to_date)


CASES = [
    pytest.param([serving("a")], 1, 0, ReplicaActions(), id="nothing to do when the counts match"),
    pytest.param([serving("a")], 3, 0, ReplicaActions(create_serving=2), id="serving short creates serving"),
    pytest.param([serving("a"), standby("s")], 2, 0, ReplicaActions(promote=("s",)),
                 id="a warm standby is promoted before anything is created"),
    pytest.param([serving("a"), standby("s")], 2, 1, ReplicaActions(create_standby=1, promote=("s",)),
                 id="a promoted standby is replaced to keep the standby pool"),
    pytest.param([serving("a"), standby("s", S.LOADING)], 2, 0, ReplicaActions(create_serving=1),
                 id="a loading standby is not promoted and not removed"),
    pytest.param([serving("a"), serving("b")], 1, 1, ReplicaActions(demote=("a",)),
                 id="a surplus serving replica becomes the missing standby"),
    pytest.param([serving("a"), serving("b"), serving("c")], 1, 0, ReplicaActions(remove=("a", "b")),
                 id="a surplus with no standby wanted is removed"),
    pytest.param([serving("a"), serving("b", S.LOADING)], 1, 0, ReplicaActions(),
                 id="a surplus that is loading waits: the only ready replica stays and the loading one is kept"),
    pytest.param([serving("a"), serving("b"), serving("c", S.LOADING)], 1, 0, ReplicaActions(remove=("a",)),
                 id="a ready surplus goes, never the loading one"),
    pytest.param([serving("a", S.LOADING), serving("b", S.LOADING)], 1, 0, ReplicaActions(),
                 id="a surplus of loading replicas waits"),
    pytest.param([serving("a"), serving("p", S.PENDING)], 1, 0, ReplicaActions(remove=("p",)),
                 id="an unschedulable replica is removed first"),
    pytest.param([serving("a"), serving("gone", S.DRAINING)], 2, 0, ReplicaActions(create_serving=1),
                 id="a draining replica counts for nothing"),
    pytest.param([serving("old", up_to_date=False), serving("b")], 2, 0, ReplicaActions(create_held=1),
                 id="an out of date replica is replaced by a surge of one held out of traffic"),
    pytest.param([serving("old", up_to_date=False), serving("b"), standby("new")], 2, 0,
                 ReplicaActions(promote=("new",), remove=("old",)),
                 id="once the surge is ready it takes the out of date replica's place in one cycle"),
    pytest.param([serving("old", up_to_date=False), serving("b"), serving("new")], 2, 0,
                 ReplicaActions(remove=("old",)), id="a ready surplus out of date replica goes first"),
    pytest.param([serving("old", up_to_date=False), serving("b", S.LOADING)], 2, 0, ReplicaActions(),
                 id="no replacement while a replica is loading"),
    pytest.param([standby("s1"), standby("s2")], 0, 0, ReplicaActions(remove=("s1", "s2")),
                 id="scale to zero removes the standby replicas too"),
    pytest.param([serving("a"), serving("x", S.UNAVAILABLE)], 2, 0, ReplicaActions(create_serving=1),
                 id="an unavailable replica is replaced and kept until the replacement is ready"),
    pytest.param([serving("a"), serving("b", S.LOADING), serving("x", S.UNAVAILABLE)], 2, 0, ReplicaActions(),
                 id="while its replacement loads the unavailable replica stays"),
    pytest.param([serving("a"), serving("b"), serving("x", S.UNAVAILABLE)], 2, 0, ReplicaActions(remove=("x",)),
                 id="once the replacement is ready the unavailable replica goes"),
    pytest.param([standby("s"), serving("x", S.UNAVAILABLE)], 1, 1,
                 ReplicaActions(create_standby=1, promote=("s",)),
                 id="a warm standby takes an unavailable serving replica's place at once"),
]


@pytest.mark.parametrize(("replicas", "want_serving", "want_standby", "expected"), CASES)
def test_replica_actions(replicas: list[Replica], want_serving: int, want_standby: int,
                         expected: ReplicaActions) -> None:
    assert plan_replicas(replicas, want_serving, want_standby) == expected


def test_an_unavailable_replica_goes_first_when_keeping_it_would_exceed_the_budget() -> None:
    actions = plan_replicas([serving("a"), serving("x", S.UNAVAILABLE)], 2, 0, budget=2)
    assert actions == ReplicaActions(create_serving=1, remove=("x",))


def test_the_cheapest_ready_replica_to_lose_is_removed_first() -> None:
    cost = {"a": 5.0, "b": 1.0, "c": 3.0}
    actions = plan_replicas([serving("a"), serving("b"), serving("c")], 2, 0, removal_cost=cost.__getitem__)
    assert actions.remove == ("b",)


def replica_lists_of(states: list[S]) -> st.SearchStrategy[list[Replica]]:
    return st.lists(
        st.builds(Replica, name=st.text("abcdefgh", min_size=1, max_size=3),
                  state=st.sampled_from(states), standby=st.booleans(), up_to_date=st.booleans(),
                  low_priority=st.booleans()),
        max_size=12, unique_by=lambda r: r.name)


# plan_replicas plans the awake replicas; sleepers are plan_tiers' (tests/engine/test_tier_replicas.py)
replica_lists = replica_lists_of([s for s in S if s is not S.SLEEPING])


@given(replica_lists, st.integers(0, 8), st.integers(0, 4))
def test_invariants_hold_for_any_replicas(replicas: list[Replica], want_serving: int, want_standby: int) -> None:
    actions = plan_replicas(replicas, want_serving, want_standby)
    by_name = {r.name: r for r in replicas}
    touched = [*actions.promote, *actions.demote, *actions.remove]
    assert len(touched) == len(set(touched)), "a replica gets at most one action"
    assert all(by_name[n].state is not S.LOADING for n in actions.remove), "never remove a loading replica"
    assert all(by_name[n].state is not S.DRAINING for n in touched), "draining replicas are left alone"
    assert all(by_name[n].standby and by_name[n].state is S.STANDBY for n in actions.promote)
    assert all(not by_name[n].standby and by_name[n].state is S.SERVING for n in actions.demote)
    live = [r for r in replicas if r.state not in (S.DRAINING, S.UNAVAILABLE)]
    # unavailable replicas count for nothing; they go once the ready replicas reach the desired counts
    gone = [n for n in actions.remove if by_name[n].state is S.UNAVAILABLE]
    actions = ReplicaActions(actions.create_serving, actions.create_standby, actions.promote, actions.demote,
                             tuple(n for n in actions.remove if n not in gone), actions.create_held)
    serving_before = sum(not r.standby for r in live)
    serving_after = (serving_before + len(actions.promote) - len(actions.demote)
                     - sum(not by_name[n].standby for n in actions.remove) + actions.create_serving)
    assert serving_after >= want_serving
    # The replicas labelled serving (in traffic once ready) never go above the desired count on account of this
    # plan: a swap's replacement waits out of traffic (create_held) and takes its twin's place in one cycle.
    assert serving_after <= max(want_serving, serving_before)
    # Ready serving capacity never drops below the desired count on account of this plan (a swap's trade puts
    # one in for one out).
    warm = (S.SERVING, S.STANDBY)
    ready_before = sum(not r.standby and r.state in warm for r in live)
    ready_after = ready_before + len(actions.promote) - len(actions.demote) - sum(
        not by_name[n].standby and by_name[n].state in warm for n in actions.remove)
    assert ready_after >= min(want_serving, ready_before)


def test_a_replica_stuck_unschedulable_is_removed_and_placed_again() -> None:
    actions = plan_replicas([serving("a"), serving("p", S.PENDING)], 2, 0, stuck=frozenset({"p"}))
    assert actions.remove == ("p",) and actions.create_serving == 1


def low(name: str, state: S = S.SERVING, *, standby: bool = False) -> Replica:
    """A replica at the standby's PriorityClass (made as a standby; labelled serving once promoted)."""
    return Replica(name, state, standby=standby, low_priority=True)


def test_a_promoted_standby_is_swapped_for_a_serving_priority_replica_without_exceeding_the_count() -> None:
    # Traffic rises: the warm standby is promoted at once, and the standby pool is refilled by a replica at the
    # serving priority, held out of traffic, rather than another standby.
    first = plan_replicas([serving("a"), low("s", S.STANDBY, standby=True)], 2, 1)
    assert first.promote == ("s",) and (first.create_serving, first.create_standby, first.create_held) == (0, 0, 1)
    # While the new one loads, nothing more is made.
    loading = plan_replicas([serving("a"), low("s"), standby("n", S.LOADING)], 2, 1)
    assert loading.empty
    # Once it is ready, the two trade places in one cycle: the promoted one goes back to standby, where its
    # priority belongs, and the new one serves; two serve throughout.
    ready = plan_replicas([serving("a"), low("s"), standby("n")], 2, 1)
    assert ready.demote == ("s",) and ready.promote == ("n",) and ready.remove == ()
    assert not (ready.create_serving or ready.create_standby or ready.create_held)


def test_a_promoted_standby_without_a_standby_pool_is_replaced_once_the_service_is_steady() -> None:
    steady = plan_replicas([serving("a"), low("s")], 2, 0)
    assert (steady.create_held, steady.create_serving, steady.remove) == (1, 0, ())
    assert plan_replicas([serving("a"), low("s"), standby("n", S.LOADING)], 2, 0).empty
    done = plan_replicas([serving("a"), low("s"), standby("n")], 2, 0)
    assert done.remove == ("s",) and done.promote == ("n",)


def test_a_promoted_standby_is_not_swapped_while_the_service_heads_down() -> None:
    assert plan_replicas([serving("a"), low("s")], 2, 0, reseat=False).empty
    # ... and on the way down, it is the first to go.
    assert plan_replicas([serving("a"), low("s"), serving("b")], 2, 0, reseat=False).remove == ("s",)
