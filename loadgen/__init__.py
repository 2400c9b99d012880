"""loadgen: an open-loop HTTP load generator with traffic shapes and trace replay.

It stands alone (it never imports infer_ctl); infer-ctl exposes it as `infer-ctl loadgen`. The command line is
in loadgen.cli; the pieces are importable for tests and for the project's end-to-end tests:
shapes -> schedule (arrival times) -> runner (the open loop, httpx over loadgen.transport) -> stats/hist ->
report (summary, timeline, plot) and metrics (Prometheus).
"""

__version__ = "0.1.0"
