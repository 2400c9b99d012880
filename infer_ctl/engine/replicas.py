"""From desired counts to actions on replicas (pure): create, promote, demote, replace, remove.

The decision says how many serving and standby replicas a service should have; this says what to do with the
replicas it has, in the order that keeps capacity up:

1. Draining replicas are already leaving and count for nothing.
2. Serving short: promote ready standby replicas first (they are warm: capacity now, no cold start), then
   create serving replicas for the rest. Standby short: create standby replicas.
3. Serving over: demote ready serving replicas to standby while standby is short (they stay warm), remove the
   rest. Standby over: remove.
4. What is removed (or demoted), in order: replicas that cannot be scheduled (they hold nothing), out-of-date
   replicas, serving replicas at the standby's priority, then the ready replica whose removal frees the most
   useful capacity (a `removal_cost`, e.g. from the placement engine's fragmentation score: lower is removed
   first). Never a replica that is still loading: a surplus of loading replicas waits until they are ready.
5. Unavailable replicas (ready once and not for longer than the policy's grace, or on a Node that is gone or
   unreachable) count for nothing, so replacements are created for them, and are removed once the ready
   replicas reach the desired counts (make before break), or before that when keeping them would hold more
   replicas than the service's budget (its maximum plus the standby).
6. Out-of-date replicas (their Pod was made from an older spec) are replaced one at a time: while every
   replica is ready, one extra replica is created (surge 1); a serving one's replacement is held out of traffic
   (labelled standby, at the serving priority) until it is ready, then it takes the out-of-date one's place in
   one cycle (the old one leaves traffic first, then the new one joins). So are serving replicas at the
   standby's priority (`low_priority`): a promoted standby serves at once, but a Pod's priority cannot change,
   and a batch gang could preempt it; once the service is steady a replacement at the serving priority is made,
   held out of traffic until ready, and the two trade places (the promoted one back to the standby pool when it
   is short, else removed; or it is the first to be demoted when standby is short again). So a swap never puts
   more replicas in traffic than the desired count, and the replicas in traffic never exceed `maxReplicas`: the
   surge of a swap is one replica, out of traffic, for one cold start. (A replica made for the desired count
   that is still loading when the count falls serves once ready, until the next cycle removes it: it was within
   the maximum when it was made.)

E.g. desired 3 serving / 1 standby; have serving [a ready, b loading], standby [c ready, d ready]:
promote c (serving 3), keep d as the standby, create nothing, remove nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from infer_ctl.core.api import ReplicaState


@dataclass(frozen=True, slots=True)
class Replica:
    name: str
    state: ReplicaState  # LOADING, SERVING, STANDBY, DRAINING, PENDING, UNAVAILABLE
    standby: bool  # labelled standby (for a loading or pending replica: what it will be once ready)
    up_to_date: bool = True
    low_priority: bool = False  # runs at the standby's (preemptible) PriorityClass; fixed for the Pod's life


@dataclass(frozen=True, slots=True)
class ReplicaActions:
    create_serving: int = 0
    create_standby: int = 0
    promote: tuple[str, ...] = ()  # standby -> serving
    demote: tuple[str, ...] = ()  # serving -> standby
    remove: tuple[str, ...] = ()
    # replacements for a swap: at the serving priority, but out of traffic (labelled standby) until they are ready
    # and take their twin's place in one cycle, so that the replicas in traffic never exceed the desired count
    create_held: int = 0
    # the sleeping tier (`plan_tiers`): sleepers woken into traffic, awake replicas put to sleep, sleepers to make
    wake: tuple[str, ...] = ()
    sleep: tuple[str, ...] = ()
    create_sleeping: int = 0

    @property
    def empty(self) -> bool:
        return not (self.create_serving or self.create_standby or self.promote or self.demote or self.remove
                    or self.create_held or self.wake or self.sleep or self.create_sleeping)


def plan_replicas(replicas: Sequence[Replica], desired_serving: int, desired_standby: int,
                  removal_cost: Callable[[str], float] | None = None,
                  *, stuck: frozenset[str] = frozenset(), reseat: bool = True,
                  budget: int | None = None) -> ReplicaActions:
    """`stuck`: replicas that cannot be scheduled as placed (their pinned device was taken meanwhile): they are
    removed and count as missing, so that they are placed again. `reseat`: replace serving replicas at the
    standby's priority now (False while the service is heading down: they will be the first to go anyway).
    `budget`: the most replicas the service may hold at once, unavailable ones included (None: no limit)."""
    if desired_serving < 0 or desired_standby < 0:
        raise ValueError(f"desired replicas must not be negative, got {desired_serving}/{desired_standby}")
    replaced = tuple(r.name for r in replicas if r.name in stuck and r.state is ReplicaState.PENDING)
    unavailable = [r for r in replicas if r.state is ReplicaState.UNAVAILABLE]
    live = [r for r in replicas if r.state not in (ReplicaState.DRAINING, ReplicaState.UNAVAILABLE)
            and r.name not in replaced]
    serving = [r for r in live if not r.standby]
    standby = [r for r in live if r.standby]
    # A swap's replacement that is ready takes its twin's place in one cycle.
    promote, demote, remove = _trade_places(serving, standby, desired_serving, desired_standby)
    swapped = {*promote, *demote, *remove}
    serving = [r for r in serving if r.name not in swapped] + [r for r in standby if r.name in promote]
    standby = [r for r in standby if r.name not in swapped] + [r for r in live if r.name in demote]

    # Serving short: warm standby replicas first (those at the serving priority first).
    short = desired_serving - len(serving)
    if short > 0:
        ready_standby = sorted((r for r in standby if r.state is ReplicaState.STANDBY and r.up_to_date),
                               key=lambda r: r.low_priority)
        for r in ready_standby[:short]:
            promote.append(r.name)
        standby = [r for r in standby if r.name not in promote]
        serving = serving + [r for r in ready_standby if r.name in promote]
    # Serving over: demote ready ones into a short standby pool, remove the rest; but never so many that fewer
    # than the desired count stay ready (a surplus of loading replicas waits until they are ready).
    over = len(serving) - desired_serving
    if over > 0:
        ready = sum(r.state in (ReplicaState.SERVING, ReplicaState.STANDBY) for r in serving)
        chosen: list[Replica] = []
        for r in _removal_order(serving, removal_cost, serving=True):
            if len(chosen) == over:
                break
            if r.state in (ReplicaState.SERVING, ReplicaState.STANDBY):
                if ready <= desired_serving:
                    continue
                ready -= 1
            chosen.append(r)
        standby_short = max(0, desired_standby - len(standby))
        for r in chosen:
            if standby_short and r.state is ReplicaState.SERVING and r.up_to_date:
                demote.append(r.name)
                standby_short -= 1
            else:
                remove.append(r.name)
        leaving = {r.name for r in chosen}
        standby = standby + [r for r in serving if r.name in demote]
        serving = [r for r in serving if r.name not in leaving]
    over_standby = len(standby) - desired_standby
    if over_standby > 0:
        remove.extend(r.name for r in _removal_order(standby, removal_cost)[:over_standby])
        standby = [r for r in standby if r.name not in remove]

    create_serving = max(0, desired_serving - len(serving))
    create_standby = max(0, desired_standby - len(standby))
    # A promoted standby serves at the standby's priority. Refilling the standby pool, a new replica at the
    # serving priority is made instead; once it is ready, the promoted one is demoted back (one cold start, and
    # serving capacity never dips).
    # Serving replicas beyond the desired count that are still loading were made for that swap: they refill the
    # standby pool when ready.
    low = sum(r.low_priority and r.state in (ReplicaState.SERVING, ReplicaState.STANDBY) for r in serving)
    covered = min(create_standby, max(0, len(serving) - desired_serving), low)
    # replacements already on their way (held, still loading) are not made again
    coming = sum(not r.low_priority and r.state in (ReplicaState.LOADING, ReplicaState.PENDING) for r in standby)
    swap = max(0, min(create_standby - covered, low - covered) - coming)
    create_standby -= covered + min(create_standby - covered, low - covered)
    create_held = swap

    # Rolling replacement of out-of-date replicas, one at a time, only when nothing else is in motion.
    kept_replicas = serving + standby
    outdated = [r for r in kept_replicas if not r.up_to_date] + \
        [r for r in serving if r.up_to_date and r.low_priority and reseat]
    settled = all(r.state in (ReplicaState.SERVING, ReplicaState.STANDBY) for r in kept_replicas)
    if outdated and settled and not (create_serving or create_standby or create_held or remove or promote
                                     or demote):
        target = outdated[0]
        if target.standby:
            create_standby += 1
            # The surge replica's twin is removed in a later cycle, once the new one is ready (it then counts
            # as one too many, and out-of-date replicas are removed first).
        else:
            create_held += 1  # out of traffic until ready, then it takes the twin's place (above)
    remove.extend(_unavailable_to_remove(unavailable, kept_replicas, desired_serving + desired_standby,
                                         create_serving + create_standby + create_held, budget))
    return ReplicaActions(create_serving, create_standby, tuple(promote), tuple(demote), (*replaced, *remove),
                          create_held)


def _trade_places(serving: Sequence[Replica], standby: Sequence[Replica], desired_serving: int,
                  desired_standby: int) -> tuple[list[str], list[str], list[str]]:
    """A swap's replacement that is ready (labelled standby, at the serving priority) takes its twin's place (a
    serving replica out of date, or at the standby's priority): the twin leaves traffic, demoted into a short
    standby pool or removed, and the replacement is promoted, in one cycle (the controller writes the twin's
    change first). Only while serving is full (a shortfall promotes the replacement without a trade), and only
    for twins within the desired count (a surplus of them is removed by the caller). Returns (promote, demote,
    remove)."""
    held = [r for r in standby if r.state is ReplicaState.STANDBY and r.up_to_date and not r.low_priority]
    twins = sorted((r for r in serving if r.state is ReplicaState.SERVING and (not r.up_to_date or r.low_priority)),
                   key=lambda r: (r.up_to_date, r.name))  # out of date first
    within = max(0, min(len(twins), desired_serving - (len(serving) - len(twins)))) \
        if len(serving) >= desired_serving else 0
    promote: list[str] = []
    demote: list[str] = []
    remove: list[str] = []
    for replacement, twin in zip(held, twins[:within], strict=False):
        promote.append(replacement.name)
        if twin.up_to_date and len(standby) - 1 < desired_standby:
            demote.append(twin.name)  # a promoted standby going back to the pool it came from
        else:
            remove.append(twin.name)
    return promote, demote, remove


def _unavailable_to_remove(unavailable: Sequence[Replica], kept: Sequence[Replica], desired: int, creating: int,
                           budget: int | None) -> list[str]:
    """All of them once the kept replicas are ready to the desired count (their replacements are ready); before
    that, as many as holding them would exceed the budget, in name order."""
    ready = sum(r.state in (ReplicaState.SERVING, ReplicaState.STANDBY) for r in kept)
    if ready >= desired:
        return [r.name for r in unavailable]
    excess = len(kept) + creating + len(unavailable) - budget if budget is not None else 0
    return [r.name for r in unavailable[:max(0, excess)]]


def _removal_order(replicas: Sequence[Replica], cost: Callable[[str], float] | None,
                   serving: bool = False) -> list[Replica]:
    """Unschedulable first, then out of date, then serving at the standby's priority, then ready by cost.
    Loading replicas are never candidates: their
    cold start is paid and the decision started them for a reason; a surplus of them waits until they are
    ready."""

    def key(r: Replica) -> tuple[int, float, str]:
        if r.state is ReplicaState.PENDING:
            return (0, 0.0, r.name)
        if not r.up_to_date:
            return (1, 0.0, r.name)
        if serving and r.low_priority:
            return (2, 0.0, r.name)
        return (3, cost(r.name) if cost is not None else 0.0, r.name)

    return sorted((r for r in replicas if r.state is not ReplicaState.LOADING), key=key)


def plan_tiers(replicas: Sequence[Replica], desired_serving: int, desired_standby: int, desired_sleeping: int,
               *, on_warm_host: Callable[[str], bool], removal_cost: Callable[[str], float] | None = None,
               stuck: frozenset[str] = frozenset(), reseat: bool = True, budget: int | None = None,
               can_wake: Callable[[str], bool] | None = None,
               starting: frozenset[str] = frozenset(), hold_starting: bool = True) -> ReplicaActions:
    """`plan_replicas` with the sleeping tier around it: the awake replicas are planned as without it; then a
    serving shortfall is covered by waking sleepers before anything is created (seconds instead of a cold
    start), an awake replica the plan would remove goes to sleep instead while sleepers are short (demotion one
    tier, not deletion; only a ready, up-to-date one on a warm host: a Pod's claims are fixed for its life, so
    only a replica on a shared claim can sleep and wake), sleepers still short are created, and a surplus of
    sleepers is removed (out of date first, then by `removal_cost`).

    `on_warm_host(name)`: whether the awake replica may go to sleep (it sits on a warm host with room for its
    weights); `can_wake(name)`: whether the sleeper's warm host has the device memory free to wake it now (None:
    always). Both are asked once per replica they allow, in the order the plan takes them, so a caller may count
    what each allowed one takes. `starting`: sleepers still loading (passed with state SLEEPING): they count as
    sleepers but are never woken (a wake needs a loaded model), and are not surplus within their first load
    (`hold_starting`; False while the service is paused: then they go last of a surplus): their load is paid,
    and removing them a cycle after they were made, when the forecast moves, only makes the next burst pay it
    again. An out-of-date one is replaced all the same.

    E.g. desired 4 serving / 0 standby / 2 sleeping; have serving [a, b], sleeping [s1, s2, s3]: wake s3 and s2
    (serving 4), keep s1, create one sleeper."""
    if desired_sleeping < 0:
        raise ValueError(f"desired sleeping replicas must not be negative, got {desired_sleeping}")
    asleep = [r for r in replicas if r.state is ReplicaState.SLEEPING]
    awake = [r for r in replicas if r.state is not ReplicaState.SLEEPING]
    actions = plan_replicas(awake, desired_serving, desired_standby, removal_cost, stuck=stuck, reseat=reseat,
                            budget=budget)
    by_name = {r.name: r for r in awake}
    # out-of-date sleepers are replaced (they are out of traffic: no surge needed); the others wake, the
    # cheapest to lose last
    outdated = [r.name for r in asleep if not r.up_to_date]
    current = [r for r in _removal_order(asleep, removal_cost) if r.up_to_date and r.name not in starting] + \
        [r for r in asleep if r.up_to_date and r.name in starting]
    # awake ones that leave first (their devices may be what a wake needs), then the wakes
    short = desired_sleeping - (len(current) - min(actions.create_serving, len(current)))
    sleep: list[str] = []
    remove: list[str] = []
    for name in actions.remove:
        r = by_name.get(name)
        ready = r is not None and r.up_to_date and r.state in (ReplicaState.SERVING, ReplicaState.STANDBY)
        if short > 0 and ready and on_warm_host(name):
            sleep.append(name)
            short -= 1
        else:
            remove.append(name)
    woken: list[str] = []
    for r in reversed(current):
        if len(woken) == actions.create_serving:
            break
        if r.name not in starting and (can_wake is None or can_wake(r.name)):
            woken.append(r.name)
    left = [r for r in current if r.name not in woken]
    short = desired_sleeping - len(left) - len(sleep)
    removable = [r for r in left if not hold_starting or r.name not in starting]
    surplus = [r.name for r in removable[:max(0, -short)]]
    return replace(actions, create_serving=actions.create_serving - len(woken),
                   remove=(*remove, *outdated, *surplus), wake=tuple(woken), sleep=tuple(sleep),
                   create_sleeping=max(0, short))
