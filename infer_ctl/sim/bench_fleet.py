"""Benchmark: every policy over a fleet of services sharing one cluster of finite GPUs.

    .venv/bin/python -m infer_ctl.sim.bench_fleet [--services 24] [--hours 6] [--recipe-seed 0] [--nodes auto]
        [--gpus-per-node 8] [--headroom 1.25] [--policies all] [--presets balanced] [--per-service]
        [--lenders 0 --lender-replicas 4 --lender-max-yielded N --pool 0] [--warm-pool 0] [--shared-gib 0]
        [--overloads]
        [--placement controller|scheduler]

The fleet is `infer_ctl.sim.recipe.fleet_recipe` over the shared traces (`--azure`, `--bank`): its recipe (trace,
offset, scale, seed and model of every service) is printed first. Each policy runs over the whole fleet at once
(one run per policy: every service under that policy, all competing for the same GPUs), infer-ctl through the
controller's `plan_cycle` per service, the peers' autoscalers as ported in `infer_ctl.sim.policies`, the oracle
with each service's own hindsight schedule. Every service starts warm (`catalogue.initial_replicas`) with no history.
infer-ctl's new replicas are placed by the controller's placement (`infer_ctl.sim.placing`: its plugins on a
snapshot of the cluster, each replica pinned; its surplus ranked by its removal costs), the other policies' by the
simulator's scheduler rule (best fit); `--placement scheduler` puts infer-ctl's there too.

The cluster: `--nodes` nodes of `--gpus-per-node` H100 GPUs with `--host-memory-gib` each; `auto` (the default)
takes the fewest nodes that hold `--headroom` x the peak of what the oracle's per-service sizing would hold at
once on an unlimited cluster (`reference.fleet_oracle_demand`), so the oracle is barely constrained and a policy
holding much more than it meets the cluster's limit.

Printed per policy: the fleet's SLO attainment (requests within their service's SLO over all requests), the worst
and the median per-service attainment, how many services reach 99 %, GPU-hours (every GPU held, from the bind to
the deletion, warm hosts' included) and their ratio to the oracle's on the same cluster, host-memory GiB-hours
(the weights of replicas on warm hosts), the replica-hours spent Pending for want of a GPU, the replicas the
scheduler preempted (only infer-ctl's standby replicas run at a lower priority), cold starts, and the run's wall
time.

`--overloads` adds, per policy and kind of service (its trace), the requests that arrived beyond what the ready
replicas serve within the SLO, by the length of the overload (consecutive ticks over capacity) they arrived in: an
overload of a tick or two is over before a control cycle could wake or start anything, one of minutes is what a
warm tier could serve.

Lent GPUs (`--lenders N`): N batch services join the fleet, each with `--lender-replicas` replicas (its bounds) of
one whole GPU at a steady 80 % of their capacity (Poisson), and `spec.scaling.prewarm.yieldToSleepers`: under
infer-ctl their replicas run on warm hosts and yield them to other services' wakes (`infer_ctl.sim.fleet`, as the
controller runs them); the peers run them as any service. `--pool K` gives every one-GPU service of the recipe a
sleeping pool of K (`spec.scaling.prewarm.sleepingReplicas`; its replicas take a GPU whole, so its sleepers wait
only on lent GPUs); `--lender-max-yielded M` lets at most M of each lender's replicas be asleep at once for
other services' wakes (`spec.scaling.prewarm.maxYielded`). The table then adds a line per policy for the lenders
and for the others.

Memory shares (`--shared-gib G`): the recipe's one-GPU services run `Shared`, each replica a memory share of G GiB
of an H100-80GB (79.6 GiB in the catalog; 24 packs three on a device), for every policy; a device held for shares
is charged to the replicas on it by the memory each takes (`infer_ctl.sim.fleet`). A `Shared` service with the
sleeping tier makes warm hosts of its own on free GPUs (its device holds several of its replicas awake), which no
`Exclusive` one does.

Why a module of its own rather than a scenario of `bench_autoscaling`: that benchmark replays one service per
trace over seeds, start protocols and cold starts, with single-service targets and references (hindsight peak-hold
rules); a fleet run has other inputs (the recipe, the cluster) and other columns, and takes minutes rather than
seconds.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

import numpy as np

from infer_ctl.core.api import Preset
from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.catalogue import parse_policy_names, parse_presets
from infer_ctl.sim.cluster import GIB, ClusterSpec
from infer_ctl.sim.fleet import FleetResult
from infer_ctl.sim.fleet_state import FleetService
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.options import jobs_option
from infer_ctl.sim.recipe import build_fleet, fleet_recipe, service_settings
from infer_ctl.sim.reference import fleet_oracle_demand
from infer_ctl.sim.service import ScenarioSettings, with_preset, with_prewarm
from infer_ctl.sim.suite import run_fleet
from infer_ctl.sim.tick import SimConfig
from infer_ctl.sim.trace import load_trace
from infer_ctl.sim.warm import DEFAULT_PHYSICS, TierPhysics


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--azure", default="../shared/data/traces/AzureLLMInferenceTrace_code.csv")
    ap.add_argument("--bank", default="../shared/data/traces/bank_calls_5min.csv")
    ap.add_argument("--services", type=int, default=24)
    ap.add_argument("--hours", type=float, default=6.0, help="the fleet's horizon")
    ap.add_argument("--recipe-seed", type=int, default=0)
    ap.add_argument("--tick-s", type=float, default=5.0)
    ap.add_argument("--nodes", default="auto", help="a number, or auto (see the description)")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--host-memory-gib", type=float, default=2048.0)
    ap.add_argument("--headroom", type=float, default=1.25, help="for --nodes auto")
    ap.add_argument("--policies", default="all",
                    help="all or a comma-separated list of suite.POLICY_NAMES (or TIER_POLICY_NAMES)")
    ap.add_argument("--presets", default="balanced",
                    help="scaling presets infer-ctl runs with; the first is its main row, the others are rows "
                    "infer-ctl/<preset>")
    ap.add_argument("--score-from-s", type=float, default=0.0)
    ap.add_argument("--per-service", action="store_true", help="also print each service's attainment per policy")
    ap.add_argument("--overloads", action="store_true",
                    help="also print, per policy and kind of service, the requests beyond the ready replicas' "
                         "capacity by the length of the overload they arrived in")
    ap.add_argument("--lenders", type=int, default=0, help="batch services that lend their GPUs (yieldToSleepers)")
    ap.add_argument("--lender-replicas", type=int, default=4, help="each lender's replicas")
    ap.add_argument("--lender-max-yielded", type=int, default=None,
                    help="each lender's maxYielded: the most of its replicas asleep at once for other services' "
                         "wakes (unset: all)")
    ap.add_argument("--pool", type=int, default=0, help="sleepingReplicas of every one-GPU service of the recipe")
    ap.add_argument("--shared-gib", type=float, default=0.0,
                    help="the recipe's one-GPU services run Shared, each replica a memory share of this many GiB "
                         "of an H100-80GB (79.6 GiB); 0: Exclusive, each replica a GPU whole")
    ap.add_argument("--placement", choices=("controller", "scheduler"), default="controller",
                    help="where infer-ctl's new replicas go: the controller's placement (pinned claims, FGD-scored; "
                         "its surplus ranked by its removal costs), as the controller places them; or the "
                         "simulator's scheduler rule, as every other policy's (best fit, for comparison)")
    ap.add_argument("--warm-pool", type=int, default=0,
                    help="warmPoolGPUs: warm hosts with no model awake the cluster may hold for whole-GPU sleepers")
    ap.add_argument("--jobs", type=jobs_option, default=1,
                    help="worker processes for the policies' runs over the fleet, run at once; the figures are the "
                    "same as with 1, but for the wall times")
    args = ap.parse_args(argv)
    if args.lender_max_yielded is not None and (args.lender_max_yielded < 0 or not args.lenders):
        ap.error(f"argument --lender-max-yielded: a whole number >= 0 for the lenders (--lenders N), got "
                 f"{args.lender_max_yielded} with --lenders {args.lenders}")
    return args


def auto_nodes(demand_peak_gpus: float, gpus_per_node: int, headroom: float) -> int:
    """The fewest nodes holding `headroom` x the peak. E.g. a peak of 170 GPUs, 1.25, 8 per node: 27 nodes."""
    return max(1, math.ceil(headroom * demand_peak_gpus / gpus_per_node - 1e-9))


def table(results: Sequence[FleetResult], oracle_gpu_hours: float | None) -> list[str]:
    w = max(11, *(len(r.policy) for r in results))
    rows = [f"  {'policy':<{w}} {'SLO':>8} {'worst svc':>9} {'median svc':>10} {'svc>=99%':>8} {'GPU-h':>8} "
            f"{'x oracle':>8} {'host GiB-h':>10} {'pending rep-h':>13} {'preempted':>9} {'cold':>6} {'wall s':>7}"]
    for r in results:
        ratio = f"{r.gpu_hours / oracle_gpu_hours:>8.2f}" if oracle_gpu_hours else f"{'-':>8}"
        reach = sum(s.slo_attainment >= 0.99 for s in r.services)
        rows.append(f"  {r.policy:<{w}} {r.slo_attainment:>8.2%} {r.worst_attainment:>9.2%} "
                    f"{r.median_attainment:>10.2%} {f'{reach}/{len(r.services)}':>8} {r.gpu_hours:>8.1f} {ratio} "
                    f"{r.host_memory_gib_hours:>10.1f} {r.pending_replica_s / 3600.0:>13.1f} {r.preempted:>9d} "
                    f"{r.cold_starts:>6d} {r.wall_s:>7.1f}")
    return rows


def group_table(results: Sequence[FleetResult], lenders: frozenset[str]) -> list[str]:
    """Per policy, the lenders' and the other services' attainment (requests within their SLO over all theirs)
    and GPU-hours (warm hosts split between the services on them)."""
    w = max(11, *(len(r.policy) for r in results))
    rows = [f"  {'policy':<{w}} {'group':<8} {'SLO':>8} {'GPU-h':>8}"]
    for r in results:
        for group, pick in (("lenders", True), ("others", False)):
            mine = [s for name, s in zip(r.names, r.services, strict=True) if (name in lenders) == pick]
            requests = sum(s.requests for s in mine)
            within = sum(s.slo_attainment * s.requests for s in mine) / requests if requests else 1.0
            rows.append(f"  {r.policy:<{w}} {group:<8} {within:>8.2%} {sum(s.gpu_hours for s in mine):>8.1f}")
    return rows


def lender_services(n: int, replicas: int, horizon_s: float, tick_s: float, *, seed: int,
                    settings: Callable[[str, ServiceModel], ScenarioSettings],
                    max_yielded: int | None = None) -> tuple[FleetService, ...]:
    """`n` batch services of `replicas` one-GPU replicas (their bounds) at 80 % of their capacity, steady
    (Poisson), that yield their GPUs to other services' sleepers (at most `max_yielded` of them asleep at once
    for others, `maxYielded`; None: all)."""
    out = []
    ticks = round(horizon_s / tick_s)
    bound = {} if max_yielded is None else {"maxYielded": max_yielded}
    for i in range(n):
        model = ServiceModel(min_replicas=replicas, max_replicas=replicas)
        lender = with_prewarm(settings(f"batch-{i:02d}", model), yieldToSleepers=True, **bound)
        rate = 0.8 * replicas * model.target_rps_per_replica
        arrivals = np.random.default_rng([seed, 1000 + i]).poisson(np.full(ticks, rate * tick_s)).astype(np.float64)
        out.append(FleetService(f"batch-{i:02d}", arrivals, lender, 10_000 * (seed + 1) + i))
    return tuple(out)


def with_pool(services: Sequence[FleetService], pool: int) -> tuple[FleetService, ...]:
    """The one-GPU services with a sleeping pool of `pool` (the others as they are)."""
    if pool <= 0:
        return tuple(services)
    return tuple(replace(s, settings=with_prewarm(s.settings, sleepingReplicas=pool))
                 if s.settings.model.gpus_per_replica == 1 else s for s in services)


OVERLOAD_BUCKETS_S = (10.0, 30.0, 120.0)  # overloads up to 10 s, up to 30 s, up to 2 min, longer


def overloads(arrivals_rps: FloatArray, ready: FloatArray, capacity_rps: float, tick_s: float) -> list[float]:
    """The requests beyond the ready replicas' capacity (`capacity_rps` each), by the length of the overload they
    arrived in (consecutive ticks over capacity), in `OVERLOAD_BUCKETS_S` and beyond. E.g. 5 s ticks, capacity 8,
    arrivals 20/s over one ready replica for two ticks: [120, 0, 0, 0] (an overload of 10 s)."""
    over = np.maximum(0.0, arrivals_rps - ready * capacity_rps) * tick_s
    out = [0.0] * (len(OVERLOAD_BUCKETS_S) + 1)
    start = None
    for t in range(over.size + 1):
        if t < over.size and over[t] > 0:
            start = t if start is None else start
            continue
        if start is not None:
            length = (t - start) * tick_s
            out[next((i for i, b in enumerate(OVERLOAD_BUCKETS_S) if length <= b + 1e-9),
                     len(OVERLOAD_BUCKETS_S))] += float(over[start:t].sum())
            start = None
    return out


def overload_table(results: Sequence[FleetResult], groups: dict[str, str], capacity: dict[str, float],
                   tick_s: float) -> list[str]:
    """Per policy and group of services (`groups`: service -> group), the requests beyond the ready replicas'
    capacity within the SLO (`capacity`: each service's per replica) and their share by the overload's length:
    what no wake could serve (an overload shorter than a control cycle and a wake) and what one could."""
    w = max(11, *(len(r.policy) for r in results))
    names = [f"<={OVERLOAD_BUCKETS_S[0]:g} s", *(f"<={b:g} s" for b in OVERLOAD_BUCKETS_S[1:]),
             f">{OVERLOAD_BUCKETS_S[-1]:g} s"]
    rows = [f"  {'policy':<{w}} {'group':<12} {'beyond capacity':>15} " + " ".join(f"{n:>8}" for n in names)]
    for r in results:
        for group in sorted(set(groups.values())):
            sums = [0.0] * len(names)
            for name, svc in zip(r.names, r.services, strict=True):
                if groups.get(name) != group:
                    continue
                for i, v in enumerate(overloads(svc.arrivals_rps, svc.ready, capacity[name], tick_s)):
                    sums[i] += v
            total = sum(sums)
            shares = " ".join(f"{(v / total if total else 0.0):>8.0%}" for v in sums)
            rows.append(f"  {r.policy:<{w}} {group:<12} {total:>15,.0f} {shares}")
    return rows


def per_service_table(results: Sequence[FleetResult]) -> list[str]:
    """Each service's SLO attainment and GPU-hours under each policy."""
    w = max(11, *(len(r.policy) for r in results))
    rows = ["  " + f"{'service':<8}" + "".join(f" {r.policy:>{w}}" for r in results)]
    for i, name in enumerate(results[0].names):
        cells = "".join(f" {f'{r.services[i].slo_attainment:.2%} {r.services[i].gpu_hours:.0f}h':>{w}}"
                        for r in results)
        rows.append(f"  {name:<8}{cells}")
    return rows


def _progress(name: str) -> Callable[[float], None]:
    """Tenths of a run on a terminal's stderr."""
    last = [-1]

    def cb(frac: float) -> None:
        pct = int(frac * 10)
        if pct != last[0] and sys.stderr.isatty():
            last[0] = pct
            print(f"\r  {name}: {pct * 10}%", end="", file=sys.stderr, flush=True)

    return cb


def _run_one(label: str, name: str, fleet: tuple[FleetService, ...], *, cluster: ClusterSpec, config: SimConfig,
             physics: TierPhysics, placement: bool, progress: Callable[[float], None] | None = None) -> FleetResult:
    """One policy over the fleet, its row named `label`; top-level, for a worker process to run it."""
    r = run_fleet(fleet, name, cluster, config, progress=progress, physics=physics, placement=placement)
    return r if label == r.policy else replace(r, policy=label)


def run_policies(names: Sequence[str], cluster: ClusterSpec, config: SimConfig,
                 fleets: dict[Preset, tuple[FleetService, ...]], physics: TierPhysics = DEFAULT_PHYSICS, *,
                 placement: bool = True, jobs: int = 1) -> list[FleetResult]:
    """Every policy over the fleet (infer-ctl's replicas placed by the controller's placement unless `placement`
    is False); infer-ctl once per preset (`fleets`: the fleet's services on each preset, the
    first preset's row named infer-ctl, the others infer-ctl/<preset>); the peers on the first preset's fleet
    (the preset changes nothing of theirs). `jobs` > 1 runs them in as many worker processes, in this order, with
    the same figures but for the wall times (each run depends on its inputs alone); a run's progress is then only
    its line when done."""
    if jobs < 1:
        raise ValueError(f"jobs: {jobs} must be >= 1")
    presets = list(fleets)
    runs: list[tuple[str, str, tuple[FleetService, ...]]] = []  # label, policy, fleet
    for name in names:
        runs += [(name, name, fleets[presets[0]])] if name != "infer-ctl" else [
            ("infer-ctl" if i == 0 else f"infer-ctl/{p.value}", name, fleets[p]) for i, p in enumerate(presets)]
    one = functools.partial(_run_one, cluster=cluster, config=config, physics=physics, placement=placement)

    def results() -> Iterator[FleetResult]:
        if jobs == 1 or len(runs) < 2:
            for label, name, fleet in runs:
                yield one(label, name, fleet, progress=_progress(label))
            return
        with ProcessPoolExecutor(max_workers=min(jobs, len(runs))) as pool:
            yield from pool.map(one, *zip(*runs, strict=True))  # in order; the runs not started cancelled on a failure

    out: list[FleetResult] = []
    for (label, _, _), r in zip(runs, results(), strict=True):
        out.append(r)
        print(f"\r  {label}: done in {r.wall_s:.1f} s", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    t0 = time.perf_counter()
    names = parse_policy_names(args.policies)
    presets = parse_presets(args.presets)
    azure = load_trace(args.azure, "azure-llm")
    bank = load_trace(args.bank, "counts-csv")
    horizon_s = args.hours * 3600.0
    recipe = fleet_recipe(args.services, horizon_s, args.recipe_seed, azure.duration_s, args.shared_gib)

    def settings_for(preset: Preset) -> tuple[FleetService, ...]:
        def settings(name: str, model: ServiceModel) -> ScenarioSettings:
            return with_preset(service_settings(name, model), preset)

        fleet = with_pool(build_fleet(recipe, azure, bank, horizon_s=horizon_s, tick_s=args.tick_s,
                                      settings=settings), args.pool)
        return fleet + lender_services(args.lenders, args.lender_replicas, horizon_s, args.tick_s,
                                       seed=args.recipe_seed, settings=settings, max_yielded=args.lender_max_yielded)

    by_preset = {p: settings_for(p) for p in presets}
    services = by_preset[presets[0]]
    demand = fleet_oracle_demand(services, args.tick_s)
    peak = float(demand.max())
    if args.nodes == "auto":
        nodes, how = auto_nodes(peak, args.gpus_per_node, args.headroom), f"auto: {args.headroom:g} x the oracle's peak"
    else:
        try:
            nodes, how = int(args.nodes), "--nodes"
        except ValueError:
            raise SystemExit(f"--nodes: {args.nodes!r} is not a number nor auto") from None
    cluster = ClusterSpec(nodes, args.gpus_per_node, round(args.host_memory_gib * GIB))
    config = SimConfig(tick_s=args.tick_s, score_from_s=args.score_from_s)

    print(f"fleet: {len(recipe)} services over {args.hours:g} h (recipe seed {args.recipe_seed}), tick "
          f"{args.tick_s:g} s, every service starting warm with no history; infer-ctl on preset "
          f"{presets[0].value}")
    for line in recipe:
        print(f"  {line.describe()}")
    if args.lenders:
        print(f"  + {args.lenders} batch services of {args.lender_replicas} one-GPU replicas at 80 % of their "
              f"capacity, lending their GPUs (yieldToSleepers"
              + ("" if args.lender_max_yielded is None else f", at most {args.lender_max_yielded} of each asleep "
                 "for others at once: maxYielded") + f"); one-GPU services' sleeping pool: {args.pool}")
    print(f"cluster: {cluster.describe()} ({how})")
    print(f"  reference: the oracle's per-service hindsight sizing would hold at most {peak:.0f} GPUs at once "
          f"({float(demand.sum()) * args.tick_s / 3600.0:.1f} GPU-h) with no GPU limit; here it runs on the "
          f"cluster above like every policy")
    if args.warm_pool:
        print(f"  warm pool (warmPoolGPUs): {args.warm_pool} warm hosts with no model awake for whole-GPU sleepers")
    results = run_policies(names, cluster, config, by_preset, TierPhysics(pool_gpus=args.warm_pool),
                           placement=args.placement == "controller", jobs=args.jobs)
    oracle = next((r for r in results if r.policy == "oracle"), None)
    print("\n".join(table(results, oracle.gpu_hours if oracle is not None and oracle.gpu_hours > 0 else None)))
    if args.lenders:
        print("\n".join(group_table(results, frozenset(s.name for s in services if s.name.startswith("batch-")))))
    if args.overloads:
        groups = {line.name: line.source for line in recipe}
        groups.update({s.name: "lender" for s in services if s.name not in groups})
        capacity = {s.name: s.settings.model.target_rps_per_replica for s in services}
        print("requests beyond the ready replicas' capacity (at the SLO), by the length of the overload they "
              "arrived in:")
        print("\n".join(overload_table(results, groups, capacity, args.tick_s)))
    if args.per_service:
        print("per service (SLO attainment, GPU-hours):")
        print("\n".join(per_service_table(results)))
    print(f"wall {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
