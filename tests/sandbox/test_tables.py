"""`kubectl get` on the emulator: the server-side Table of Events (kube-apiserver's printEvent columns, through
either Event API) and the server's way of printing ages. Held against kube-apiserver 1.37 by
tests/realcluster/test_emulator_events.py."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

import httpx
import pytest

from infer_ctl.sandbox.kubeconfig import write_kubeconfig
from infer_ctl.sandbox.tables import human_duration, since
from infer_ctl.sandbox.testing import RunningApiServer
from tests.sandbox.kubectl import columns, kubectl_binary
from tests.sandbox.test_events import AT, CORE, NEW, core_event, new_event

TABLE = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
EVENT_COLUMNS = [("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Subobject", 1), ("Source", 1),
                 ("Message", 0), ("First Seen", 1), ("Count", 1), ("Name", 1)]


@pytest.mark.parametrize(("seconds", "printed"), [
    (-3, "<invalid>"), (-0.5, "0s"), (0, "0s"), (59.9, "59s"), (119, "119s"), (120, "2m"), (125, "2m5s"),
    (599, "9m59s"), (600, "10m"), (179 * 60 + 59, "179m"), (3 * 3600, "3h"), (3 * 3600 + 20 * 60, "3h20m"),
    (8 * 3600, "8h"), (47 * 3600, "47h"), (48 * 3600, "2d"), (76 * 3600, "3d4h"), (8 * 86400, "8d"),
    (729 * 86400, "729d"), (730 * 86400, "2y"), (760 * 86400, "2y30d"), (8 * 365 * 86400, "8y"),
])
def test_durations_are_printed_as_kube_apiserver_prints_them(seconds: float, printed: str) -> None:
    assert human_duration(seconds) == printed


def test_a_time_and_a_micro_time_are_read_alike_and_none_is_unknown() -> None:
    now = datetime.datetime(2026, 12, 1, 9, 33, 20, tzinfo=datetime.UTC)
    assert since("2026-12-01T09:30:15Z", now) == "3m5s"
    assert since("2026-12-01T09:30:15.999999Z", now) == "3m4s"  # 184.000001 s: Go truncates
    assert since(None, now) == since("", now) == "<unknown>"


def _table(http: httpx.Client, path: str) -> dict[str, list[list[object]]]:
    table = http.get(path, headers=TABLE).json()
    assert table["kind"] == "Table", table
    assert [(c["name"], c["priority"]) for c in table["columnDefinitions"]] == EVENT_COLUMNS
    return {str(r["cells"][-1]): r["cells"][1:7] + r["cells"][8:] for r in table["rows"]}  # ages left out


def test_events_print_kube_apiservers_columns_through_both_apis(http: httpx.Client) -> None:
    assert http.post(CORE, json=core_event("scheduled", count=2)).status_code == 201
    assert http.post(NEW, json=new_event("placed")).status_code == 201
    assert http.post(NEW, json=new_event("repeated", type="Warning", reason="PlacementFailed", note="  no device\n",
                                         series={"count": 5, "lastObservedTime": AT})).status_code == 201
    rows = {
        # (type, reason, object, subobject, source, message, count, name)
        "scheduled": ["Normal", "Scheduled", "configmap/target", "", "default-scheduler", "assigned to n1", 2,
                      "scheduled"],
        "placed": ["Normal", "Placed", "configmap/target", "", "infer-ctl.io/infer-ctl, infer-ctl",
                   "replica r0 on n1", 1, "placed"],  # a singleton events.k8s.io Event counts 1
        "repeated": ["Warning", "PlacementFailed", "configmap/target", "", "infer-ctl.io/infer-ctl, infer-ctl",
                     "no device", 5, "repeated"],  # the series' count, the message trimmed
    }
    assert _table(http, CORE) == _table(http, NEW) == rows
    assert _table(http, f"{CORE}/placed") == {"placed": rows["placed"]}


def test_an_events_times_come_from_its_timestamps_event_time_or_series() -> None:
    from infer_ctl.sandbox.resources import BUILTIN_TYPES
    from infer_ctl.sandbox.tables import table

    now = datetime.datetime(2026, 12, 1, 10, 30, 15, tzinfo=datetime.UTC)
    core_rt = next(rt for rt in BUILTIN_TYPES if rt.group == "" and rt.plural == "events")
    meta = {"name": "e", "namespace": "default"}
    old = {"metadata": meta, "firstTimestamp": "2026-12-01T09:30:15Z", "lastTimestamp": "2026-12-01T10:20:15Z"}
    new = {"metadata": meta, "firstTimestamp": None, "lastTimestamp": None, "eventTime": "2026-12-01T10:29:15.5Z"}
    series = {**new, "series": {"count": 4, "lastObservedTime": "2026-12-01T10:30:05.000000Z"}}
    never = {"metadata": meta}
    cells = [table(core_rt, [e], now, "1")["rows"][0]["cells"] for e in (old, new, series, never)]
    # (last seen, first seen, count)
    assert [(c[0], c[7], c[8]) for c in cells] == [("10m", "60m", 1), ("59s", "59s", 1), ("10s", "59s", 4),
                                                   ("<unknown>", "<unknown>", 1)]


def test_kubectl_get_events_prints_last_seen_type_reason_object_message(api: RunningApiServer,
                                                                        tmp_path: Path) -> None:
    kubectl = kubectl_binary()
    if kubectl is None:
        pytest.skip("no kubectl (neither the project's build nor one on PATH)")
    with httpx.Client(base_url=api.url) as http:
        assert http.post(NEW, json=new_event("placed")).status_code == 201
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
    for args, header in (((), ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]),
                         (("-o", "wide"), ["LAST SEEN", "TYPE", "REASON", "OBJECT", "SUBOBJECT", "SOURCE", "MESSAGE",
                                           "FIRST SEEN", "COUNT", "NAME"])):
        done = subprocess.run([str(kubectl), f"--kubeconfig={kubeconfig}", "get", "events", *args],
                              capture_output=True, text=True, timeout=60, check=True)
        lines = columns(done.stdout)
        assert lines[0] == header, done.stdout
        row = dict(zip(header, lines[1], strict=True))
        assert (row["TYPE"], row["REASON"], row["OBJECT"], row["MESSAGE"]) == (
            "Normal", "Placed", "configmap/target", "replica r0 on n1"), done.stdout
