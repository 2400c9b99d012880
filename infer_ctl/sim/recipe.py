"""The default fleet (`fleet_recipe`): `n` services (24) over `horizon_s` (6 hours), built from the shared traces as
time-shifted and scaled segments. Service i draws from numpy's generator seeded with (recipe seed, i):

- source by i mod 4: 0 and 2 `bank` (bank_calls, 5-minute call-centre arrivals on weekdays 07:00-21:00), 1
  `azure-loop` (the Azure LLM code trace, 57 minutes, repeated and started `offset_s` into it), 3 `azure-burst`
  (the Azure trace once, starting `offset_s` into the horizon, silence before and after: a service that wakes up);
- `bank`: a weekday of the first 32 weeks (week uniform in 0..31, day uniform in Monday..Friday) and a start
  uniform on the 5-minute grid from 07:00 to 19:55 (`offset_s` from the trace's first bucket, Monday 2003-03-03
  07:00; a segment running past 21:00 goes quiet), rate x `scale` uniform in [15, 60] (peaks of 20-90 req/s);
- `azure-loop`: offset uniform in whole seconds over the trace's length; `azure-burst`: offset uniform in whole
  seconds over [0, horizon - trace length]; both at rate x `scale` uniform in [1, 4];
- size by i mod 5: 4 is a large model (a 70B: 2 GPUs per replica, 360 s cold start, 4 req/s
  per replica at a 4 s SLO, 1.6 s base latency) at half the drawn scale; the others (8B) take 1 GPU (or, with
  `shared_gib`, a memory share of that many GiB of one: `Shared`), 8 req/s per replica at a 2 s SLO (0.8 s base),
  and a 120 s (i even) or 240 s (i odd) cold start;
- `seed` = 1000 x recipe seed + i: the Poisson draws of its arrivals (`infer_ctl.sim.tick.arrivals_per_tick`) and,
  in every run, its cold-start samples (`SimConfig.seed` is not used: each service has its own).

Every service may scale to zero where its policy can, up to 200 replicas, as the single-service benchmark's
default service. `RecipeLine.describe` prints one line per service (the benchmark prints them all).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infer_ctl.core import api
from infer_ctl.sim.fleet_state import FleetService
from infer_ctl.sim.model import ServiceModel
from infer_ctl.sim.service import ScenarioSettings
from infer_ctl.sim.tick import arrivals_per_tick
from infer_ctl.sim.trace import Trace

SOURCES = ("bank", "azure-loop", "bank", "azure-burst")  # by service index mod 4
BANK_WEEKS = 32
BANK_OPEN_BUCKETS = 13 * 12  # start on the 5-minute grid from 07:00 to 19:55
AZURE_SCALE = (1.0, 4.0)
BANK_SCALE = (15.0, 60.0)


# ----------------------------------------------------------------------------------------------- the recipe


@dataclass(frozen=True, slots=True)
class RecipeLine:
    """One service of a fleet: which trace, where in it (or in the horizon), how scaled, its seed and model."""

    name: str
    source: str  # bank | azure-loop | azure-burst
    offset_s: float
    scale: float
    seed: int
    model: ServiceModel

    def takes(self) -> str:
        m = self.model
        return f"{m.memory_share_gib:g} GiB/replica" if m.memory_share_gib else f"{m.gpus_per_replica} GPU/replica"

    def describe(self) -> str:
        m = self.model
        if self.source == "bank":
            day, rest = divmod(self.offset_s, 86400.0)
            week, weekday = divmod(int(day), 7)
            start = 7 * 3600 + rest
            where = (f"week {week} {('Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun')[weekday]} "
                     f"{int(start // 3600):02d}:{int(start % 3600 // 60):02d}")
        elif self.source == "azure-loop":
            where = "into the trace, looped"
        else:
            where = "into the horizon, once"
        return (f"{self.name:<8} {self.source:<11} offset {self.offset_s:>8.0f} s ({where:<22}) x{self.scale:<6g} "
                f"seed {self.seed:<5d} {self.takes()}, cold start {m.cold_start_s:.0f} s, "
                f"{m.target_rps_per_replica:g} req/s per replica at a {m.slo_latency_s:g} s SLO")


def fleet_recipe(n: int = 24, horizon_s: float = 6 * 3600.0, seed: int = 0,
                 azure_s: float = 3437.0, shared_gib: float = 0.0) -> tuple[RecipeLine, ...]:
    """The fleet of the module docstring; `azure_s` is the Azure trace's length (its 1-second buckets). With
    `shared_gib`, the one-GPU services are `Shared`: each replica a memory share of that many GiB of one GPU."""
    if n < 1:
        raise ValueError(f"n: {n} services; need at least 1")
    if horizon_s < azure_s:
        raise ValueError(f"horizon_s: {horizon_s:g} s is shorter than the Azure trace ({azure_s:g} s)")
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        source = SOURCES[i % len(SOURCES)]
        if source == "bank":
            day = 7 * int(rng.integers(0, BANK_WEEKS)) + int(rng.integers(0, 5))
            offset = day * 86400.0 + 300.0 * int(rng.integers(0, BANK_OPEN_BUCKETS))
            scale = round(float(rng.uniform(*BANK_SCALE)), 1)
        else:
            span = azure_s if source == "azure-loop" else horizon_s - azure_s + 1
            offset = float(rng.integers(0, int(span)))
            scale = round(float(rng.uniform(*AZURE_SCALE)), 2)
        if i % 5 == 4:
            model = ServiceModel(target_rps_per_replica=4.0, slo_latency_s=4.0, base_latency_s=1.6,
                                 cold_start_s=360.0, gpus_per_replica=2, min_replicas=0)
            scale = round(scale / 2, 2)
        else:
            model = ServiceModel(cold_start_s=120.0 if i % 2 == 0 else 240.0, min_replicas=0,
                                 memory_share_gib=shared_gib)
        out.append(RecipeLine(f"svc-{i:02d}", source, offset, scale, 1000 * seed + i, model))
    return tuple(out)


def segment(line: RecipeLine, azure: Trace, bank: Trace, horizon_s: float) -> Trace:
    """The service's trace over the horizon, unscaled (the scale is applied with its Poisson draws)."""
    if line.source == "bank":
        per = round(horizon_s / bank.bucket_s)
        first = round(line.offset_s / bank.bucket_s)
        counts = np.zeros(per)
        part = bank.counts[first:first + per]
        counts[:part.size] = part
        return Trace(f"{bank.name}@{line.offset_s:.0f}", bank.start_s + line.offset_s, bank.bucket_s, counts)
    per = round(horizon_s / azure.bucket_s)
    shift = round(line.offset_s / azure.bucket_s)
    if line.source == "azure-loop":
        tiled = np.tile(azure.counts, math.ceil((per + shift) / azure.counts.size))
        counts = tiled[shift:shift + per]
    elif line.source == "azure-burst":
        counts = np.zeros(per)
        part = azure.counts[:max(0, per - shift)]
        counts[shift:shift + part.size] = part
    else:
        raise ValueError(f"source: {line.source!r} is not one of bank, azure-loop, azure-burst")
    return Trace(f"{azure.name}@{line.offset_s:.0f}", azure.start_s, azure.bucket_s, np.asarray(counts, dtype=float))


def service_settings(name: str, model: ServiceModel) -> ScenarioSettings:
    """The scenario settings of a fleet service (the balanced preset's), infer-ctl running an InferenceService of
    that name."""
    spec: dict[str, Any] = {"model": {"name": name, "parameters": "70B" if model.gpus_per_replica > 1 else "8B"},
                            "runtime": {"image": "sim"}}
    if model.memory_share_gib:  # a memory share of one GPU: the model's memory, stated
        spec["model"]["memory"] = f"{model.memory_share_gib:g}Gi"
        spec["accelerator"] = {"sharing": api.Sharing.SHARED.value}
    manifest = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, "namespace": "fleet"},
                "spec": spec}
    return ScenarioSettings(model, manifest=manifest)


def build_fleet(recipe: Sequence[RecipeLine], azure: Trace, bank: Trace, *, horizon_s: float, tick_s: float,
                settings: Callable[[str, ServiceModel], ScenarioSettings] = service_settings,
                ) -> tuple[FleetService, ...]:
    """Each recipe line's segment, scaled with Poisson draws from its seed, per tick."""
    return tuple(
        FleetService(line.name,
                     arrivals_per_tick(segment(line, azure, bank, horizon_s), tick_s, line.scale,
                                       np.random.default_rng(line.seed)),
                     settings(line.name, line.model), line.seed)
        for line in recipe)
