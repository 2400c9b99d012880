"""The check between two control cycles (`infer_ctl.engine.burst`), the one definition the controller's
burst-check timer and the simulators use: which services a cycle leaves a basis for, and which readings call
for a cycle now."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.config.policies import load_policies
from infer_ctl.core import api
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.engine.burst import BurstBasis, burst_basis, burst_due
from infer_ctl.engine.cycle import CyclePolicies
from tests.builders import InferenceServiceBuilder

ROOT = Path(__file__).resolve().parents[2]
POLICIES = load_policies(ROOT / "policies")


def spec(**fields: Any) -> api.InferenceServiceSpec:
    builder = (InferenceServiceBuilder("chat").with_("spec.scaling.targetRequestsPerReplica", 40)
               .with_("spec.scaling.maxReplicas", 14).with_("spec.slo", {"latencyP95Ms": 250}))
    for path, value in fields.items():
        builder.with_(path.replace("__", "."), value)
    return parse_inference_service(builder.build()).spec


def policies(source: str = "prometheus", **scaling: Any) -> CyclePolicies:
    return CyclePolicies(replace(POLICIES, scaling=replace(POLICIES.scaling, **scaling)), metric_source=source)


def test_a_cycle_leaves_the_checks_its_view_at_the_slo_concurrency() -> None:
    assert POLICIES.scaling.burst_check_s > 0 and POLICIES.scaling.concurrency_query is None  # the engine's query
    # 40 req/s per replica within a p95 of 250 ms: 10 in flight each (Little's law)
    assert burst_basis(spec(), policies(), wanted=3, in_flight=12.0) == BurstBasis(10.0, 3, 12.0, 14)


@pytest.mark.parametrize(("why", "the_spec", "the_policies"), [
    ("no check configured", spec(), policies(burst_check_s=0.0)),
    ("no latency objective", spec(spec__slo=InferenceServiceBuilder.DELETE), policies()),
    ("paused at a fixed count", spec(spec__replicas=2), policies()),
    ("through Prometheus without a query of the requests in flight", spec(), policies(concurrency_query="")),
])
def test_no_basis_where_the_checks_would_read_nothing(why: str, the_spec: api.InferenceServiceSpec,
                                                      the_policies: CyclePolicies) -> None:
    assert burst_basis(the_spec, the_policies, wanted=3, in_flight=12.0) is None, why


def test_a_direct_scrape_needs_no_query() -> None:
    assert burst_basis(spec(), policies("scrape", concurrency_query=""), wanted=3, in_flight=12.0) is not None


def test_a_queue_beyond_the_wanted_replicas_and_grown_since_the_cycle_calls_for_one() -> None:
    basis = BurstBasis(target=10.0, wanted=3, in_flight=12.0, max_replicas=14)
    assert burst_due(basis, in_flight=31.0, serving=3).startswith("31 requests in flight, beyond the 30 that 3")
    assert burst_due(basis, in_flight=30.0, serving=3) == ""  # what 3 replicas hold at the SLO: no queue
    assert burst_due(basis, in_flight=45.0, serving=5) == ""  # 5 serving now (the cycle wanted 3) hold 50
    assert burst_due(replace(basis, in_flight=60.0), in_flight=45.0, serving=3) == ""  # shrinking since
    assert burst_due(replace(basis, wanted=14), in_flight=500.0, serving=3) == ""  # nothing more to start
    assert burst_due(basis, in_flight=math.nan, serving=3) == ""  # not read
    assert burst_due(None, in_flight=500.0, serving=3) == ""  # no basis: no check
