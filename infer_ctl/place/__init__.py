"""Placement over DRA devices (pure): inventory, CEL selectors, filter and score plugins, claims.

- `inventory.Inventory.build(...)`: Nodes, ResourceSlices, DeviceClasses, ResourceClaims (resource.k8s.io/v1)
  -> devices, free capacity and counters, CEL matching; bad objects become `problems`, never exceptions.
- `state.ClusterState`: the cycle's snapshot as arrays over nodes and GPU slots (plus MIG partitions).
- `request.Request` / `request_from_claim`: what one replica needs (Exclusive, MIG, Shared, or no device).
- `framework.Engine(profile).schedule(request, state, inputs, rng) -> Decision`: filters with structured unfit
  reasons, weighted scores, device choice; `apply(...)` records a decision in the snapshot.
- `plugins`: the filters and scores and the one registry (`build_profile`).
- `frag`: FGD's fragmentation measure, the workload mix (`WorkloadMix.typical`, `observed_mix`).
- `claims.pinned_claim(...)`: the ResourceClaim that pins the chosen devices, and the Pod's node selection.
"""
