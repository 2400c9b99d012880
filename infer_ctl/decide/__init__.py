"""Scaling decisions (pure): desired serving and standby replicas, each with its reason as data."""
