"""The warm-tier ladder (pure): how many of a service's replicas to hold at each tier, from the forecast's needs at
each tier's horizon and what the cluster can hold.

A replica can be, from fastest to cheapest:

| tier      | what is held                                   | until it serves            | holding cost           |
|-----------|------------------------------------------------|----------------------------|------------------------|
| serving   | a GPU, weights loaded, in traffic              | now                        | a GPU                  |
| standby   | a GPU, weights loaded, out of traffic          | a label change             | a GPU                  |
| sleeping  | weights in a node's host memory, on a warm     | a wake: weight bytes over  | host memory (the warm  |
|           | host (a GPU shared by several sleepers)        | host-to-device bandwidth   | host's GPU is shared)  |
| cached    | weights on a node's disk                       | a load from local disk     | disk                   |
| cold      | nothing                                        | a load from the network    | nothing                |

Why sleepers live on a warm host: a Pod's resource claims are fixed for its life, so a replica without a GPU
can never get one. A sleeping replica is therefore a Pod that references a shared ResourceClaim (one GPU of a
node, referenced by several Pods, up to 256) whose model server loaded the weights into host memory and
released the device memory (vLLM's level-1 sleep mode); a wake copies them back in seconds, if the device has
the memory free that the replica takes awake: what the service's replicas take, the whole GPU for an `Exclusive`
service (one awake per GPU), its memory share for a `Shared` one (several). So a sleeper is cheaper than a standby
only where its warm host's GPU is shared: a warm host made for one whole-GPU replica would cost what a standby
does, and is not made (`infer_ctl.engine.cycle.awake_device_bytes` and its ledger).

The rule. Let N(h) be the replicas the forecast's upper quantile needs within a horizon h (non-decreasing in h),
and let each tier k below the awake ones be ready after t_k (plus a control period to act). Whatever is needed
before the next slower tier could deliver must already sit at a faster tier:

    awake                      >= N(t_sleeping)       (sleepers could not wake in time for the rest)
    awake + sleeping           >= N(t_cached)
    awake + sleeping + cached  >= N(t_cold)

so each tier holds the difference, N(t_next) - N(t_this), the cheapest placement for each replica's worth of
need. A tier the service may not use, or that is short of room (host memory for sleepers, free GPUs on nodes
that could wake them or load from their cache), passes its shortfall up to the next faster tier: coverage is
never lost, it only costs more. E.g. cold start 120 s, cached load 20 s, wake 3 s, period 10 s; N(13 s) = 4,
N(30 s) = 6, N(130 s) = 9; host memory for 1 sleeper, free GPUs for 5 cached loads: awake 4, sleeping 1 (of 2
wanted), the missing sleeper goes up: awake 5; cached 3.

Cost and objective are the caller's: `needs` come from the forecast at the service's quantile, and this module
only decides where each replica's worth of need is held.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass


class Tier(enum.StrEnum):
    SERVING = "Serving"
    STANDBY = "Standby"
    SLEEPING = "Sleeping"
    CACHED = "Cached"
    COLD = "Cold"


LADDER = (Tier.SERVING, Tier.STANDBY, Tier.SLEEPING, Tier.CACHED, Tier.COLD)  # fastest first


@dataclass(frozen=True, slots=True)
class TierTimes:
    """Seconds until a replica held at each tier serves (measured per model and accelerator, or the documented
    defaults until measured). Each must be at least the one above it."""

    wake_s: float  # sleeping -> serving
    cached_s: float  # cached -> serving (a load from the node's disk)
    cold_s: float  # cold -> serving (a load from the network: the cold start p90)

    def __post_init__(self) -> None:
        if not 0 <= self.wake_s <= self.cached_s <= self.cold_s:
            raise ValueError(f"need 0 <= wake_s <= cached_s <= cold_s, got {self.wake_s}, {self.cached_s}, "
                             f"{self.cold_s}")

    def of(self, tier: Tier) -> float:
        return {Tier.SERVING: 0.0, Tier.STANDBY: 0.0, Tier.SLEEPING: self.wake_s, Tier.CACHED: self.cached_s,
                Tier.COLD: self.cold_s}[tier]


@dataclass(frozen=True, slots=True)
class Room:
    """What the cluster can hold for this service at the slow tiers right now: sleepers its nodes' host-memory
    budgets allow (and that a wake could find a free GPU or memory share for), and replicas that could load
    from a node cache (free GPUs on nodes that hold, or could be given, the model's weights)."""

    sleeping: int = 0
    cached: int = 0
    # the service's awake replicas on warm hosts that could sleep where they are (their slot then holds a sleeper
    # that wakes there), and its awake replicas elsewhere (kept awake first): room for sleepers as far as the awake
    # need leaves them (`sleeping_room`)
    in_place: int = 0
    awake_elsewhere: int = 0
    # sleepers it could hold on GPUs other services lend (`yieldToSleepers`), its awake replicas there included:
    # they wake only for load already here (a burst), so they hold the fixed pool, never what the forecast needs
    lent: int = 0
    # the service's sleepers now, those still loading to sleep included: what the stabilization window can hold
    # asleep without loading another (`window_hold`)
    asleep: int = 0

    @property
    def burst_only(self) -> bool:
        """All the room for sleepers is on lent GPUs: the sleeping tier is a burst pool, and the awake replicas
        cover the forecast as without it."""
        return self.lent > 0 and self.sleeping == 0 and self.in_place == 0

    def sleeping_room(self, awake: int) -> int:
        """Sleepers there is room for when `awake` replicas stay awake: the new or wakeable ones (`sleeping`), and
        those of the awake replicas on warm hosts that are not needed awake (the ones elsewhere stay awake first).
        E.g. 1 awake on a GPU of its own, 2 on warm hosts, 1 needed awake: 2 can sleep where they are."""
        return self.sleeping + max(0, min(self.in_place, self.awake_elsewhere + self.in_place - awake))

    def window_hold(self, awake: int, current: int, window: int, most_awake: int) -> tuple[int, int]:
        """What the stabilization window holds warm (awake and asleep), and how many of those stay awake beyond
        `awake`, when `awake` of the service's `current` awake replicas are needed awake and the window remembers
        `window` warm. It holds the replicas there are, never a new sleeper loaded in their stead (a cold load for
        a need the forecast no longer has, gone when the window passes): its sleepers and the surplus awake
        replicas that can sleep where they are (on a warm host) are held asleep; beyond them, the surplus on GPUs
        or memory shares of their own stays awake, in traffic, as without the tier, up to `most_awake` awake in
        all (maxReplicas; 0 when the decision scales to zero, which, as without the tier, no window holds). (What
        the forecast needs is the caller's, on top.) E.g. 5 of 11 needed awake (8 on GPUs of their own, 3 on warm
        hosts), 1 sleeper, a window of 14, at most 20 awake: 5 + 1 + 3 held, and 3 more held awake: (12, 3)."""
        kept = awake + self.asleep + min(self.in_place, max(0, current - awake))
        held_awake = min(max(0, self.awake_elsewhere - awake), max(0, window - kept), max(0, most_awake - awake))
        return min(window, kept + held_awake), held_awake

    def of(self, tier: Tier) -> float:
        if tier is Tier.SLEEPING:
            return self.sleeping
        if tier is Tier.CACHED:
            return self.cached
        return math.inf


@dataclass(frozen=True, slots=True)
class TierPlan:
    """Replicas wanted per tier: `awake` (serving plus standby: the decision splits it), `sleeping`, `cached`
    (replicas' worth of node-cache capacity: free GPUs on nodes holding the weights), and what was passed up
    for want of room (for the reason and `explain`)."""

    awake: int
    sleeping: int
    cached: int
    passed_up: tuple[tuple[Tier, int], ...] = ()  # (tier that lacked room, replicas it passed up)
    horizons_s: tuple[tuple[Tier, float], ...] = ()  # the horizon each tier's need was read at
    # of `awake`, replicas beyond the decision's that the stabilization window keeps awake and in traffic: they
    # cannot sleep where they are (`Room.window_hold`)
    held_awake: int = 0

    @property
    def message(self) -> str:
        parts = [f"{self.awake} awake" + (f" ({self.held_awake} held by the stabilization window: they cannot sleep "
                                          f"where they are)" if self.held_awake else "")]
        if self.sleeping:
            parts.append(f"{self.sleeping} sleeping")
        if self.cached:
            parts.append(f"{self.cached} from node caches")
        text = ", ".join(parts)
        for tier, count in self.passed_up:
            text += f"; {count} passed up from {tier.value.lower()} (no room)"
        return text


def horizons(times: TierTimes, period_s: float, allowed: frozenset[Tier]) -> dict[Tier, float]:
    """The horizon each held tier must cover: the time until the next slower tier the service may use could
    serve, plus one control period to act (the cold tier covers the cold start)."""
    slow = [t for t in (Tier.SLEEPING, Tier.CACHED, Tier.COLD) if t in allowed or t is Tier.COLD]
    out: dict[Tier, float] = {}
    held = [Tier.STANDBY, *slow[:-1]]  # awake, then every slow tier but cold holds replicas
    for tier, slower in zip(held, slow, strict=True):
        out[tier] = times.of(slower) + period_s
    return out


def ladder(needs: dict[Tier, int], room: Room) -> TierPlan:
    """Replicas per tier. `needs[tier]`: replicas needed within the horizon that tier must cover
    (`horizons()`; STANDBY stands for the awake tiers), non-decreasing from the fastest tier down; a tier the
    service may not use is absent. Shortfalls of room pass up to the next faster tier."""
    if any(n < 0 for n in needs.values()):
        raise ValueError(f"needs must not be negative, got {needs}")
    held = [t for t in (Tier.STANDBY, Tier.SLEEPING, Tier.CACHED) if t in needs]
    if Tier.STANDBY not in needs:
        raise ValueError("needs must include the awake tier (STANDBY)")
    # the need each tier covers on top of the faster ones, made non-decreasing (a forecast peak within a
    # shorter horizon is within every longer one)
    cumulative, running = [], 0
    for tier in held:
        running = max(running, needs[tier])
        cumulative.append(running)
    wanted = [cumulative[0]] + [b - a for a, b in itertools.pairwise(cumulative)]
    got = dict.fromkeys(held, 0)
    passed: list[tuple[Tier, int]] = []
    carry = 0  # shortfall from the slower tier, passed up
    for tier, own in reversed(list(zip(held, wanted, strict=True))):
        want = own + carry
        limit = room.sleeping_room(cumulative[0]) if tier is Tier.SLEEPING else room.of(tier)
        fits = want if tier is Tier.STANDBY else min(want, int(limit))
        got[tier] = fits
        carry = want - fits
        if carry:
            passed.append((tier, carry))
    return TierPlan(awake=got[Tier.STANDBY], sleeping=got.get(Tier.SLEEPING, 0), cached=got.get(Tier.CACHED, 0),
                    passed_up=tuple(passed))
