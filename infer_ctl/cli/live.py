"""The demo's live view of what the controller sees and decides, per InferenceService.

On a terminal, one block per service is redrawn in place: the request rate the controller observed, its
forecast, the replicas wanted, one row per replica state (from the Pods themselves, so a replica is seen
loading between two control cycles), and the decision's whole reason, wrapped to the terminal's width. A value
that changed within the last `HIGHLIGHT_S` is shown in bold yellow. ANSI escapes by hand: moving the cursor up
(`ESC [ n F`), clearing to the end of the screen (`ESC [ J`), bold and colour (`ESC [ 1;33 m`).

Elsewhere (a pipe, a file, CI) a line is printed per change of a service's replicas, wanted replicas or decision
reason (not per poll): rate, forecast and the decision's message are printed with it, but their changes alone
print nothing.
"""

from __future__ import annotations

import math
import shutil
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TextIO

HIGHLIGHT_S = 4.0
STATE_ORDER = ("Serving", "Standby", "Sleeping", "Loading", "Pending", "Draining", "Unavailable")
_BOLD_YELLOW, _DIM, _RESET = "\x1b[1;33m", "\x1b[2m", "\x1b[0m"


@dataclass(frozen=True, slots=True)
class ServiceView:
    """One service at one instant: the controller's status and its Pods' states."""

    name: str
    observed_rps: float  # NaN: the controller has no rate
    forecast_rps: float  # the upper quantile (NaN: no forecast)
    forecast_note: str  # method, quantile and horizon, e.g. "q0.99 within 70 s, holt-winters-daily"
    desired_serving: int
    desired_standby: int
    replicas: Mapping[str, int]  # Pods by state (Serving, Standby, Loading, ...)
    reason: str
    message: str

    def values(self) -> dict[str, str]:
        """What is shown, by key: the change detection and the highlighting work on these strings."""
        out = {
            "rate": _rps(self.observed_rps),
            "forecast": _rps(self.forecast_rps),
            "forecast_note": self.forecast_note,
            "desired": f"{self.desired_serving} serving + {self.desired_standby} standby",
            "reason": self.reason,
            "decision": f"{self.reason}: {self.message}" if self.message else self.reason,
        }
        for state in _states(self.replicas):
            out[f"state:{state}"] = str(self.replicas.get(state, 0))
        return out


def _rps(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}/s"


def _states(replicas: Mapping[str, int]) -> list[str]:
    """The states to show: serving, standby and loading always; the others while a replica is in them."""
    known = [s for s in STATE_ORDER if s in ("Serving", "Standby", "Loading") or replicas.get(s, 0)]
    return known + sorted(s for s in replicas if s not in STATE_ORDER and replicas[s])


@dataclass
class LiveView:
    """`update` with the services' views now; `close` at the end. `tty` None: whether `stream` is a terminal."""

    stream: TextIO
    tty: bool | None = None
    width: int | None = None
    _lines: int = 0
    _last: dict[str, dict[str, str]] = field(default_factory=dict)
    _changed_at: dict[tuple[str, str], float] = field(default_factory=dict)
    _header_done: bool = False

    def __post_init__(self) -> None:
        if self.tty is None:
            self.tty = self.stream.isatty()

    def update(self, t_s: float, phase: str, note: str, services: Sequence[ServiceView]) -> None:
        """The services now, `t_s` into the run, in `phase` (`note` says more, on a terminal)."""
        for svc in services:
            values = svc.values()
            before = self._last.get(svc.name)
            for key, value in values.items():
                if before is not None and before.get(key) != value:
                    self._changed_at[(svc.name, key)] = t_s
            if not self.tty and (before is None or _counts_changed(before, values)):
                self._plain_line(t_s, phase, svc, values)
            self._last[svc.name] = values
        if self.tty:
            self._redraw(t_s, f"{phase} ({note})" if note else phase, services)

    def close(self) -> None:
        self._lines = 0  # the last frame stays on the screen
        self.stream.flush()

    # ------------------------------------------------------------------------------------------ plain lines

    def _plain_line(self, t_s: float, phase: str, svc: ServiceView, values: Mapping[str, str]) -> None:
        if not self._header_done:
            self.stream.write(f"{'time':>5}  {'service':<9} {'phase':<14} {'rate':>6} {'forecast':>8}  "
                              f"{'replicas (pods)':<34} {'wanted':<7} decision\n")
            self._header_done = True
        states = " ".join(f"{s.lower()} {values[f'state:{s}']}" for s in _states(svc.replicas))
        wanted = f"{svc.desired_serving}+{svc.desired_standby}"
        self.stream.write(f"{t_s:5.0f}  {svc.name:<9} {phase:<14} {values['rate']:>6} {values['forecast']:>8}  "
                          f"{states:<34} {wanted:<7} {values['decision']}\n")
        self.stream.flush()

    # ------------------------------------------------------------------------------------------ terminal

    def _redraw(self, t_s: float, heading: str, services: Sequence[ServiceView]) -> None:
        width = self.width or shutil.get_terminal_size((120, 40)).columns
        frame = [f"{_DIM}t = {t_s:4.0f} s{_RESET}   {heading[: max(10, width - 14)]}"]
        for svc in services:
            frame.extend(self._block(t_s, svc, width))
        out = []
        if self._lines:
            out.append(f"\x1b[{self._lines}F\x1b[J")  # back to the frame's first line, clear below
        out.append("\n".join(frame) + "\n")
        self.stream.write("".join(out))
        self.stream.flush()
        self._lines = len(frame)

    def _block(self, t_s: float, svc: ServiceView, width: int) -> list[str]:
        """The service's rows; none longer than `width` (a wrapped row would throw the redraw's line count)."""
        v = self._last[svc.name]

        def hl(key: str, pad: int = 0) -> str:
            shown = v[key].rjust(pad)  # padded before the escapes, which take no room on the screen
            changed = self._changed_at.get((svc.name, key))
            return f"{_BOLD_YELLOW}{shown}{_RESET}" if changed is not None and t_s - changed <= HIGHLIGHT_S else shown

        lines = [f"{svc.name:<11} rate {hl('rate', 6)}   forecast {hl('forecast', 6)}   wanted {hl('desired')}"]
        if v["forecast_note"]:
            lines.append(f"  {'forecast':<11} {v['forecast_note'][: max(10, width - 14)]}")
        for state in _states(svc.replicas):
            n = svc.replicas.get(state, 0)
            lines.append(f"  {state.lower():<11} {hl(f'state:{state}', 3)}  {'#' * min(n, max(0, width - 20))}")
        indent = "  decision    "
        wrapped = textwrap.wrap(v["decision"], width=max(20, width - len(indent) - 1)) or [""]
        changed = self._changed_at.get((svc.name, "decision"))
        fresh = changed is not None and t_s - changed <= HIGHLIGHT_S
        for i, part in enumerate(wrapped):
            text = f"{_BOLD_YELLOW}{part}{_RESET}" if fresh else part
            lines.append((indent if i == 0 else " " * len(indent)) + text)
        return lines


def _counts_changed(before: Mapping[str, str], after: Mapping[str, str]) -> bool:
    """A change worth a plain line: replicas by state, the wanted replicas, or the decision's reason (not its
    message alone, whose figures move every cycle)."""
    keys = {k for k in (*before, *after) if k.startswith("state:")} | {"desired", "reason"}
    return any(before.get(k, "0") != after.get(k, "0") for k in keys)
