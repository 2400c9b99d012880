"""Writing the world: ResourceClaims, Pods, status, Events, metrics."""
