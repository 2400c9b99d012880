"""The end of a run: the summary (a dict, as text or JSON), the per-second timeline (CSV or JSON), a plot."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from loadgen.runner import RunOutcome
from loadgen.stats import PhaseStats, TimelineRow

SUMMARY_KEYS = (
    "target_rps",
    "achieved_rps",
    "sent",
    "ok",
    "errors",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "max_send_lag_ms_p99",
)


def _ms(us: int) -> float:
    return round(us / 1000.0, 3)


def summarize(
    outcome: RunOutcome,
    *,
    expected_requests: float,
    schedule_duration_s: float,
    in_flight_cap: int | None,
    context: dict[str, Any],
) -> dict[str, Any]:
    """The run's summary. The first keys are the stable interface (SUMMARY_KEYS); the rest add detail.

    target_rps: expected requests of the shape / its duration (for a trace: its requests / its span).
    achieved_rps: requests sent / the send window, which is the schedule's duration, or longer when the last
    request went out late. max_send_lag_ms_p99: the worst per-second p99 of send lag (the run-wide p99 is
    send_lag_ms_p99). Latency percentiles are over successful responses, measured from the scheduled time.
    """
    s = outcome.stats
    window_s = max(schedule_duration_s, outcome.last_start_s)
    if outcome.interrupted:
        window_s = max(outcome.last_start_s, 1e-9)
    p50, p95, p99, p999 = s.latency_us.quantiles((0.5, 0.95, 0.99, 0.999))
    lag50, lag99 = s.send_lag_us.quantiles((0.5, 0.99))
    summary: dict[str, Any] = {
        "target_rps": round(expected_requests / schedule_duration_s, 3) if schedule_duration_s > 0 else 0.0,
        "achieved_rps": round(s.sent / window_s, 3) if window_s > 0 else float(s.sent),
        "sent": s.sent,
        "ok": s.ok,
        "errors": s.errors,
        "p50_ms": _ms(p50),
        "p95_ms": _ms(p95),
        "p99_ms": _ms(p99),
        "max_send_lag_ms_p99": _ms(s.max_row_lag_p99_us),
        "p999_ms": _ms(p999),
        "max_ms": _ms(s.latency_us.max_value),
        "send_lag_ms_p50": _ms(lag50),
        "send_lag_ms_p99": _ms(lag99),
        "send_lag_ms_max": _ms(s.send_lag_us.max_value),
        "scheduled": s.scheduled,
        "written": s.written,
        "expected_requests": round(expected_requests, 3),
        "duration_s": round(schedule_duration_s, 3),
        "send_window_s": round(window_s, 3),
        "elapsed_s": round(outcome.ended_s, 3),
        # t = 0 of the timeline on the machine's monotonic clock (CLOCK_MONOTONIC, shared by every process on
        # the machine), so that another process's record can be aligned with it.
        "started_monotonic_s": round(outcome.started_at_s, 6),
        "errors_by_kind": dict(sorted(s.errors_by_kind.items())),
        "error_examples": dict(sorted(s.error_examples.items())),
        "statuses": {str(k): v for k, v in sorted(s.statuses.items())},
        "in_flight_peak": s.in_flight_peak,
        "in_flight_cap": in_flight_cap,
        "in_flight_cap_waited": s.cap_waited,
        "cancelled_at_end": outcome.cancelled_at_end,
        "interrupted": outcome.interrupted,
        "latency_relative_error": s.latency_us.relative_error,
    }
    if s.phases:
        summary["phases"] = [_phase_summary(p) for p in s.phases]
    summary.update(context)
    return summary


def _phase_summary(p: PhaseStats) -> dict[str, Any]:
    """One phase: its scheduled window, counts, errors by kind and the latency of its successes."""
    p50, p95, p99 = p.latency_us.quantiles((0.5, 0.95, 0.99))
    return {
        "name": p.name,
        "start_s": round(p.start_s, 3),
        "end_s": None if p.end_s == float("inf") else round(p.end_s, 3),
        "scheduled": p.scheduled,
        "ok": p.ok,
        "errors": p.errors,
        "errors_by_kind": dict(sorted(p.errors_by_kind.items())),
        "p50_ms": _ms(p50),
        "p95_ms": _ms(p95),
        "p99_ms": _ms(p99),
        "max_ms": _ms(p.latency_us.max_value),
    }


def _fmt_ms(v: float) -> str:
    return f"{v:.3g} ms" if v < 1000 else f"{v / 1000:.3g} s"


def render_text(summary: dict[str, Any]) -> str:
    s = summary
    lines = [
        f"loadgen: {s.get('method', '?')} {s.get('url', '?')}  shape {s.get('shape', '?')}  "
        f"arrivals {s.get('arrivals', '?')}  seed {s.get('seed', '?')}",
        f"  requests   scheduled {s['scheduled']}  sent {s['sent']}  ok {s['ok']}  errors {s['errors']}",
        f"  rate       target {s['target_rps']:.6g}/s  achieved {s['achieved_rps']:.6g}/s"
        f"  over {s['send_window_s']:.6g} s (finished after {s['elapsed_s']:.6g} s)",
    ]
    if s["ok"]:
        lines.append(
            f"  latency    p50 {_fmt_ms(s['p50_ms'])}  p95 {_fmt_ms(s['p95_ms'])}  p99 {_fmt_ms(s['p99_ms'])}"
            f"  p99.9 {_fmt_ms(s['p999_ms'])}  max {_fmt_ms(s['max_ms'])}"
            f"  (successes, from scheduled time, ±{s['latency_relative_error'] * 100:.2g} %)"
        )
    if s["written"]:
        lines.append(
            f"  send lag   p50 {_fmt_ms(s['send_lag_ms_p50'])}  p99 {_fmt_ms(s['send_lag_ms_p99'])}"
            f"  max {_fmt_ms(s['send_lag_ms_max'])}  worst second's p99 {_fmt_ms(s['max_send_lag_ms_p99'])}"
        )
    else:
        lines.append("  send lag   none measured: no request reached a connection")
    cap = s["in_flight_cap"]
    cap_text = ""
    if cap is not None:
        cap_text = f"  cap {cap}: " + (
            f"BOUND, {s['in_flight_cap_waited']} requests waited for it (their wait counts as latency)"
            if s["in_flight_cap_waited"]
            else "never reached"
        )
    lines.append(f"  in flight  peak {s['in_flight_peak']}{cap_text}")
    for kind, n in s["errors_by_kind"].items():
        example = s["error_examples"].get(kind)
        lines.append(f"  errors     {kind}: {n}" + (f"  e.g. {example}" if example else ""))
    for p in s.get("phases", ()):
        end = f"{p['end_s']:g}" if p["end_s"] is not None else "end"
        errors = ", ".join(f"{k} {n}" for k, n in p["errors_by_kind"].items())
        latency = f"p50 {_fmt_ms(p['p50_ms'])}  p95 {_fmt_ms(p['p95_ms'])}" if p["ok"] else "no successes"
        lines.append(f"  phase      {p['name']} ({p['start_s']:g}-{end} s): scheduled {p['scheduled']}  ok {p['ok']}"
                     f"  {latency}" + (f"  errors {errors}" if errors else ""))
    if s["cancelled_at_end"]:
        lines.append(f"  note       {s['cancelled_at_end']} requests still pending at the end were cancelled")
    if s["interrupted"]:
        lines.append("  note       interrupted: the schedule was stopped early")
    return "\n".join(lines)


def render_unreachable(summary: dict[str, Any]) -> str:
    """For a run in which no request got any HTTP response: what was tried and what happened."""
    s = summary
    kinds = ", ".join(f"{k} {n}" for k, n in s["errors_by_kind"].items()) or "none"
    lines = [
        f"loadgen: no response from {s.get('url', '?')}: tried {s['sent']} requests over "
        f"{s['send_window_s']:.3g} s ({s.get('method', '?')}, shape {s.get('shape', '?')}); errors: {kinds}",
    ]
    for kind, example in s["error_examples"].items():
        lines.append(f"  {kind}: e.g. {example}")
    if "connect_refused" in s["errors_by_kind"]:
        lines.append("  Is the server running, and listening on that host and port?")
    return "\n".join(lines)


def write_timeline(rows: list[TimelineRow], path: str | Path) -> None:
    """CSV, or JSON (a list of objects) when the file name ends in .json."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        p.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
        return
    names = [f.name for f in fields(TimelineRow)]
    with p.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(names)
        for r in rows:
            writer.writerow([getattr(r, n) for n in names])


def plot_timeline(rows: list[TimelineRow], path: str | Path, title: str) -> None:
    """A PNG: request rate (target, sent, answered and failed by the second they completed) above latency (p50,
    p95, p99 of the requests due in each second, and send-lag p99)."""
    import matplotlib  # noqa: PLC0415 -- the optional `plot` extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 -- the optional `plot` extra, after the backend

    t = [r.t_s for r in rows]
    fig, (ax_rate, ax_lat) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, constrained_layout=True)
    ax_rate.step(t, [r.target for r in rows], where="post", label="target", color="0.55", linewidth=1.2)
    ax_rate.plot(t, [r.sent for r in rows], label="sent", color="tab:blue", linewidth=1.0)
    ax_rate.plot(t, [r.answered for r in rows], label="answered (by completion)", color="tab:green", linewidth=1.0,
                 linestyle="--")
    if any(r.failed for r in rows):
        ax_rate.plot(t, [r.failed for r in rows], label="failed (by completion)", color="tab:red", linewidth=1.0)
    ax_rate.set_ylabel("requests / s")
    ax_rate.legend(loc="upper left", ncols=4, fontsize="small")
    ax_rate.grid(alpha=0.3)
    ax_rate.set_title(title, fontsize="medium")
    ax_lat.plot(t, [r.p50_ms for r in rows], label="latency p50", color="tab:blue", linewidth=1.0)
    ax_lat.plot(t, [r.p95_ms for r in rows], label="latency p95", color="tab:olive", linewidth=1.0)
    ax_lat.plot(t, [r.p99_ms for r in rows], label="latency p99", color="tab:orange", linewidth=1.0)
    ax_lat.plot(t, [r.send_lag_p99_ms for r in rows], label="send lag p99", color="tab:purple", linewidth=0.8)
    ax_lat.set_ylabel("ms (by scheduled second)")
    ax_lat.set_xlabel("seconds since start")
    if any(r.p99_ms > 0 for r in rows):
        ax_lat.set_yscale("log")
    ax_lat.legend(loc="upper left", ncols=4, fontsize="small")
    ax_lat.grid(alpha=0.3, which="both")
    fig.savefig(path, dpi=110)
    plt.close(fig)
