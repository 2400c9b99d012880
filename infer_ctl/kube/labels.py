"""Labels and annotations infer-ctl puts on the objects it manages (read by the controller and the sandbox)."""

from __future__ import annotations

LABEL_SERVICE = "infer-ctl.io/service"
LABEL_ROLE = "infer-ctl.io/role"  # serving | standby
LABEL_REPLICA = "infer-ctl.io/replica"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
ANNOTATION_SPEC_HASH = "infer-ctl.io/spec-hash"
ANNOTATION_CACHE_KEY = "infer-ctl.io/model-cache-key"
ANNOTATION_ACCELERATOR = "infer-ctl.io/accelerator"
ANNOTATION_CACHED = "infer-ctl.io/model-cached"
# on a replica's ResourceClaim: the devices its placement chose (JSON, as allocation results), so that any
# controller (one restarted, a peer) holds them while the scheduler has not allocated the claim yet
ANNOTATION_PINNED_DEVICES = "infer-ctl.io/pinned-devices"
MANAGER = "infer-ctl"
ROLE_SERVING = "serving"
ROLE_STANDBY = "standby"
ANNOTATION_MODEL_CACHE = "infer-ctl.io/model-cache"  # on sandbox Nodes: cache keys held (no controller reads it)
ROLE_PREFETCH = "prefetch"  # a Pod that fills its node's model cache and completes (the cached tier)
# on replica and prefetch Pods: the model's weights in bytes (what a sleeping replica holds in host memory and an
# awake one on its device; what a prefetch downloads)
ANNOTATION_MODEL_BYTES = "infer-ctl.io/model-bytes"
ANNOTATION_HOST_MEMORY_BYTES = "infer-ctl.io/host-memory-bytes"  # on Nodes: budget for sleeping replicas' weights
ANNOTATION_HOST_MEMORY_USED = "infer-ctl.io/host-memory-used-bytes"  # on Nodes: what sleeping replicas hold now
# The sandbox's simulated links, in GB/s (10^9 bytes per second), on Nodes (or on a Pod, overriding its Node's):
# host-to-device (a wake), device-to-host (a sleep), network (a prefetch into the node's model cache)
ANNOTATION_H2D_GBPS = "sandbox.infer-ctl.io/h2d-gbps"
ANNOTATION_D2H_GBPS = "sandbox.infer-ctl.io/d2h-gbps"
ANNOTATION_NETWORK_GBPS = "sandbox.infer-ctl.io/network-gbps"
