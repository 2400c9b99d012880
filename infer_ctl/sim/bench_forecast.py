"""Benchmark: forecast quality on a real seasonal series (bank_calls, 5-minute arrivals, 8 months).

    .venv/bin/python -m infer_ctl.sim.bench_forecast [--trace ../shared/data/traces/bank_calls_5min.csv]
        [--horizons 1,2,12] [--quantile 0.95] [--first-week 4] [--rate-scale 1]

Rolling origin, as the engine runs it: every week the forecaster is re-selected by backtest on all history so
far (`select_and_fit`), then rolled through the following week bucket by bucket (parameters fixed, states
updated), forecasting `h` buckets ahead at every origin. Printed per horizon: MASE (mean absolute error over
the in-sample mean absolute error of the naive "no change" forecast at the same horizon) and the coverage of
the upper quantile (share of actual values at or below it), over all buckets and over open hours only (when
the call centre is closed both the actual and the forecast are zero, which flatters coverage), and the price of
that coverage: the band's width in open hours, sum(upper - mean) / sum(mean) (0.15: the upper bound is 15 %
above the mean forecast on average, weighted by the rate, as the replicas are), and the pinball loss of the upper
bound over all buckets, scaled like MASE (what the backtest chooses the forecaster by: misses weigh q, headroom
1 - q).

Then, per horizon, the coverage in open hours by forecast level (five bins of equal count, quiet to busy) and by
hour of the day: a single error distribution for all levels shows up here as a band that is too wide at one end
and too narrow at the other while the average looks right.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from pathlib import Path

import numpy as np

from infer_ctl.forecast.select import select_and_fit
from infer_ctl.forecast.series import RateSeries
from infer_ctl.sim.trace import load_trace

WEEK_S = 7 * 86400.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="../shared/data/traces/bank_calls_5min.csv")
    ap.add_argument("--horizons", default="1,2,12", help="buckets ahead (5 minutes each)")
    ap.add_argument("--quantile", type=float, default=0.95)
    ap.add_argument(
        "--rate-scale",
        type=float,
        default=1.0,
        help="multiply the rates (x200 is the autoscaling benchmark's service, a peak of about 300 requests/s; "
        "the upper quantile's errors are scaled by sqrt(max(rate, 1 req/s)), absolute below 1 req/s)",
    )
    ap.add_argument("--first-week", type=int, default=4, help="weeks of history before the first origin")
    ap.add_argument("--weeks", type=int, default=None, help="evaluate this many weeks (default: all)")
    args = ap.parse_args(argv)
    trace = load_trace(Path(args.trace), "counts-csv")
    values = trace.counts / trace.bucket_s * args.rate_scale  # requests/s
    step_s = trace.bucket_s
    per_week = round(WEEK_S / step_s)
    horizons = [int(h) for h in args.horizons.split(",")]
    hmax = max(horizons)
    total_weeks = values.size // per_week
    last_week = total_weeks if args.weeks is None else min(total_weeks, args.first_week + args.weeks)
    actual: dict[int, list[float]] = {h: [] for h in horizons}
    mean: dict[int, list[float]] = {h: [] for h in horizons}
    upper: dict[int, list[float]] = {h: [] for h in horizons}
    chosen: Counter[str] = Counter()
    origins: list[int] = []
    t0 = time.perf_counter()
    for week in range(args.first_week, last_week):
        cut = week * per_week
        history = RateSeries(trace.start_s, step_s, values[:cut])
        sel = select_and_fit(history, hmax, args.quantile)
        chosen[sel.fitted.method] += 1
        model = sel.fitted
        end = min(values.size - hmax, cut + per_week)
        for t in range(cut, end):
            origins.append(t)
            fc = model.predict(hmax)
            for h in horizons:
                actual[h].append(float(values[t + h - 1]))
                mean[h].append(float(fc.mean_rps[h - 1]))
                upper[h].append(float(fc.upper_rps[h - 1]))
            model = model.update(values[t : t + 1])
    wall = time.perf_counter() - t0
    train = values[: args.first_week * per_week]
    print(
        f"trace={trace.name} x{args.rate_scale:g} (peak {values.max():.1f} req/s) buckets={values.size} x "
        f"{step_s:.0f} s, weeks evaluated={last_week - args.first_week}"
    )
    print(f"forecasters chosen (weekly re-selection): {dict(chosen)}; wall {wall:.1f} s")
    print(
        f"{'h':>3} {'minutes':>7} {'MASE':>6} {'MASE open':>9} {'cover':>6} {'cover open':>10} {'band open':>9}"
        f" {'pinball':>7}  (nominal {args.quantile:.0%}; band = sum(upper - mean) / sum(mean))"
    )
    for h in horizons:
        a, m, u = np.asarray(actual[h]), np.asarray(mean[h]), np.asarray(upper[h])
        naive = np.abs(train[h:] - train[:-h]).mean()
        open_ = a > 0
        naive_open = np.abs(train[h:] - train[:-h])[(train[h:] > 0)].mean()
        mase = np.abs(a - m).mean() / naive
        mase_open = np.abs(a - m)[open_].mean() / naive_open
        band = (u - m)[open_].sum() / m[open_].sum()
        miss = a - u
        pinball = np.maximum(args.quantile * miss, (args.quantile - 1.0) * miss).mean() / naive
        print(
            f"{h:>3} {h * step_s / 60:>7.0f} {mase:>6.3f} {mase_open:>9.3f} {(a <= u).mean():>6.1%} "
            f"{(a <= u)[open_].mean():>10.1%} {band:>9.3f} {pinball:>7.4f}"
        )
    for h in horizons:
        a, m, u = np.asarray(actual[h]), np.asarray(mean[h]), np.asarray(upper[h])
        open_ = a > 0
        hit, level = (a <= u)[open_], m[open_]
        bins = np.array_split(np.argsort(level, kind="stable"), 5)
        by_level = " ".join(f"{level[b].min():.3g}-{level[b].max():.3g}:{hit[b].mean():.1%}" for b in bins)
        times = (np.asarray(origins)[open_] + h - 1) * step_s + trace.start_s
        hours = ((times % 86400.0) // 3600.0).astype(int)
        by_hour = " ".join(f"{hr:02d}h:{hit[hours == hr].mean():.0%}" for hr in np.unique(hours))
        print(f"h={h} cover open by forecast level (req/s): {by_level}")
        print(f"h={h} cover open by hour of day: {by_hour}")
    if math.isnan(float(np.mean(actual[horizons[0]]))):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
