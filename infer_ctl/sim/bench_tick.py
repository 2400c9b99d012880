"""Benchmark: one control tick (forecast + decide) for N services, refits amortized.

    .venv/bin/python -m infer_ctl.sim.bench_tick [--services 1000] [--fitted 20] [--days 14] [--ticks 60]

`--fitted` services get their own seasonal rate history (`--days` of 5-minute buckets) and a real forecaster
selection by backtest (timed: the refit cost). The N services of the timed ticks reuse those fitted states
round-robin (the cost of a tick does not depend on the values), and each tick feeds every service a new
sample and runs the full engine step (bucketing, model update, forecast, decision). Refits are then amortized
at the engine's schedule: a refit every `refit interval` per service costs refit_s * N * period / interval per
tick. Printed: tick wall time for all services, and tick + amortized refits.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from infer_ctl.core.api import ReplicaState
from infer_ctl.decide.decision import DecidePolicy, ReplicaView
from infer_ctl.engine.step import EngineConfig, EngineInputs, EngineState, _refit, step
from infer_ctl.forecast.series import RateSeries

DAY_S = 86400.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--fitted", type=int, default=20, help="services fitted for real (refit cost)")
    ap.add_argument("--days", type=float, default=14.0, help="history per fitted service")
    ap.add_argument("--ticks", type=int, default=60, help="timed ticks")
    ap.add_argument("--period-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    policy = DecidePolicy(10.0, min_replicas=1, max_replicas=500, control_period_s=args.period_s)
    config = EngineConfig()
    step_s = config.history_step_s
    n_hist = int(args.days * DAY_S / step_s)
    t_hist = np.arange(n_hist) * step_s
    fitted_states: list[EngineState] = []
    refit_s: list[float] = []
    for _ in range(args.fitted):
        level = rng.uniform(5, 500)
        weekly = np.where((t_hist // DAY_S) % 7 >= 5, 0.3, 1.0)
        mean = level * weekly * (1.0 + 0.8 * np.sin(2 * np.pi * (t_hist + rng.uniform(0, DAY_S)) / DAY_S))
        values = np.maximum(0.0, mean + np.sqrt(mean) * rng.standard_normal(n_hist))
        state = EngineState(origin_s=0.0, history=RateSeries(0.0, step_s, values), open_bucket=n_hist)
        t0 = time.perf_counter()
        state = _refit(state, n_hist * step_s, 130.0, policy.quantile, config)
        refit_s.append(time.perf_counter() - t0)
        fitted_states.append(state)
    n = args.services
    states = [fitted_states[i % args.fitted] for i in range(n)]
    levels = [float(v.values_rps[-1]) for i in range(n) if (v := fitted_states[i % args.fitted].history) is not None]
    replicas = [max(1, int(v / 10)) for v in levels]
    start = n_hist * step_s
    per_tick: list[float] = []
    for k in range(args.ticks):
        now = start + k * args.period_s
        samples = [max(0.0, v + 3.0 * float(z)) for v, z in zip(levels, rng.standard_normal(n), strict=True)]
        t1 = time.perf_counter()
        for i in range(n):
            views = (ReplicaView("", ReplicaState.SERVING, 0.0),) * replicas[i]
            out, states[i] = step(EngineInputs(now, ((now, samples[i]),), views, 120.0, policy), states[i], config)
            replicas[i] = out.decision.total
        per_tick.append(time.perf_counter() - t1)
    arr = np.asarray(per_tick)
    interval_s = min(config.refit_interval_s, max(config.refit_min_interval_s, args.days * DAY_S / 2))
    refit_mean = float(np.mean(refit_s))
    amortized = refit_mean * n * args.period_s / interval_s
    print(f"services={n} period_s={args.period_s:g} timed_ticks={args.ticks} history_days={args.days:g}")
    print(
        f"refit (backtest selection + fit) per service: mean {refit_mean:.3f} s, max {max(refit_s):.3f} s "
        f"over {args.fitted} services; chosen: {sorted({s.fit_note.split(' ')[0] for s in fitted_states})}"
    )
    print(
        f"tick for all services: mean {arr.mean():.3f} s, p50 {np.median(arr):.3f} s, max {arr.max():.3f} s "
        f"({arr.mean() / n * 1e6:.0f} us per service)"
    )
    print(f"refits amortized (one per {interval_s / 86400:.1f} days per service): {amortized:.3f} s per tick")
    print(f"tick + amortized refits: {arr.mean() + amortized:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
