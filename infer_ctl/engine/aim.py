"""The aim adjusted from the attainment a service gets: a step up or down the calibrated ladder.

The aim table (policies/scaling.yaml `aim`, `infer_ctl.core.policy.aim_for`) gives each objective a forecast
quantile and a scale-down stabilization fitted on replays; one table cannot fit smooth seasonal and bursty traffic
alike (the balanced preset's 0.99 holds 99.77 % at 1.25x the oracle's GPU-hours on bank_calls, where a lower aim
holds 99.64 % at 1.17x, but the lower aim loses 5 points on the Azure code trace). So a service starts at the aim
calibrated for its objective and moves along the table's rungs from what it measures (`infer_ctl.core.slo`):

- below the objective over the last window: one rung up (more capacity);
- missing at most half of what the objective allows (99.5 % or more for 99 %): one rung down (less);
- else, or with fewer than `min_requests` requests counted, or on a measure of less than a whole window, or before
  a whole window has passed since the last move (the measure must be of the current aim, not of the one before):
  stay.

Above the table's top, the scaling policy's `aimHeadroom` adds rungs: the top aim with the replicas sized for 1.25,
1.5, ... times the forecast (a bursty service whose forecast's quantile misses its bursts gets capacity for them,
one rung an hour, as long as it stays below its objective; and gives it back, one rung an hour, once well above).
At the top rung it stays there however far below the objective; at the bottom likewise above it. Only the aim
moves: a quantile or a stabilization the spec states itself is the user's and never adjusted (`adaptive`).

Where the aim is survives the controller: the status records it (`status.slo.aim`: the rung's quantile and
stabilization, since when, the last move), and a controller that starts again resumes there (`RecordedAim`,
passed on its first cycle) instead of at the calibrated rung an hour away from where the measure had moved it.
A recorded aim that is no rung of the ladder any more (the table was edited) is dropped: the service starts at
the rung calibrated for its objective.

Pure: the caller passes `now` and the measured attainment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infer_ctl.core.policy import Aim
from infer_ctl.core.slo import Attainment

MIN_REQUESTS = 1000  # fewer counted in the window: too few to tell 99 % from 99.5 % (a miss is 10 requests)


@dataclass(frozen=True, slots=True)
class Rung:
    quantile: float
    scale_down_stabilization_s: float
    headroom: float = 1.0  # the replicas sized for this many times the forecast (above the table's top rung)

    def describe(self) -> str:
        text = f"q{self.quantile:g} / {self.scale_down_stabilization_s:g} s"
        return text if self.headroom == 1 else f"{text} x{self.headroom:g}"


def ladder(aims: tuple[Aim, ...], headroom: tuple[float, ...] = ()) -> tuple[Rung, ...]:
    """The table's distinct aims, lowest first (the table is ordered so: `check_aims`), then its top aim with each
    capacity factor of `headroom` (rising): where a service that misses its objective at the table's top goes."""
    rungs: list[Rung] = []
    for aim in aims:
        rung = Rung(aim.quantile, aim.scale_down_stabilization_s)
        if not rungs or rung != rungs[-1]:
            rungs.append(rung)
    if rungs:
        top = rungs[-1]
        rungs += [Rung(top.quantile, top.scale_down_stabilization_s, factor) for factor in headroom]
    return tuple(rungs)


@dataclass(frozen=True, slots=True)
class AimState:
    rung: int | None = None  # index into the ladder; None before the first cycle
    since_s: float = -math.inf  # when the aim last moved (or was first set)
    note: str = ""  # the last move and why ("" before one)


@dataclass(frozen=True, slots=True)
class RecordedAim:
    """The aim a controller ran with, as the service's status recorded it (`status.slo.aim`)."""

    quantile: float
    scale_down_stabilization_s: float
    since_s: float  # when it last moved (or was first set)
    note: str = ""  # its last move and why ("" when it never moved)
    headroom: float = 1.0


def resume(recorded: RecordedAim, rungs: tuple[Rung, ...], now_s: float) -> AimState | None:
    """The state a recorded aim stands for on this ladder, or None when it is none of its rungs. A `since` in the
    future (another clock) counts from now: the aim then waits a whole window before it moves."""
    for i, rung in enumerate(rungs):
        if math.isclose(rung.quantile, recorded.quantile, abs_tol=1e-9) and \
                math.isclose(rung.scale_down_stabilization_s, recorded.scale_down_stabilization_s, abs_tol=1e-6) and \
                math.isclose(rung.headroom, recorded.headroom, abs_tol=1e-3):
            return AimState(i, min(recorded.since_s, now_s), recorded.note)
    return None


def adapt(state: AimState, rungs: tuple[Rung, ...], start: int, objective: float, measured: Attainment | None, *,
          now_s: float, window_s: float, min_requests: float = MIN_REQUESTS,
          recorded: RecordedAim | None = None) -> AimState:
    """The aim for this cycle. `start`: the rung calibrated for the objective (where a service begins); `window_s`:
    the window a measure must cover (a direct scrape's covers only the time since the controller started);
    `recorded`: where a previous controller left the aim, resumed on the first cycle when it is a rung."""
    if not rungs:
        raise ValueError("no aim to adapt")
    if state.rung is None:
        resumed = resume(recorded, rungs, now_s) if recorded is not None else None
        return resumed if resumed is not None else AimState(max(0, min(start, len(rungs) - 1)), now_s)
    if measured is None or measured.share is None or measured.requests < min_requests \
            or measured.window_s < window_s or now_s - state.since_s < window_s:
        return state
    share, allowed_miss = measured.share, 1.0 - objective
    rung = state.rung
    if share < objective and rung + 1 < len(rungs):
        move, why = rung + 1, f"below the objective, {objective * 100:g} %"
    elif 1.0 - share <= allowed_miss / 2 and rung > 0:
        move, why = rung - 1, f">= {(1 - allowed_miss / 2) * 100:g} %, half the misses the objective allows"
    else:
        return state
    to = rungs[move]
    note = (f"aim {'up' if move > rung else 'down'} to {to.describe()}: "
            f"{share * 100:.2f} % of {measured.requests:.0f} requests within the SLO over the last "
            f"{measured.window_s:g} s ({why})")
    return AimState(move, now_s, note)
