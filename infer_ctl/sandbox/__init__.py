"""The local sandbox cluster: an API server (kmock-based), GPU nodes with DRA, a scheduler, a node agent."""
