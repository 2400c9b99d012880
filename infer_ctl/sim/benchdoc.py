"""Write BENCHMARKS.md: run the benchmarks and record what each printed, with the command, date, commit and machine.

    .venv/bin/python -m infer_ctl.sim.benchdoc --section openb --section forecast [--out BENCHMARKS.md]
        [--openb-dir ../shared/data/openb] [--traces-dir ../shared/data/traces] [--openb-seeds 42-51]
        [--variant-seeds 42-51]

Figures written into docstrings go stale: nothing re-runs them when the code changes. Here each table is the
verbatim output of one command, run as a subprocess, under the command line, the UTC date, the git commit (and
whether the work tree had uncommitted changes) and the machine (cores, CPU, load average: the machine may be
shared, which moves wall times and latencies but not allocations or forecast errors). A summary computed from
that output (means over seeds) may follow it, marked as such.

Each section of the document sits between `<!-- benchdoc:begin NAME -->` and `<!-- benchdoc:end NAME -->`.
A run rewrites the sections it is given and keeps the others as the file has them, so a slow section can be
regenerated alone; a section that has never run says how to run it. Data paths are arguments: the data stays
where it is (shared/data), never in the repository.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from infer_ctl.sim.options import jobs_option

OPENB_POLICIES = "random,dotprod,clustering,packing,bestfit,fgd,infer-ctl"
# The openb pod lists besides the default one (shared/data/openb/REFERENCE.md): CPU-only share, GPU-sharing
# share, GPU-model constraints and multi-GPU share varied.
OPENB_VARIANTS = ("cpu050", "cpu100", "gpushare40", "gpushare60", "gpuspec10", "gpuspec20", "multigpu20",
                  "multigpu30")
# openb table columns averaged over seeds in the summary
OPENB_MEANS = ("alloc_pct_at_100", "alloc_pct_at_130", "unallocated_gpus_at_130", "frag_ratio_pct_at_90",
               "decision_ms_p50", "decision_ms_p99")


@dataclass(frozen=True, slots=True)
class Run:
    """One benchmark command: its arguments after `python -m`, and a label for its heading."""

    label: str
    module_args: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    run: Run
    command: str
    exit_code: int
    wall_s: float
    stdout: str
    stderr: str


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    title: str
    about: str
    runs: Callable[[argparse.Namespace], list[Run]]
    summary: Callable[[list[Outcome]], list[str]] | None = None


def _openb_run(args: argparse.Namespace, pods: str, policies: str, seeds: str, label: str) -> Run:
    openb = Path(args.openb_dir)
    return Run(label, ("infer_ctl.cli.main", "bench", "placement",
                       "--nodes", str(openb / "openb_node_list_gpu_node.csv"),
                       "--pods", str(openb / f"openb_pod_list_{pods}.csv"),
                       "--policy", policies, "--seeds", seeds, "--no-progress"))


def _openb_runs(args: argparse.Namespace) -> list[Run]:
    return [_openb_run(args, "default", OPENB_POLICIES, args.openb_seeds, "default trace, every policy")]


def _openb_variant_runs(args: argparse.Namespace) -> list[Run]:
    return [_openb_run(args, v, "fgd,infer-ctl", args.variant_seeds, f"{v} trace") for v in OPENB_VARIANTS]


def _forecast_runs(args: argparse.Namespace) -> list[Run]:
    trace = str(Path(args.traces_dir) / "bank_calls_5min.csv")
    return [
        Run("bank_calls at its own scale (peak 1.6 requests/s)",
            ("infer_ctl.sim.bench_forecast", "--trace", trace)),
        Run("bank_calls x200 (the autoscaling benchmark's service, peak about 300 requests/s)",
            ("infer_ctl.sim.bench_forecast", "--trace", trace, "--rate-scale", "200")),
    ]


def _tick_runs(args: argparse.Namespace) -> list[Run]:
    return [Run("1,000 services", ("infer_ctl.sim.bench_tick",))]


def _jobs(args: argparse.Namespace) -> tuple[str, ...]:
    """`--jobs N` for the benchmarks that take it (bench_autoscaling, bench_fleet), when more than one: the command
    shown is the command run, and one job is their default."""
    return ("--jobs", str(args.jobs)) if args.jobs > 1 else ()


def _autoscaling_runs(args: argparse.Namespace) -> list[Run]:
    traces = Path(args.traces_dir)
    return [Run("every scenario", ("infer_ctl.sim.bench_autoscaling",
                                   "--azure", str(traces / "AzureLLMInferenceTrace_code.csv"),
                                   "--bank", str(traces / "bank_calls_5min.csv"), *_jobs(args)))]


def _sim_tick_runs(args: argparse.Namespace) -> list[Run]:
    traces = Path(args.traces_dir)
    azure, bank = str(traces / "AzureLLMInferenceTrace_code.csv"), str(traces / "bank_calls_5min.csv")
    runs = [Run(f"the Azure code trace and the step, tick {tick} s",
                ("infer_ctl.sim.bench_autoscaling", "--azure", azure, "--scenarios", "azure,step",
                 "--cold-starts", "120", "--starts", "warm", "--presets", "balanced", "--azure-warmup-s", "0",
                 "--hindsight", "", "--policies", "infer-ctl,infer-ctl+tiers,hpa,kpa", "--trace-tick-s", tick,
                 *_jobs(args)))
            for tick in ("1", "2", "5")]
    runs += [Run(f"the fleet, tick {tick} s",
                 ("infer_ctl.sim.bench_fleet", "--azure", azure, "--bank", bank,
                  "--policies", "infer-ctl,infer-ctl+tiers,hpa,oracle", "--tick-s", tick, *_jobs(args)))
             for tick in ("1", "2", "5")]
    return runs


def _lent_gpu_runs(args: argparse.Namespace) -> list[Run]:
    traces = Path(args.traces_dir)
    data = ("--azure", str(traces / "AzureLLMInferenceTrace_code.csv"), "--bank", str(traces / "bank_calls_5min.csv"))
    runs = [Run(f"4 lenders of 4 GPUs, sleeping pools of {pool}",
                ("infer_ctl.sim.bench_fleet", *data, "--lenders", "4", "--lender-replicas", "4", "--pool", str(pool),
                 "--policies", "infer-ctl,infer-ctl+tiers,hpa,oracle", "--per-service", *_jobs(args)))
            for pool in (0, 2)]
    return [*runs, Run("4 lenders of 4 GPUs, at most 1 of each asleep for others at once (maxYielded), sleeping "
                       "pools of 2",
                       ("infer_ctl.sim.bench_fleet", *data, "--lenders", "4", "--lender-replicas", "4",
                        "--lender-max-yielded", "1", "--pool", "2", "--policies", "infer-ctl,infer-ctl+tiers",
                        "--per-service", *_jobs(args)))]


def _warm_pool_runs(args: argparse.Namespace) -> list[Run]:
    traces = Path(args.traces_dir)
    data = ("--azure", str(traces / "AzureLLMInferenceTrace_code.csv"), "--bank", str(traces / "bank_calls_5min.csv"))
    return [Run(f"a warm pool of {gpus} GPUs, sleeping pools of 2",
                ("infer_ctl.sim.bench_fleet", *data, "--pool", "2", "--warm-pool", str(gpus),
                 "--policies", "infer-ctl,infer-ctl+tiers,fma-pool,oracle", "--overloads", "--per-service",
                 *_jobs(args)))
            for gpus in (0, 8, 16)]


def _memory_share_runs(args: argparse.Namespace) -> list[Run]:
    traces = Path(args.traces_dir)
    data = ("--azure", str(traces / "AzureLLMInferenceTrace_code.csv"), "--bank", str(traces / "bank_calls_5min.csv"))
    return [Run("the one-GPU services on 24 GiB memory shares",
                ("infer_ctl.sim.bench_fleet", *data, "--shared-gib", "24", "--policies",
                 "infer-ctl,infer-ctl+tiers,infer-ctl+sleep,infer-ctl+cache,infer-ctl+aim,hpa,kpa,keda,ray-serve,"
                 "aibrix-apa,fma-pool,kserve-cache,oracle", "--overloads", "--per-service", *_jobs(args)))]


def _loadgen_runs(args: argparse.Namespace) -> list[Run]:
    return [Run("aiohttp's client and httpx's own transport, one core each, 3 runs per rate",
                ("loadgen.bench", "--clients", "aiohttp,httpx", "--repeat", "3", "--duration", "10",
                 "--rates", "800,2000,3000,4000,5000,6000,8000"))]


def parse_openb_table(text: str) -> list[dict[str, str]]:
    """The rows of `infer-ctl bench placement`'s table: a header line of column names, then one line per run."""
    rows: list[dict[str, str]] = []
    keys: list[str] = []
    for line in text.splitlines():
        cells = line.split()
        if cells[:2] == ["policy", "seed"]:
            keys = cells
        elif keys and len(cells) == len(keys):
            rows.append(dict(zip(keys, cells, strict=True)))
    return rows


def openb_means(rows: Sequence[dict[str, str]]) -> dict[str, dict[str, float]]:
    """policy -> column -> mean over the policy's rows (seeds), for the OPENB_MEANS columns; policies in order of
    appearance."""
    out: dict[str, dict[str, float]] = {}
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        out[policy] = {k: statistics.fmean(float(r[k]) for r in mine) for k in OPENB_MEANS if k in mine[0]}
    return out


def _openb_summary(outcomes: list[Outcome]) -> list[str]:
    lines = ["Summary (computed by benchdoc from the table above): the mean of each column over the seeds.", "",
             "| policy | seeds | " + " | ".join(OPENB_MEANS) + " |", "|---|---:|" + "---:|" * len(OPENB_MEANS)]
    for outcome in outcomes:
        rows = parse_openb_table(outcome.stdout)
        for policy, means in openb_means(rows).items():
            n = sum(1 for r in rows if r["policy"] == policy)
            lines.append(f"| {policy} | {n} | " + " | ".join(f"{means.get(k, float('nan')):.3f}"
                                                            for k in OPENB_MEANS) + " |")
    return lines


def _openb_variant_summary(outcomes: list[Outcome]) -> list[str]:
    lines = ["Summary (computed by benchdoc from the tables above): GPU allocation at 130 % arrivals, mean over "
             "the seeds, and infer-ctl's lead over FGD in points.", "",
             "| trace | seeds | fgd | infer-ctl | infer-ctl - fgd |", "|---|---:|---:|---:|---:|"]
    for outcome in outcomes:
        rows = parse_openb_table(outcome.stdout)
        means = openb_means(rows)
        if "fgd" not in means or "infer-ctl" not in means:
            continue
        fgd, ours = means["fgd"]["alloc_pct_at_130"], means["infer-ctl"]["alloc_pct_at_130"]
        n = sum(1 for r in rows if r["policy"] == "infer-ctl")
        lines.append(f"| {outcome.run.label.removesuffix(' trace')} | {n} | {fgd:.2f} | {ours:.2f} | "
                     f"{ours - fgd:+.2f} |")
    return lines


SECTIONS: tuple[Section, ...] = (
    Section(
        "openb", "GPU placement on the openb trace (the FGD paper's protocol)",
        "Pods of the Alibaba openb GPU-cluster trace arrive until their GPU request reaches 130 % of the cluster's "
        "GPUs and never leave (`infer_ctl/sim/openb/runner.py`); GPU allocation (% of capacity) at 100 % and 130 % "
        "arrivals, unallocated GPUs, the fragmentation ratio at 90 %, and decision latency, per policy and seed. "
        "The Fragmentation and BestFit docstrings (`infer_ctl/place/plugins.py`) point here.",
        _openb_runs, _openb_summary),
    Section(
        "openb-variants", "GPU placement on the openb variant traces: infer-ctl against FGD",
        "The same protocol on the trace's variants (more CPU-only pods, more GPU sharing, more GPU-model "
        "constraints, more multi-GPU pods).",
        _openb_variant_runs, _openb_variant_summary),
    Section(
        "forecast", "Forecast quality on bank_calls",
        "Rolling origin as the engine runs it: weekly re-selection by backtest, then a week of one-bucket updates "
        "(`infer_ctl/sim/bench_forecast.py`): MASE, coverage of the upper quantile, the band's width and the "
        "pinball loss per horizon, then coverage by forecast level and by hour of day. The module docstring of "
        "`infer_ctl/forecast/models.py` points here.",
        _forecast_runs),
    Section(
        "tick", "The cost of a control tick",
        "One engine step (forecast + decide) for 1,000 services, refits amortized (`infer_ctl/sim/bench_tick.py`).",
        _tick_runs),
    Section(
        "autoscaling", "Autoscaling: infer-ctl against the peers' autoscalers and the oracle",
        "The Azure code trace, bank_calls x200 and the step profile, each policy simulated over seeds "
        "(`infer_ctl/sim/bench_autoscaling.py`); takes long (bank_calls is 8 months per policy and seed).",
        _autoscaling_runs),
    Section(
        "sim-tick", "The simulator's tick: the same scenarios at 1, 2 and 5 s",
        "The autoscaling section runs the Azure code trace, the step and the fleet at a 5 s tick (bank_calls at "
        "30 s): each tick's arrivals are spread over it, so a burst shorter than a tick is averaged away, and the "
        "oracle sizes for each tick's arrivals. Here the Azure code trace and the step (5 seeds, 120 s cold start, "
        "warm start) and the fleet (one run) at ticks of 1, 2 and 5 s: how much the figures depend on the tick. "
        "The Azure trace and the step count arrivals per second; bank_calls' 5-minute counts (in the fleet) are "
        "spread over the ticks as Poisson arrivals, so at a shorter tick they are burstier too.",
        _sim_tick_runs),
    Section(
        "lent-gpus", "Lent GPUs in a fleet: sleepers on the GPUs of services that yield to them",
        "bench_fleet's 24 services plus 4 steady batch services of 4 one-GPU replicas that lend their GPUs "
        "(`yieldToSleepers`), without and with sleeping pools of 2 for the one-GPU services "
        "(`infer_ctl/sim/bench_fleet.py --lenders`), and with pools of 2 and at most one of each lender's replicas "
        "asleep for others at once (`maxYielded: 1`, `--lender-max-yielded`): the lenders' and the others' "
        "attainment and GPU-hours (a warm host's GPU charged to the services awake on it, else to those whose "
        "sleepers wait there).",
        _lent_gpu_runs),
    Section(
        "warm-pool", "A warm pool in a fleet: whole GPUs held idle for every service's sleepers",
        "bench_fleet's 24 services, each one-GPU service with a sleeping pool of 2, on clusters whose warm pool "
        "(`warmPoolGPUs`) is 0, 8 and 16 GPUs (`infer_ctl/sim/bench_fleet.py --warm-pool`): a sleeper of each service "
        "on each pool host, woken by whichever service's burst comes first; fma-pool (a fixed pool of sleepers per "
        "service, its hosts made for them) beside it; and where the requests beyond the ready replicas' capacity "
        "arrived, by the length of their overload (`--overloads`).",
        _warm_pool_runs),
    Section(
        "memory-shares", "A fleet on memory shares: the sleeping tier where warm hosts are a service's own",
        "bench_fleet's 24 services with the one-GPU ones `Shared`, each replica a 24 GiB memory share of an H100 "
        "(three on a device; `infer_ctl/sim/bench_fleet.py --shared-gib 24`): a device is held from its first share "
        "to its last and charged to the replicas on it by memory, and a Shared service with the sleeping tier makes "
        "warm hosts of its own. Every policy, and infer-ctl with each tier alone (`infer-ctl+sleep`, "
        "`infer-ctl+cache`), to tell what each tier does.",
        _memory_share_runs),
    Section(
        "loadgen", "loadgen's open-loop rate and send lag on one core, per HTTP client",
        "`python -m loadgen.bench --clients`: the benchmark endpoint (`loadgen/benchserver.py`) pinned to one core, "
        "loadgen pinned to the other, each client at each constant rate 3 times, interleaved; medians and "
        "(min-max). Sustained: the median run achieves at least 99 % of the target, without errors, with a send-lag "
        "p99 of at most 10 ms. Which client loadgen uses, and why, is in `loadgen/README.md`.",
        _loadgen_runs),
)
BY_NAME = {s.name: s for s in SECTIONS}

BLOCK = re.compile(r"<!-- benchdoc:begin (?P<name>[\w-]+) -->\n.*?<!-- benchdoc:end (?P=name) -->\n", re.DOTALL)


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return ""
    return done.stdout.rstrip("\n")  # not strip(): the first `status --porcelain` line begins with a space


def commit_line() -> str:
    """The commit the benchmarks ran on, and the files that differed from it (untracked ones too)."""
    head = _git("rev-parse", "HEAD") or "unknown (not a git checkout)"
    changed = [line[3:] for line in _git("status", "--porcelain").splitlines() if line]
    if not changed:
        return f"`{head}` (clean work tree)"
    return f"`{head}` with uncommitted changes to {len(changed)} files: " + ", ".join(
        f"`{p}`" for p in changed)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return "unknown"


def machine_line() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{os.cpu_count()} cores ({usable} usable by this process), {_cpu_model()}, {_memory_gib()} memory, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def display_command(module_args: Sequence[str], python: str = sys.executable) -> str:
    """The command line as run, with the interpreter relative to the working directory when it is inside it."""
    exe = Path(python)
    try:
        shown = str(exe.relative_to(Path.cwd())) if exe.is_absolute() else python
    except ValueError:
        shown = python
    return shlex.join([shown, "-m", *module_args])


def execute(run: Run) -> Outcome:
    argv = [sys.executable, "-m", *run.module_args]
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return Outcome(run, display_command(run.module_args), done.returncode, time.perf_counter() - started,
                   done.stdout, done.stderr)


def _fence(text: str) -> list[str]:
    body = text.rstrip("\n")
    fence = "````" if "```" in body else "```"
    return [fence + "text", body, fence]


def render_outcome(outcome: Outcome) -> list[str]:
    lines = [f"### {outcome.run.label}", "", f"`{outcome.command}`", "",
             f"Exit code {outcome.exit_code}, wall time {outcome.wall_s:.0f} s.", "", *_fence(outcome.stdout)]
    if outcome.exit_code != 0:
        tail = "\n".join(outcome.stderr.splitlines()[-30:])
        lines += ["", "It failed; the end of its standard error:", "", *_fence(tail)]
    return [*lines, ""]


def render_section(section: Section, outcomes: list[Outcome], context: dict[str, str]) -> str:
    lines = [f"<!-- benchdoc:begin {section.name} -->", f"## {section.name}: {section.title}", "", section.about, "",
             f"- generated by: `{context['generator']}`",
             f"- date: {context['started']} to {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
             f"- commit: {context['commit']}",
             f"- machine: {context['machine']}",
             f"- load average (1, 5, 15 min) at the start: {context['load']}; at the end: {_load()}", ""]
    for outcome in outcomes:
        lines += render_outcome(outcome)
    if section.summary is not None and any(o.exit_code == 0 for o in outcomes):
        lines += [*section.summary([o for o in outcomes if o.exit_code == 0]), ""]
    return "\n".join([*lines, f"<!-- benchdoc:end {section.name} -->"]) + "\n"


def stub(section: Section, args: argparse.Namespace) -> str:
    commands = "\n".join(f"    {display_command(r.module_args, '.venv/bin/python')}" for r in section.runs(args))
    return (f"<!-- benchdoc:begin {section.name} -->\n## {section.name}: {section.title}\n\n{section.about}\n\n"
            f"Not generated yet. To generate this section (the others are kept):\n\n"
            f"    .venv/bin/python -m infer_ctl.sim.benchdoc --section {section.name}\n\n"
            f"which runs\n\n{commands}\n"
            f"<!-- benchdoc:end {section.name} -->\n")


HEADER = """# Benchmarks

Generated by `infer_ctl/sim/benchdoc.py`; edit that, not this file. Each section is the verbatim output of the
commands it shows, with the date, the git commit and the machine it ran on; a summary computed from that output
may follow, marked as such. Regenerate one section with
`.venv/bin/python -m infer_ctl.sim.benchdoc --section NAME` (the other sections are kept as they are).

Sections: {toc}.

"""


def compose(existing: str, fresh: dict[str, str], args: argparse.Namespace) -> str:
    """The whole document: the fresh sections, the others as `existing` has them, or their stubs."""
    kept = {m.group("name"): m.group(0) for m in BLOCK.finditer(existing)}
    toc = ", ".join(f"`{s.name}`" for s in SECTIONS)
    parts = [HEADER.format(toc=toc)]
    for section in SECTIONS:
        parts.append(fresh.get(section.name) or kept.get(section.name) or stub(section, args))
    return "\n".join(parts)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--section", action="append", choices=list(BY_NAME), default=[],
                    help="a section to run (repeatable); the others are kept from --out")
    ap.add_argument("--out", type=Path, default=Path("BENCHMARKS.md"))
    ap.add_argument("--openb-dir", default="../shared/data/openb")
    ap.add_argument("--traces-dir", default="../shared/data/traces")
    ap.add_argument("--openb-seeds", default="42-51", help="seeds of the openb section (e.g. 42-51 or 42,43)")
    ap.add_argument("--variant-seeds", default="42-51", help="seeds of the openb-variants section")
    ap.add_argument("--jobs", type=jobs_option, default=1,
                    help="worker processes for the benchmarks that take --jobs (bench_autoscaling and bench_fleet: "
                    "the autoscaling, sim-tick and fleet sections); their figures are the same, their wall times "
                    "shorter on several cores")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing, write nothing")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    generator = display_command(["infer_ctl.sim.benchdoc", *given])
    if args.dry_run:
        for name in args.section:
            for run in BY_NAME[name].runs(args):
                print(display_command(run.module_args))
        return 0
    fresh: dict[str, str] = {}
    failed = False
    for name in dict.fromkeys(args.section):
        section = BY_NAME[name]
        context = {"generator": generator, "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                   "commit": commit_line(), "machine": machine_line(), "load": _load()}
        outcomes = []
        for run in section.runs(args):
            print(f"benchdoc: {name}: {display_command(run.module_args)}", file=sys.stderr, flush=True)
            outcomes.append(execute(run))
            print(f"benchdoc: {name}: exit {outcomes[-1].exit_code}, {outcomes[-1].wall_s:.0f} s", file=sys.stderr,
                  flush=True)
        failed |= any(o.exit_code != 0 for o in outcomes)
        fresh[name] = render_section(section, outcomes, context)
    existing = args.out.read_text() if args.out.exists() else ""
    args.out.write_text(compose(existing, fresh, args))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
