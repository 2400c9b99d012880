"""The committed CRD is the one `infer_ctl.core.crdgen` generates from `infer_ctl.core.api` (the controller-gen
and `git diff --exit-code` pattern): a field changed in the API and not regenerated fails here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.core import api, crdgen
from infer_ctl.core.errors import SpecError
from infer_ctl.core.fields import Prop
from infer_ctl.core.parse import parse_inference_service
from infer_ctl.kube.crd import apply_defaults
from tests.builders import InferenceServiceBuilder


def test_the_committed_crd_is_the_generated_one() -> None:
    assert crdgen.CRD_FILE.read_text() == crdgen.render(), "run: python -m infer_ctl.core.crdgen"


def test_check_exits_1_with_a_diff_when_the_file_is_out_of_date(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text(crdgen.render().replace("maximum: 65535", "maximum: 65534", 1))
    assert crdgen.main(["--check", "--output", str(stale)]) == 1
    diff = capsys.readouterr().out.splitlines()
    assert [line[0] + line[1:].strip() for line in diff if line.startswith(("+", "-"))][2:] == \
        ["-maximum: 65534", "+maximum: 65535"]
    assert crdgen.main(["--output", str(stale)]) == 0
    assert crdgen.main(["--check", "--output", str(stale)]) == 0


def test_the_generated_yaml_reads_back_as_the_generated_dict() -> None:
    assert yaml.safe_load(crdgen.render()) == crdgen.crd()


def test_the_crd_defaults_are_the_typed_values_defaults() -> None:
    """A manifest defaulted by the CRD parses to what the parser makes of it undefaulted: one default each."""
    manifest = InferenceServiceBuilder().build()
    schema = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert parse_inference_service(apply_defaults(schema, manifest)) == parse_inference_service(manifest)
    # the port has no CRD default: unset, it is the engine's (policies/runtimes.yaml), which no schema can know
    assert "default" not in schema["properties"]["spec"]["properties"]["runtime"]["properties"]["port"]
    assert api.RuntimeSpec(image="x").port is None


def _leaves(prop: Prop, path: str) -> list[str]:
    if prop.json_type == "object":
        return [leaf for key, sub in prop.properties.items() for leaf in _leaves(sub, f"{path}.{key}")]
    if prop.json_type == "array" and prop.items is not None and prop.items.json_type == "object":
        return [leaf for key, sub in prop.items.properties.items() for leaf in _leaves(sub, f"{path}[0].{key}")]
    return [path]


def _item_with(rest: str) -> dict[str, Any]:
    """A list item whose field `rest` (a dotted path, through lists as `[0].`) is an object where it should not be."""
    item: dict[str, Any] = {"name": "A"}
    if "[0]." not in rest:
        item[rest] = {"oops": 1}
        return item
    array, inner = rest.split("[0].", 1)
    node = item
    *parents, last = array.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = [_item_with(inner)]
    return item


@pytest.mark.parametrize("path", _leaves(api.SPEC_SCHEMA, "spec"))
def test_the_parser_reads_every_field_the_crd_declares(path: str) -> None:
    """A field declared (so generated into the CRD) and not read by the parser would pass the unknown-field
    check and be ignored: each one, given an object, is refused at its path."""
    builder = InferenceServiceBuilder()
    if "[0]." in path:
        array, rest = path.split("[0].", 1)
        builder.with_(array, [_item_with(rest)])
    else:
        builder.with_(path, {"oops": 1})
    with pytest.raises(SpecError) as refused:
        parse_inference_service(builder.build())
    assert path in [e.path for e in refused.value.errors]
