"""infer-ctl: a Kubernetes controller for GPU inference.

Layers, outer to inner (enforced by .importlinter): cli > controller | sim | sandbox >
observe | actuate | config > kube > engine > forecast | decide | place > core.
"""
