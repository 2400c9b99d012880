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
ANNOTATION_MODEL_CACHE = "infer-ctl.io/model-cache"  # on Nodes: comma-separated cache keys held locally
ANNOTATION_SANDBOX_ADDRESS = "sandbox.infer-ctl.io/address"  # on sandbox Pods: host:port of the local process
