"""The three patch formats, against the examples of their specifications (RFC 7386, RFC 6902, Kubernetes)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer_ctl.sandbox.patch import PatchError, json_patch, merge_patch, strategic_merge_patch

# RFC 7386, Appendix A (a selection).
MERGE_CASES = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "result"), MERGE_CASES,
                         ids=["a value is replaced", "a key is added", "null removes a key",
                              "a list is replaced by a scalar", "lists are replaced whole",
                              "existing nulls are kept", "nested nulls leave empty objects"])
def test_merge_patch_follows_rfc_7386(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result


def test_json_patch_moves_copies_and_removes() -> None:
    doc = {"a": {"b": [1, 2, 3]}, "c": "x"}
    ops = [{"op": "move", "from": "/c", "path": "/d"}, {"op": "copy", "from": "/a/b/0", "path": "/a/b/-"},
           {"op": "remove", "path": "/a/b/1"}, {"op": "add", "path": "/a/b/0", "value": 0}]
    assert json_patch(doc, ops) == {"a": {"b": [0, 1, 3, 1]}, "d": "x"}
    assert doc == {"a": {"b": [1, 2, 3]}, "c": "x"}  # the input is not modified


def test_json_patch_replace_sets_a_missing_key_as_kube_apiserver_does() -> None:
    assert json_patch({"a": {}}, [{"op": "replace", "path": "/a/b", "value": 1}]) == {"a": {"b": 1}}


@pytest.mark.parametrize(("ops", "status"), [
    ([{"op": "test", "path": "/a", "value": 2}], 422),
    ([{"op": "remove", "path": "/missing"}], 422),
    ([{"op": "replace", "path": "/a/b", "value": 1}], 422),
    ([{"op": "jump", "path": "/a"}], 422),  # kube-apiserver 1.37 answers 422 (tests/realcluster agree)
    ({"op": "add"}, 400),
], ids=["a failed test", "removing a missing key", "a path through a scalar", "an unknown operation",
        "a patch that is not a list"])
def test_json_patch_errors_carry_kube_status_codes(ops: Any, status: int) -> None:
    with pytest.raises(PatchError) as caught:
        json_patch({"a": 1}, ops)
    assert caught.value.status == status


def test_strategic_merge_deletes_list_items_and_merges_finalizers_as_a_set() -> None:
    pod = {"metadata": {"finalizers": ["a"]}, "spec": {"containers": [{"name": "x", "image": "1"},
                                                                      {"name": "y", "image": "1"}]}}
    patch = {"metadata": {"finalizers": ["a", "b"]},
             "spec": {"containers": [{"name": "y", "$patch": "delete"}, {"name": "z", "image": "2"}]}}
    result = strategic_merge_patch(pod, patch, "Pod")
    assert result["metadata"]["finalizers"] == ["a", "b"]
    assert [c["name"] for c in result["spec"]["containers"]] == ["x", "z"]


def test_strategic_merge_replace_directive_replaces_a_map() -> None:
    result = strategic_merge_patch({"spec": {"nodeSelector": {"a": "1", "b": "2"}}},
                                   {"spec": {"nodeSelector": {"$patch": "replace", "c": "3"}}}, "Pod")
    assert result["spec"]["nodeSelector"] == {"c": "3"}


def test_service_ports_merge_by_port_and_container_ports_by_container_port() -> None:
    service = {"spec": {"ports": [{"port": 80, "name": "http"}]}}
    assert len(strategic_merge_patch(service, {"spec": {"ports": [{"port": 443}]}}, "Service")["spec"]["ports"]) == 2


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                           lambda inner: st.dictionaries(st.text(max_size=3), inner, max_size=4), max_leaves=10)


@given(st.dictionaries(st.text(max_size=3), json_values, max_size=5),
       st.dictionaries(st.text(max_size=3), json_values, max_size=5))
def test_a_merge_patch_applied_twice_changes_nothing_more(target: dict[str, Any], patch: dict[str, Any]) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once
