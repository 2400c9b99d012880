"""Stand-ins for stock inference engines, run by the node agent for a Pod whose image is vLLM's or SGLang's.

Each speaks its engine's own HTTP interface (routes, answers, metric names, labels and buckets, flags, gating
by environment and flags), held against the upstream files by tests/sandbox/test_standin_drift.py; only the
device is simulated, from `INFER_CTL_SANDBOX_*` variables that are no part of any engine's interface
(`hardware`). `http` is the small asyncio HTTP/1.1 server both share; `vllm` and `sglang` the engines;
`infer_ctl.sandbox.modelserver` the entry point and the node agent's fork server.
"""
