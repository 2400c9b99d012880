"""A higher forecast quantile never provisions for less: the presets' quantiles (cost-saver 0.8 < balanced 0.95 <
latency-critical 0.99) must order the upper bound the same way at every tick, young or calibrated history."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infer_ctl.core.api import ReplicaState
from infer_ctl.decide.decision import DecidePolicy, ReplicaView
from infer_ctl.engine.step import EngineConfig, EngineInputs, EngineOutput, EngineState, step

PERIOD_S = 10.0
QUANTILES = (0.8, 0.95, 0.99)


def bursty_rates(minutes: int, seed: int) -> list[float]:
    """A rate sample every 10 s: minutes idle with probability 0.3, otherwise a level drawn per minute
    (lognormal around 20 requests/s) with noise between samples, as on the Azure LLM trace."""
    rng = np.random.default_rng(seed)
    out: list[float] = []
    for _ in range(minutes):
        level = 0.0 if rng.random() < 0.3 else float(rng.lognormal(math.log(20.0), 0.8))
        out.extend(max(0.0, level * (1.0 + 0.2 * float(rng.standard_normal()))) for _ in range(6))
    return out


def run(rates: list[float], quantile: float) -> list[EngineOutput]:
    policy = DecidePolicy(8.0, min_replicas=1, max_replicas=200, quantile=quantile, control_period_s=PERIOD_S)
    held = tuple(ReplicaView(f"r{i}", ReplicaState.SERVING, 0.0) for i in range(10))
    state, outs = EngineState(), []
    for k, r in enumerate(rates):
        now = k * PERIOD_S
        out, state = step(EngineInputs(now, ((now, r),), held, 120.0, policy), state, EngineConfig())
        outs.append(out)
    return outs


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_upper_bound_is_ordered_by_quantile_at_every_tick(seed: int) -> None:
    rates = bursty_rates(90, seed)
    runs = {q: run(rates, q) for q in QUANTILES}
    for k in range(len(rates)):
        now = k * PERIOD_S
        forecasts = [runs[q][k].forecast for q in QUANTILES]
        if all(fc is None for fc in forecasts):
            continue  # no complete bucket yet
        uppers = [fc.peak_upper_rps(130.0, now) for fc in forecasts if fc is not None]
        assert len(uppers) == len(QUANTILES)
        assert uppers == sorted(uppers), f"tick {k} ({now / 60:.1f} min): upper by quantile {uppers}"
