"""Calibrate what the scaling aims for to the objective it is asked to meet, by replays in the simulator.

    .venv/bin/python -m infer_ctl.sim.calibrate [--bank PATH] [--azure PATH] [--train-weeks 6] [--check-weeks 8]
        [--objectives 0.95,0.99,0.995,0.999] [--cold-start 120] [--seeds 0-2] [--miss-excess 0.25]
    [--no-check | --check-only]

A service states an objective, the share of its requests that should finish within its SLO
(`spec.slo.attainment`, defaulted per preset in `policies/scaling.yaml`). What infer-ctl aims for, the upper
quantile of the forecast it provisions for and the scale-down stabilization window, is taken from the `aim` table
of `policies/scaling.yaml`; this script fits that table:

1. A ladder of aims (`LADDER`), each at least as high as the one before in both knobs (a higher quantile, a
   longer window: more GPU-hours, more requests within the SLO).
2. Every rung is replayed by the simulator (`infer_ctl.sim.run.simulate`, the controller's own engine through
   `plan_cycle`) on TRAINING data: the first `--train-weeks` weeks of bank_calls (x200, the autoscaling
   benchmark's service: 8 requests/s per replica at a 2 s SLO, 120 s cold start, no history at the start) and the
   first half of the Azure code trace (x5, scored after its first 10 minutes, the mean over `--seeds`).
3. Per objective, the aim is the lowest rung that reaches it on every training scenario where some rung reaches
   it and, on a scenario where no rung does (the short bursty Azure half from no history), misses at most
   `--miss-excess` (25 %) more requests than the best rung there: aiming lower would give away what aiming high
   still serves of bursty traffic. A higher objective never gets a lower rung than a lower one (running maximum), so the
   table is monotone by construction (`infer_ctl.core.policy.check_aims` checks it on load).
4. The check on HELD-OUT data (unless `--no-check`): bank_calls weeks `--train-weeks` to `--train-weeks +
   --check-weeks` (replayed from the trace's start, so the forecaster has the history a running service would;
   scored on the held-out weeks only) and the second half of the Azure trace (from no history, scored after its
   first 10 minutes), each fitted aim beside the aim before calibration (`--before`, the balanced preset's
   quantile 0.95 and 300 s window), HPA and the oracle: attainment against the objective, GPU-hours and x the
   oracle's.

The fitted table is printed as YAML for `policies/scaling.yaml` (the command goes in the comment above it).
`--check-only` runs the held-out check of the table `policies/scaling.yaml` holds, without fitting.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from infer_ctl.config.policies import load_policies
from infer_ctl.core.api import Preset
from infer_ctl.core.policy import Aim, check_aims
from infer_ctl.sim.service import ScenarioSettings, default_settings
from infer_ctl.sim.suite import run_policies
from infer_ctl.sim.tick import SimResult
from infer_ctl.sim.trace import Trace, load_trace

WEEK_BUCKETS_5MIN = 7 * 288
# (quantile, scale-down stabilization s), from the least aim to the most; each rung at least the one before in both
LADDER: tuple[tuple[float, float], ...] = (
    (0.5, 0.0), (0.5, 30.0), (0.5, 60.0), (0.5, 120.0), (0.6, 180.0), (0.7, 240.0), (0.8, 300.0), (0.9, 300.0),
    (0.95, 300.0), (0.99, 600.0),
)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A replay: a trace segment, its rate scale and tick, scored from `score_from_s`, over seeds."""

    name: str
    trace: Trace
    rate_scale: float
    tick_s: float
    score_from_s: float
    seeds: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """A policy's figures on a scenario: the mean over its seeds."""

    attainment: float
    gpu_hours: float


def ladder_is_monotone(ladder: Sequence[tuple[float, float]]) -> bool:
    return all(b[0] >= a[0] and b[1] >= a[1] for a, b in itertools.pairwise(ladder))


def fit(objectives: Sequence[float], outcomes: Sequence[Sequence[Outcome]],
        ladder: Sequence[tuple[float, float]] = LADDER, miss_excess: float = 0.25
        ) -> tuple[tuple[Aim, ...], list[str]]:
    """The aim per objective from the rungs' training outcomes (`outcomes[rung][scenario]`): the lowest rung that
    reaches the objective on every scenario where some rung reaches it and, on a scenario no rung brings to the
    objective, misses at most `miss_excess` (a share) more requests than the best rung there (aiming low would
    give away what aiming high still serves: bursty traffic from no history), at least the rung of any lower
    objective. Notes name the scenarios no rung reaches."""
    if not ladder_is_monotone(ladder):
        raise ValueError("the ladder must rise in both quantile and stabilization")
    if len(outcomes) != len(ladder):
        raise ValueError(f"{len(outcomes)} rungs of outcomes for a ladder of {len(ladder)}")
    n_scen = len(outcomes[0]) if outcomes else 0
    aims: list[Aim] = []
    notes: list[str] = []
    floor = 0
    for objective in sorted(objectives):
        reachable = [s for s in range(n_scen)
                     if any(outcomes[k][s].attainment >= objective for k in range(len(ladder)))]
        for s in range(n_scen):
            if s not in reachable:
                notes.append(f"objective {objective:.2%}: scenario {s} is reached by no rung (best "
                             f"{max(outcomes[k][s].attainment for k in range(len(ladder))):.2%})")
        best = [max(outcomes[k][s].attainment for k in range(len(ladder))) for s in range(n_scen)]
        need = [objective if s in reachable else 1 - (1 - best[s]) * (1 + miss_excess) for s in range(n_scen)]
        rung = next((k for k in range(len(ladder))
                     if all(outcomes[k][s].attainment >= need[s] for s in range(n_scen))), len(ladder) - 1)
        if not reachable:
            notes.append(f"objective {objective:.2%}: no scenario reached")
        floor = max(floor, rung)
        q, w = ladder[floor]
        aims.append(Aim(objective, q, w))
    assert not check_aims(tuple(aims))
    return tuple(aims), notes


def run(scenario: Scenario, names: tuple[str, ...], settings: ScenarioSettings) -> list[Outcome]:
    """Each policy's mean figures over the scenario's seeds."""
    per_seed: list[list[SimResult]] = [
        run_policies(scenario.trace, names, settings, tick_s=scenario.tick_s, rate_scale=scenario.rate_scale,
                     score_from_s=scenario.score_from_s, seed=seed)
        for seed in scenario.seeds
    ]
    return [Outcome(float(np.mean([rs[i].slo_attainment for rs in per_seed])),
                    float(np.mean([rs[i].gpu_hours for rs in per_seed]))) for i in range(len(names))]


def aimed(settings: ScenarioSettings, quantile: float, window_s: float) -> ScenarioSettings:
    return replace(settings, quantile=quantile, scale_down_stabilization_s=window_s)


def scenarios(args: argparse.Namespace) -> tuple[list[Scenario], list[Scenario]]:
    """The training and the held-out replays."""
    bank = load_trace(args.bank, "counts-csv")
    azure = load_trace(args.azure, "azure-llm")
    seeds = tuple(_seeds(args.seeds))
    train_n, check_n = int(args.train_weeks * WEEK_BUCKETS_5MIN), int(args.check_weeks * WEEK_BUCKETS_5MIN)
    if train_n + check_n > bank.counts.size:
        raise SystemExit(f"--train-weeks + --check-weeks: bank_calls has {bank.counts.size / WEEK_BUCKETS_5MIN:.1f}")
    half = azure.counts.size // 2
    warm_s = args.azure_warmup_s
    train = [
        Scenario(f"bank weeks 1-{args.train_weeks:g}", Trace(bank.name, bank.start_s, bank.bucket_s,
                                                              bank.counts[:train_n]), 200.0, 30.0, 0.0, (0,)),
        Scenario("azure 1st half", Trace(azure.name, azure.start_s, azure.bucket_s, azure.counts[:half]), 5.0, 5.0,
                 warm_s, seeds),
    ]
    check = [
        Scenario(f"bank weeks {args.train_weeks + 1:g}-{args.train_weeks + args.check_weeks:g}",
                 Trace(bank.name, bank.start_s, bank.bucket_s, bank.counts[:train_n + check_n]), 200.0, 30.0,
                 train_n * bank.bucket_s, (0,)),
        Scenario("azure 2nd half", Trace(azure.name, azure.start_s + half * azure.bucket_s, azure.bucket_s,
                                         azure.counts[half:]), 5.0, 5.0, warm_s, seeds),
    ]
    return train, check


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def objective_lines(objective: float, figures: Sequence[tuple[str, float, float]], oracle_gpu_h: float | None,
                    ours: str = "infer-ctl") -> list[str]:
    """Attainment against the service's objective: per policy (name, attainment, GPU-hours) whether it reaches
    it, and the cheapest policy that does (the oracle aside): met when that is `ours`."""
    lines = [f"  objective {objective:.2%} within the SLO:"]
    for name, att, gpu in figures:
        ratio = f", {gpu / oracle_gpu_h:.2f} x the oracle's" if oracle_gpu_h else ""
        lines.append(f"    {name:<34} {att:>8.2%} ({'reached' if att >= objective else 'MISSED'}) at "
                     f"{gpu:.1f} GPU-h{ratio}")
    reaching = [(gpu, name) for name, att, gpu in figures if att >= objective and name != "oracle"]
    if reaching:
        gpu, name = min(reaching)
        ours_reach = any(n == ours and att >= objective for n, att, _ in figures)
        verdict = "met" if name == ours else (f"MISSED ({name} is cheaper)" if ours_reach else "MISSED (not reached)")
        lines.append(f"    the cheapest policy reaching it: {name} at {gpu:.1f} GPU-h; infer-ctl the cheapest: "
                     f"{verdict}")
    else:
        lines.append("    no policy reaches it (the oracle aside)")
    return lines


def objective_report(results: Sequence[SimResult], preset: Preset) -> list[str]:
    """The benchmark's lines on the objective: every policy's attainment against the objective of the preset the
    service runs on (`policies/scaling.yaml`), GPU-hours (x the oracle's), and whether infer-ctl is the cheapest
    policy reaching it."""
    objective = load_policies().scaling.presets[preset].attainment
    if objective is None:
        return [f"  objective: the preset {preset.value} states none"]
    oracle = next((r.gpu_hours for r in results if r.policy == "oracle"), None)
    return objective_lines(objective, [(r.policy, r.slo_attainment, r.gpu_hours) for r in results], oracle)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--azure", default="../shared/data/traces/AzureLLMInferenceTrace_code.csv")
    ap.add_argument("--bank", default="../shared/data/traces/bank_calls_5min.csv")
    ap.add_argument("--train-weeks", type=float, default=6.0)
    ap.add_argument("--check-weeks", type=float, default=8.0)
    ap.add_argument("--objectives", default="0.95,0.99,0.995,0.999")
    ap.add_argument("--cold-start", type=float, default=120.0)
    ap.add_argument("--seeds", default="0-2", help="seeds of the Azure halves (bank_calls: seed 0)")
    ap.add_argument("--azure-warmup-s", type=float, default=600.0)
    ap.add_argument("--before", default="0.95,300", help="the aim before calibration: quantile,window_s")
    ap.add_argument("--miss-excess", type=float, default=0.25,
                    help="on a training replay no rung brings to the objective: how many more requests (a share) "
                    "the aim may miss there than the best rung")
    ap.add_argument("--no-check", action="store_true", help="fit only, no held-out check")
    ap.add_argument("--check-only", action="store_true",
                    help="no fit: the held-out check of the aim table in policies/scaling.yaml")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    objectives = sorted(float(o) for o in args.objectives.split(","))
    base = default_settings(args.cold_start)
    train, check = scenarios(args)
    if args.check_only:
        aims = load_policies().scaling.aims
        print("the aim table of policies/scaling.yaml: " + ", ".join(
            f"{a.attainment:g} -> (q {a.quantile:g}, {a.scale_down_stabilization_s:g} s)" for a in aims))
        _check(args, base, check, aims)
        return 0
    print(f"training: {', '.join(s.name for s in train)}; cold start {args.cold_start:.0f} s; the ladder "
          f"(quantile, stabilization s): {', '.join(f'({q:g}, {w:g})' for q, w in LADDER)}", flush=True)
    outcomes: list[list[Outcome]] = []
    for q, w in LADDER:
        t0 = time.perf_counter()
        row = [run(s, ("infer-ctl",), aimed(base, q, w))[0] for s in train]
        outcomes.append(row)
        print(f"  q {q:<5g} window {w:>4.0f} s: " + "; ".join(
            f"{s.name} {o.attainment:.2%} at {o.gpu_hours:.1f} GPU-h" for s, o in zip(train, row, strict=True))
            + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    refs = [run(s, ("hpa", "oracle"), base) for s in train]
    for s, (hpa, oracle) in zip(train, refs, strict=True):
        print(f"  {s.name}: hpa {hpa.attainment:.2%} at {hpa.gpu_hours:.1f} GPU-h; oracle {oracle.attainment:.2%} "
              f"at {oracle.gpu_hours:.1f} GPU-h")
    aims, notes = fit(objectives, outcomes, miss_excess=args.miss_excess)
    for note in notes:
        print(f"  note: {note}")
    print("fitted (policies/scaling.yaml):\naim:")
    for a in aims:
        print(f"  - {{attainment: {a.attainment:g}, quantile: {a.quantile:g}, "
              f"scaleDownStabilizationSeconds: {a.scale_down_stabilization_s:g}}}")
    if not args.no_check:
        _check(args, base, check, aims)
    return 0


def _check(args: argparse.Namespace, base: ScenarioSettings, check: list[Scenario], aims: tuple[Aim, ...]) -> None:
    """Each aim on the held-out replays, beside the aim before calibration, HPA and the oracle."""
    bq, _, bw = args.before.partition(",")
    before = (float(bq), float(bw))
    print(f"held-out check: {', '.join(s.name for s in check)} (the aim before: quantile {before[0]:g}, "
          f"window {before[1]:g} s)", flush=True)
    for s in check:
        hpa, oracle = run(s, ("hpa", "oracle"), base)
        cache: dict[tuple[float, float], Outcome] = {}
        for aim_qw in [before, *((a.quantile, a.scale_down_stabilization_s) for a in aims)]:
            if aim_qw not in cache:
                cache[aim_qw] = run(s, ("infer-ctl",), aimed(base, *aim_qw))[0]
        print(f" {s.name}:")
        for a in aims:
            b, o = cache[before], cache[(a.quantile, a.scale_down_stabilization_s)]
            ours = f"infer-ctl aimed (q {a.quantile:g}, {a.scale_down_stabilization_s:g} s)"
            print("\n".join(objective_lines(a.attainment, [
                (f"infer-ctl before (q {before[0]:g}, {before[1]:g} s)", b.attainment, b.gpu_hours),
                (ours, o.attainment, o.gpu_hours),
                ("hpa", hpa.attainment, hpa.gpu_hours),
                ("oracle", oracle.attainment, oracle.gpu_hours)], oracle.gpu_hours, ours=ours)), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
