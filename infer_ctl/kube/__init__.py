"""Kubernetes object helpers shared by the shell: CRD schemas (defaulting, validation, CEL rules), manifests."""
