"""`infer-ctl demo`, the README's main job, run as a user runs it (short profile, low rates)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_runs_the_whole_loop_and_leaves_a_summary_and_a_plot(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "infer-ctl"
    result = subprocess.run([str(exe), "demo", "--duration", "40", "--rate-scale", "0.2", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "applied     InferenceService default/chat" in out
    assert "decision" in out and "summary" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["loadgen"]["ok"] > 0.9 * summary["loadgen"]["sent"]
    assert summary["peak_serving"] >= 1
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    # The demo's Prometheus (its data lives in the demo's folder) is gone; the sandbox's own tests check that
    # every model server it starts is stopped.
    leftover = subprocess.run(["pgrep", "-f", f"{tmp_path}/prometheus"], capture_output=True, text=True,
                              check=False)
    assert leftover.stdout.strip() == ""
