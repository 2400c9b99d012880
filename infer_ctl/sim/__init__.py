"""The simulator: the same engine in simulated time, with the peers' autoscalers as baselines."""
