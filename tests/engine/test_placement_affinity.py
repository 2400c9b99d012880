"""The service's node affinity and tolerations reach the placement: it chooses only nodes that meet the required
expressions (which the Pod also carries, ANDed with the chosen node), and nodes whose taints only the service
tolerates."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.core.parse import parse_inference_service
from infer_ctl.engine.placement import replica_request
from infer_ctl.place.inventory import Inventory
from tests.builders import InferenceServiceBuilder
from tests.engine.test_placement import CATALOG, inventory, place

__all__ = ["inventory"]  # the fixture


def small_service(**runtime: Any) -> Any:
    builder = InferenceServiceBuilder("small").with_("spec.model", {"name": "m", "memory": "10Gi"}) \
        .with_("spec.accelerator", {"products": []})
    for key, value in runtime.items():
        builder.with_(f"spec.runtime.{key}", value)
    return parse_inference_service(builder.build())


@pytest.mark.parametrize(("zone", "nodes"), [
    pytest.param("zone-b", {"l4"}, id="zone b holds only the L4 nodes"),
    pytest.param("zone-a", {"h100", "a100"}, id="zone a holds the H100 and A100 nodes"),
])
def test_replicas_land_only_on_nodes_that_meet_the_required_expressions(inventory: Inventory, zone: str,
                                                                        nodes: set[str]) -> None:
    svc = small_service(nodeAffinity={"required": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                                    "values": [zone]}]})
    placed = place(svc, inventory, 3)
    assert all(p.placed for p in placed), [p.why_not for p in placed]
    assert {p.decision.placement.node.split("-")[0] for p in placed} <= nodes


def test_no_node_meets_the_expressions_and_the_reason_says_which(inventory: Inventory) -> None:
    svc = small_service(nodeAffinity={"required": [{"key": "topology.kubernetes.io/zone", "operator": "NotIn",
                                                    "values": ["zone-a", "zone-b"]}]})
    (replica,) = place(svc, inventory)
    assert not replica.placed and "NodeAffinityNotMet" in replica.why_not, replica.why_not
    assert "node labels do not match topology.kubernetes.io/zone NotIn ['zone-a', 'zone-b']" in str(
        replica.decision.status)


def test_the_service_s_tolerations_are_the_placement_s_besides_the_gpu_taint() -> None:
    svc = small_service(tolerations=[{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}])
    request = replica_request(svc, CATALOG, "small-r0")
    assert [(t.key, t.operator) for t in request.pod_tolerations] == [("nvidia.com/gpu", "Exists"),
                                                                      ("dedicated", "Exists")]
