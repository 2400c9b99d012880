"""What one service's cycles carry from one to the next (`ServiceMemory`): the pure cycle's state, and the
shell's own (readings' cursors, outages reported, refusals remembered, back-offs)."""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_ctl.core import api
from infer_ctl.core.slo import SloWindow
from infer_ctl.engine.burst import BurstBasis
from infer_ctl.engine.cycle import CycleState
from infer_ctl.kube.client import Resource
from infer_ctl.observe.rates import ScrapeRates


@dataclass(frozen=True, slots=True)
class ServiceBurstBasis:
    """What a check between two cycles needs of the last one: the service as it saw it, and what the checks
    compare the requests in flight with (`infer_ctl.engine.burst`)."""

    svc: api.InferenceService
    uid: str
    basis: BurstBasis


@dataclass
class ServiceMemory:
    """What one service's cycles carry from one to the next: the pure cycle's state, and the shell's own."""

    state: CycleState = field(default_factory=CycleState)
    last_sample_s: float | None = None
    # the engine's counter and gauges are set before each read, from the service's runtime profile
    scrape: ScrapeRates = field(default_factory=lambda: ScrapeRates(metric=""))
    invalid_message: str = ""
    routing_port: int | None = None  # the port of the routing Service this controller made or checked
    pool_made: object = None  # what its InferencePool was last made, checked or found taken for (`routing.pool_key`)
    routing_checked_s: float | None = None  # when both were last written or checked (`routing.ROUTING_RECHECK_S`)
    cycles: int = 0
    failure: str = ""  # what the last failed cycle failed on ("" after a cycle that succeeded)
    rate_outage: str = ""  # why the last cycle could not read the rate ("" when it could)
    concurrency_outage: str = ""  # the same for the requests in flight
    # replica name -> (resource, object name) of an object of somebody else's that holds that name
    foreign: dict[str, tuple[Resource, str]] = field(default_factory=dict)
    failures: int = 0  # failed cycles in a row: the retry's backoff
    # the sleeping tier: sleepers whose wake was refused (why, until when not to try again), the wakes' seconds
    # since the last cycle, and the sleepers whose model server answered a sleep (asleep for sure)
    wake_refused: dict[str, tuple[str, float]] = field(default_factory=dict)
    wakes: list[float] = field(default_factory=list)
    asleep: set[str] = field(default_factory=set)
    # the cached tier: node -> (prefetches failed on it in a row, when to try it again): a node whose copy failed
    # is not asked again at once (a model too big for its cache would fail every cycle), the plan looks elsewhere
    prefetch_failed: dict[str, tuple[int, float]] = field(default_factory=dict)
    # measured attainment from a direct scrape: each cycle's (within, total) over the trailing window, and since
    # when (through Prometheus, one reading covers the window)
    slo: SloWindow = field(default_factory=SloWindow)
    slo_since_s: float | None = None
    # the same for each token objective (timeToFirstToken, interTokenLatency): its window and since when
    token_slo: dict[str, tuple[SloWindow, float | None]] = field(default_factory=dict)
    burst: ServiceBurstBasis | None = None  # None: no check between cycles (no latency objective, paused, not read)
