"""Loading policies and manifests from files."""
