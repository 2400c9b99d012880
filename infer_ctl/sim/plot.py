"""One figure per run: the traffic (with infer-ctl's upper forecast) on top, each policy's replicas below."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from infer_ctl.forecast.series import FloatArray
from infer_ctl.sim.tick import SimResult

_MAX_POINTS = 4000


def _thin(x: FloatArray, y: FloatArray, how: str = "max") -> tuple[FloatArray, FloatArray]:
    """At most _MAX_POINTS points: block maxima (replicas, traffic peaks stay visible) or block means."""
    k = max(1, int(np.ceil(x.size / _MAX_POINTS)))
    if k == 1:
        return x, y
    n = x.size // k * k
    blocks = y[:n].reshape(-1, k)
    with np.errstate(all="ignore"):
        yy = np.nanmax(blocks, axis=1) if how == "max" else np.nanmean(blocks, axis=1)
    return x[:n:k], yy


def plot_results(results: Sequence[SimResult], path: Path, title: str, capacity_rps: float) -> None:
    import matplotlib  # noqa: PLC0415 -- the optional `plot` extra: only `--plot` needs it

    matplotlib.use("Agg")  # no display; before pyplot is imported
    import matplotlib.pyplot as plt  # noqa: PLC0415 -- the optional `plot` extra, after the backend is chosen

    if not results:
        raise ValueError("nothing to plot")
    first = results[0]
    hours = first.times_s / 3600.0
    unit = "h" if hours[-1] > 3 else "min"
    x = hours if unit == "h" else first.times_s / 60.0
    fig, axes = plt.subplots(
        1 + len(results), 1, figsize=(12, 2.0 + 1.6 * len(results)), sharex=True, constrained_layout=True
    )
    ax = axes[0]
    ax.plot(*_thin(x, first.arrivals_rps), lw=0.6, color="0.3", label="arrivals (requests/s)")
    forecast_colors = iter(("tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive"))
    for r in results:
        if np.isfinite(r.forecast_upper_rps).any():
            fc = r.forecast_upper_rps.copy()
            mask = np.isfinite(fc)
            ax.plot(*_thin(x[mask], fc[mask]), lw=0.8, color=next(forecast_colors, "tab:red"),
                    label=f"{r.policy} upper forecast")
    ax.set_ylabel("requests/s")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    need = np.ceil(first.arrivals_rps / capacity_rps)
    for ax, r in zip(axes[1:], results, strict=True):
        ax.plot(*_thin(x, need), lw=0.5, color="0.6", label="needed at the SLO capacity")
        ax.plot(*_thin(x, r.alive), lw=0.8, color="tab:blue", label="replicas (incl. loading)")
        ax.plot(*_thin(x, r.ready), lw=0.8, color="tab:green", label="ready")
        ax.set_ylabel("replicas")
        ax.set_title(
            f"{r.policy}: SLO {r.slo_attainment:.2%}, {r.gpu_hours:.1f} GPU-h, {r.cold_starts} cold starts",
            fontsize=9,
            loc="left",
        )
        ax.legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel(f"time ({unit})")
    fig.savefig(path, dpi=110)
    plt.close(fig)
