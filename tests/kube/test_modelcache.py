"""The node cache record (one ConfigMap per node): what the reporter writes is what the controller reads, and a
record it cannot read is refused naming the field."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest

from infer_ctl.kube.modelcache import (
    DATA_MODELS,
    NODE_CACHE_SELECTOR,
    CachedModel,
    RecordError,
    model_caches,
    parse_record,
    record,
    record_name,
)

MODELS = [CachedModel("meta-llama/Llama-3.1-8B-Instruct", 16_060_000_000, "2026-12-07T22:00:00Z"),
          CachedModel("hf://Qwen/Qwen2.5-7B-Instruct@v1", 15_200_000_000, "2026-12-07T21:00:00Z")]


def test_a_record_is_a_valid_configmap_owned_by_its_node_and_reads_back() -> None:
    obj = record("h100-0", "infer-ctl-system", MODELS, node_uid="uid-1")
    kubernetes_validate.validate(obj, "1.37.0", strict=True)
    assert obj["metadata"]["name"] == "infer-ctl-node-cache-h100-0"
    assert obj["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": "h100-0",
                                                   "uid": "uid-1"}]
    key, value = NODE_CACHE_SELECTOR.split("=")
    assert obj["metadata"]["labels"][key] == value
    assert parse_record(obj) == ("h100-0", tuple(sorted(MODELS, key=lambda m: m.key)))
    assert model_caches([obj]) == ({"h100-0": frozenset(m.key for m in MODELS)}, [])


def test_a_long_node_name_gives_a_valid_name_that_differs_per_node() -> None:
    a, b = record_name("n" * 250 + "a"), record_name("n" * 250 + "b")
    assert len(a) <= 253 and len(b) <= 253 and a != b
    assert record_name("l4-0") == "infer-ctl-node-cache-l4-0"


@pytest.mark.parametrize(("data", "says"), [
    ({DATA_MODELS: "[]"}, "data.node: Required value"),
    ({"node": "n", DATA_MODELS: "{not json"}, "data.models.json: Invalid value: not JSON"),
    ({"node": "n", DATA_MODELS: '{"key": "a"}'}, "a list of models is expected"),
    ({"node": "n", DATA_MODELS: '[{"bytes": 1}]'}, "data.models.json[0].key: Required value"),
    ({"node": "n", DATA_MODELS: '[{"key": "a", "bytes": -1}]'}, "data.models.json[0].bytes: Invalid value: -1"),
    ({"node": "n", DATA_MODELS: '[{"key": "a", "bytes": "1Gi"}]'}, "data.models.json[0].bytes: Invalid value"),
], ids=["no node", "not JSON", "not a list", "a model without a key", "negative bytes", "bytes as text"])
def test_a_record_that_cannot_be_read_names_the_field_and_counts_as_an_empty_cache(data: dict[str, str],
                                                                                     says: str) -> None:
    bad = {"metadata": {"name": "infer-ctl-node-cache-n"}, "data": data}
    with pytest.raises(RecordError, match=says.replace("[", r"\[").replace("]", r"\]")):
        parse_record(bad)
    good = record("h100-1", "infer-ctl-system", MODELS[:1])
    caches, problems = model_caches([bad, good])
    assert caches == {"h100-1": frozenset({MODELS[0].key})}
    assert len(problems) == 1 and "configmap infer-ctl-node-cache-n" in problems[0]


def test_the_models_are_listed_in_key_order_so_an_unchanged_cache_writes_the_same_data() -> None:
    a = record("n", "ns", MODELS)["data"]
    b = record("n", "ns", list(reversed(MODELS)))["data"]
    assert a == b and [m["key"] for m in json.loads(a[DATA_MODELS])] == sorted(m.key for m in MODELS)
