"""`infer-ctl demo`: its day (profile, history, loadgen's shape), its live view, its summary and plot, and the
whole run as a user runs it (a short day, low rates)."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from infer_ctl.cli.demo import (
    Recorder,
    Sample,
    explain,
    held_gpus,
    phase_rows,
    plot,
    replica_states,
    scale_capacity,
    without_sleepers,
)
from infer_ctl.cli.demoday import DEFAULT_DAY_S, Day
from infer_ctl.cli.live import LiveView, ServiceView
from loadgen.shapes import parse_shape

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# ----------------------------------------------------------------------------------------------- the day


def test_the_day_s_phases_follow_each_other_from_start_to_end() -> None:
    day = Day.build()
    assert day.phases[0].start_s == 0 and day.phases[-1].end_s == pytest.approx(DEFAULT_DAY_S)
    for a, b in zip(day.phases, day.phases[1:], strict=False):
        assert a.end_s == pytest.approx(b.start_s)
    assert [p.name for p in day.phases if not p.predictable] == ["step up", "step down"]


def test_the_default_day_leaves_room_for_the_pre_warm_and_the_night_s_scale_down() -> None:
    # the replicas for the ramp start a cold start and a period ahead of it: within the early morning, where the
    # summary sees them; the night lasts the stabilization window, so the step up meets the night's replicas
    chat = next(d for d in yaml.safe_load_all((ROOT / "deploy" / "demo" / "chat.yaml").read_text())
                if d and d["metadata"]["name"] == "chat")
    phases = {p.name: p for p in Day.build().phases}
    lead_s = chat["spec"]["runtime"]["coldStartSeconds"] + 10.0  # the control period
    assert phases["early morning"].end_s - phases["early morning"].start_s >= lead_s
    assert phases["night"].end_s - phases["night"].start_s >= chat["spec"]["scaling"]["scaleDownStabilizationSeconds"]


def test_loadgen_s_shape_is_the_day_at_its_rates_and_length() -> None:
    day = Day.build(120.0, 0.3)
    shape = parse_shape(day.shape(), None)
    assert shape.duration_s == pytest.approx(120.0, abs=0.01)
    curve = shape.curve(np.random.default_rng(0))
    for t in (1.0, 30.0, 55.0, 90.0, 110.0):
        assert curve.rate_at(t) == pytest.approx(day.rate_rps(t), rel=0.01), t
    assert day.rate_rps(90.0) == pytest.approx(150.0)  # the step up, at 0.3 x 500


def test_a_late_start_cuts_the_shape_and_the_phases_where_the_run_begins() -> None:
    day = Day.build()
    shape = parse_shape(day.shape(100.0), None)
    assert shape.duration_s == pytest.approx(DEFAULT_DAY_S - 100.0, abs=0.01)
    assert shape.curve(np.random.default_rng(0)).rate_at(0.0) == pytest.approx(day.rate_rps(100.0), rel=1e-3)
    assert day.phase_starts(100.0).startswith("morning ramp=0s,day=60s,")


def test_the_history_is_the_predictable_day_and_knows_nothing_of_the_steps() -> None:
    day = Day.build()
    assert day.rate_rps(120.0, history=True) == day.rate_rps(120.0)  # the morning ramp, as every day
    assert day.rate_rps(285.0) == 500.0 and day.rate_rps(285.0, history=True) == 50.0  # the step up, unannounced
    assert day.rate_rps(330.0) == 2.0 and day.rate_rps(330.0, history=True) == 50.0


def test_the_backfilled_counter_grows_at_the_history_s_rate_until_now() -> None:
    day = Day.build()
    day0, now = 1_000_000.0, 1_000_000.0 - 85.0
    text = day.history_openmetrics(day0, now, 'service="chat"', np.random.default_rng(1), days=3,
                                   metric="vllm:request_success_total")
    lines = text.splitlines()
    assert lines[0] == "# TYPE vllm:request_success counter" and lines[-1] == "# EOF"
    samples = [(float(ts), float(v)) for _, v, ts in (line.split() for line in lines[1:-1])]
    assert samples[0][0] == day0 - 3 * DEFAULT_DAY_S and samples[-1][0] <= now
    counts = np.array([v for _, v in samples])
    assert np.all(np.diff(counts) >= 0)
    # the day before's morning ramp: its mean rate within the day-to-day spread (4 %) and Poisson noise
    ramp = day.phases[1]
    start = day0 - DEFAULT_DAY_S + ramp.start_s
    window = [(t, v) for t, v in samples if start <= t <= start + ramp.end_s - ramp.start_s]
    rate = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
    expected = np.mean([day.rate_rps(ramp.start_s + x, history=True)
                        for x in np.arange(0.0, ramp.end_s - ramp.start_s, 0.5)])
    assert rate == pytest.approx(expected, rel=0.15)


def test_a_lighter_run_scales_each_replica_s_capacity_at_the_same_latency() -> None:
    service = {"metadata": {"annotations": {"sandbox.infer-ctl.io/service-time-ms": "100",
                                            "sandbox.infer-ctl.io/concurrency": "8"}},
               "spec": {"scaling": {"targetRequestsPerReplica": 40}}}
    scale_capacity(service, 0.3)
    annotations = service["metadata"]["annotations"]
    slots, ms = int(annotations["sandbox.infer-ctl.io/concurrency"]), float(
        annotations["sandbox.infer-ctl.io/service-time-ms"])
    assert (slots, ms) == (3, 125.0)  # 24 req/s saturate it: 0.3 x 80
    assert slots / ms * 1000 == pytest.approx(0.3 * 80)
    assert service["spec"]["scaling"]["targetRequestsPerReplica"] == pytest.approx(12.0)


def test_without_sleepers_the_demo_s_services_keep_no_pool_and_lend_no_gpu() -> None:
    services = [d for d in yaml.safe_load_all((ROOT / "deploy/demo/chat.yaml").read_text()) if d]
    prewarm = {s["metadata"]["name"]: s["spec"]["scaling"].get("prewarm") for s in services}
    assert prewarm["chat"] == {"sleepingReplicas": 6} and prewarm["summarize"] == {"yieldToSleepers": True}
    for svc in services:
        without_sleepers(svc)
    assert all("prewarm" not in s["spec"]["scaling"] for s in services)
    kept = {"spec": {"scaling": {"prewarm": {"sleepingReplicas": 2, "nodeCache": True}}}}
    without_sleepers(kept)
    assert kept["spec"]["scaling"]["prewarm"] == {"nodeCache": True}  # the other tiers as written


# ----------------------------------------------------------------------------------------------- the live view


def view(serving: int, reason: str = "Steady", rate: float = 50.0, loading: int = 0) -> ServiceView:
    message = "upper q0.99 forecast 97.0 rps within 70 s (seasonal-naive-daily), a message longer than seventy chars"
    return ServiceView("chat", rate, 97.0, "upper q0.99 within 70 s, seasonal-naive-daily", serving, 1,
                       {"Serving": serving, "Standby": 1, "Loading": loading}, reason, message)


def test_off_a_terminal_a_line_is_printed_per_change_not_per_poll() -> None:
    out = io.StringIO()
    live = LiveView(out, tty=False)
    live.update(0.0, "early morning", "", [view(3)])
    live.update(1.0, "early morning", "", [view(3, rate=51.0)])  # the rate alone moved
    live.update(2.0, "early morning", "", [view(3)])
    live.update(3.0, "morning ramp", "", [view(3, loading=1, reason="Forecast")])
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # the header, the first state, the change
    assert "serving 3 standby 1 loading 1" in lines[2] and "Forecast: upper q0.99" in lines[2]
    assert "a message longer than seventy chars" in lines[2]  # the whole reason
    assert "\x1b[" not in out.getvalue()


def test_on_a_terminal_the_view_is_redrawn_in_place_with_changes_highlighted() -> None:
    out = io.StringIO()
    live = LiveView(out, tty=True, width=80)
    live.update(0.0, "early morning", "as every day", [view(3)])
    first = out.getvalue()
    frame_lines = first.count("\n")
    live.update(1.0, "early morning", "as every day", [view(4, loading=1)])
    second = out.getvalue()[len(first):]
    assert second.startswith(f"\x1b[{frame_lines}F\x1b[J")  # back to the frame's first row, cleared below
    assert "\x1b[1;33m  4\x1b[0m" in second and "\x1b[1;33m  1\x1b[0m" in second  # serving and loading changed
    assert "\x1b[1;33m  1\x1b[0m  #" in second
    plain = ANSI.sub("", second)
    assert "a message longer than" in plain and "seventy chars" in plain  # wrapped, not cut
    assert all(len(line) < 80 for line in plain.splitlines())
    live.update(9.0, "early morning", "as every day", [view(4, loading=1)])
    assert "\x1b[1;33m" not in out.getvalue()[len(first) + len(second):]  # nothing changed for 8 s


# ----------------------------------------------------------------------------------------------- the summary


def recorded(day: Day, first_added_s: float) -> Recorder:
    """A run's polls: 3 + 1 replicas, one more loading from `first_added_s` (ready 12 s later)."""
    rec = Recorder()
    for t in np.arange(0.0, day.day_s, 1.0):
        loading = 1 if first_added_s <= t < first_added_s + 12 else 0
        serving = 4 if t >= first_added_s + 12 else 3
        rec.samples.append(Sample(float(t), day.rate_rps(t), 120.0, serving, 1,
                                  {"Serving": serving, "Standby": 1, "Loading": loading}, "Forecast"))
    return rec


def test_the_summary_says_whether_replicas_started_ahead_of_the_ramp() -> None:
    day = Day.build()
    rows = phase_rows(day, recorded(day, 40.0), [], 250.0)
    [ramp] = [line for line in explain(day, recorded(day, 40.0), rows) if line.startswith("morning ramp")]
    assert "started at 40 s, 30 s before it began" in ramp and "5 were ready and 0 loading" in ramp
    [late] = [line for line in explain(day, recorded(day, 120.0), rows) if line.startswith("morning ramp")]
    assert "50 s after it began (no pre-warm)" in late


def test_phase_rows_judge_each_phase_s_p95_against_the_slo() -> None:
    day = Day.build()
    loadgen_phases = [{"name": p.name, "ok": 10, "errors": 0, "p50_ms": 100.0,
                       "p95_ms": 9000.0 if p.name == "step up" else 120.0} for p in day.phases]
    rows = {r["name"]: r for r in phase_rows(day, recorded(day, 40.0), loadgen_phases, 250.0)}
    assert rows["morning ramp"]["slo"] == "met" and rows["step up"]["slo"] == "MISSED"
    assert rows["step up"]["p95"] == "9.0 s" and rows["morning ramp"]["serving"] == "4"  # ready before it


def test_the_plot_is_drawn_from_the_recorder_and_loadgen_s_timeline(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    day = Day.build(120.0, 0.3)
    timeline = tmp_path / "timeline.csv"
    header = "t_s,target,scheduled,sent,ok,errors,p50_ms,p99_ms,send_lag_p99_ms,in_flight,p95_ms,answered,failed"
    rows = [f"{t},{day.rate_rps(t):.1f},15,15,15,0,100,120,1,2,110,15,0" for t in range(120)]
    timeline.write_text("\n".join([header, *rows]) + "\n")
    path = tmp_path / "demo.png"
    plot(day, recorded(day, 10.0), timeline, path, start_s=0.1, slo_ms=250.0)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000


def _pod(name: str, *, claim: str, ready: bool = True, standby: bool = False, asleep: bool = False,
         service: str = "chat") -> dict[str, object]:
    return {"metadata": {"name": name, "labels": {"infer-ctl.io/service": service, "infer-ctl.io/replica": name,
                                                   "infer-ctl.io/role": "standby" if standby else "serving"},
                         "annotations": {"infer-ctl.io/asleep": "true"} if asleep else {}},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_sleepers_are_counted_as_sleeping_and_a_warm_host_s_gpu_once() -> None:
    pods = [_pod("chat-r0", claim="chat-r0-gpu"),
            _pod("chat-r1", claim="warm-h100-0-gpu-1"),  # awake on a warm host
            _pod("chat-r2", claim="warm-h100-0-gpu-1", standby=True, asleep=True),
            _pod("chat-r3", claim="warm-h100-0-gpu-1", standby=True, ready=False),  # a sleeper still loading
            _pod("other-r0", claim="other-r0-gpu", service="other")]
    assert replica_states(pods[:4]) == ["Serving", "Serving", "Sleeping", "Loading"]
    assert held_gpus(pods, "chat") == 2
    assert held_gpus(pods, "other") == 1
    # a sleeper waiting on a GPU another service serves on (lent: yieldToSleepers) holds none of it; one on a warm
    # host nobody is awake on holds that GPU
    lent = [_pod("summarize-r0", claim="warm-h100-0-gpu-2", service="summarize"),
            _pod("chat-r4", claim="warm-h100-0-gpu-2", standby=True, asleep=True),
            _pod("chat-r5", claim="warm-h100-0-gpu-3", standby=True, asleep=True)]
    assert held_gpus([*pods, *lent], "chat") == 3
    assert held_gpus([*pods, *lent], "summarize") == 1
    # a burst woke chat's sleeper on summarize's GPU and summarize's replica there sleeps: the GPU is chat's while
    # chat is awake on it (the simulator charges it so too: `warm_host_charge`)
    woken = [_pod("summarize-r0", claim="warm-h100-0-gpu-2", service="summarize", standby=True, asleep=True),
             _pod("chat-r4", claim="warm-h100-0-gpu-2")]
    assert held_gpus([*pods, *woken], "chat") == 3
    assert held_gpus([*pods, *woken], "summarize") == 0
    # a warm host nobody is awake on, with sleepers of two services: held for both, half each
    idle = [_pod("chat-r4", claim="warm-h100-0-gpu-4", standby=True, asleep=True),
            _pod("summarize-r1", claim="warm-h100-0-gpu-4", service="summarize", standby=True, asleep=True)]
    assert held_gpus([*pods, *idle], "chat") == 2.5
    assert held_gpus([*pods, *idle], "summarize") == 0.5


# ----------------------------------------------------------------------------------------------- the whole run


@pytest.mark.slow
def test_the_demo_runs_the_whole_loop_and_leaves_a_summary_per_phase_and_a_plot(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "infer-ctl"
    result = subprocess.run([str(exe), "demo", "--duration", "40", "--rate-scale", "0.2", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=420, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "applied     InferenceService default/chat" in out
    assert "days before today backfilled" in out or "NO PROMETHEUS" in out
    assert "summary of chat" in out and "morning ramp" in out and "step up" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["loadgen"]["ok"] > 0.9 * summary["loadgen"]["sent"]
    assert [p["name"] for p in summary["phases"]] == [p.name for p in Day.build().phases]
    assert summary["peak_serving"] >= 1 and not math.isnan(summary["gpu_hours"])
    # the background service that lends its GPUs to chat's sleepers: driven all day by a second loadgen
    assert "summary of summarize" in out
    assert summary["background"]["loadgen"]["sent"] > 0
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert (tmp_path / "controller.log").stat().st_size > 0
    assert (tmp_path / "controller-timeline.csv").read_text().startswith("t_s,observed_rps,forecast_upper_rps")
    # The demo's Prometheus (its data lives in the demo's folder) is gone; the sandbox's own tests check that
    # every model server it starts is stopped.
    leftover = subprocess.run(["pgrep", "-f", f"{tmp_path}/prometheus"], capture_output=True, text=True,
                              check=False)
    assert leftover.stdout.strip() == ""
