"""The pure core: typed API values (InferenceService spec and status), quantities, durations, policies.

No I/O, no clock, no Kubernetes client: functions take values (and `now`) and return values.
"""
