"""The node agent's memory ledger (infer_ctl.sandbox.nodeagent.MemoryLedger): what awake model servers take of a
device, a warm host's sleepers included."""

from __future__ import annotations

from infer_ctl.sandbox.nodeagent import Holding, MemoryLedger

GIB = 1024**3
DEVICE = {"gpu.nvidia.com/h100-0/gpu-0": 80 * GIB}


def test_an_awake_model_takes_what_its_pod_says_it_takes_of_the_device_else_its_weights() -> None:
    ledger = MemoryLedger({"whole": Holding("default/whole", "h100-0", 20 * GIB, DEVICE, device_bytes=80 * GIB),
                           "share-a": Holding("default/share-a", "h100-0", 20 * GIB, DEVICE),
                           "share-b": Holding("default/share-b", "h100-0", 20 * GIB, DEVICE)})
    # two memory shares of 20 GiB fit awake together ...
    assert ledger.reserve_device("share-a") is None and ledger.reserve_device("share-b") is None
    # ... but a replica of an Exclusive service takes the device whole awake (`infer-ctl.io/device-memory-bytes`)
    refused = ledger.reserve_device("whole")
    assert refused is not None and "awake models hold 40Gi" in refused and "needs 80Gi" in refused
    ledger.release("share-a", "device")
    ledger.release("share-b", "device")
    assert ledger.reserve_device("whole") is None
    assert ledger.reserve_device("share-a") is not None  # and nothing else wakes beside it
