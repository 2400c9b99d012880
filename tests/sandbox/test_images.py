"""The node agent's image table: parsing with errors that name the entry and field, first match wins with the
user's entries before the built-in ones, the engines' launchers stripped (others refused), the engine version from
the tag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infer_ctl.sandbox.images import (
    ImageTable,
    ImageTableError,
    LaunchError,
    engine_version,
    load_image_table,
    parse_image_table,
)

PY = "/usr/bin/python3"


def table(*entries: dict[str, Any]) -> ImageTable:
    return ImageTable.with_builtins(parse_image_table({"images": list(entries)}, "t.yaml"), python=PY)


@pytest.mark.parametrize(("data", "message"), [
    pytest.param({"imgs": []}, r"t.yaml: expected a mapping with the one key 'images'", id="an unknown top key"),
    pytest.param({"images": {"a": 1}}, r"t.yaml: images: expected a list", id="images not a list"),
    pytest.param({"images": [{"command": ["x"]}]}, r"t.yaml: images\[0\]\.image: expected a non-empty string",
                 id="an entry without image"),
    pytest.param({"images": [{"image": "a*", "command": ["x"]}, {"image": "b*", "command": "x y"}]},
                 r"t.yaml: images\[1\]\.command \(image 'b\*'\): expected a non-empty list", id="a command string"),
    pytest.param({"images": [{"image": "a*", "command": []}]}, r"images\[0\]\.command", id="an empty command"),
    pytest.param({"images": [{"image": "a*", "command": ["x"], "args": []}]},
                 r"images\[0\]: unknown field\(s\) args", id="an unknown field"),
])
def test_a_bad_image_table_is_refused_naming_the_entry_and_field(data: Any, message: str) -> None:
    with pytest.raises(ImageTableError, match=message):
        parse_image_table(data, "t.yaml")


def test_an_unreadable_or_non_yaml_file_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ImageTableError, match="cannot read"):
        load_image_table(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("images: [\n")
    with pytest.raises(ImageTableError, match=r"bad.yaml: not YAML"):
        load_image_table(bad)


def test_the_users_entries_match_before_the_built_in_ones_and_the_first_match_wins() -> None:
    images = table({"image": "vllm/vllm-openai:v0.11*", "command": ["old-vllm"]},
                   {"image": "*", "command": ["anything"]})
    assert images.launch({"image": "vllm/vllm-openai:v0.11.0", "args": ["--port", "8000"]}).argv == (  # type: ignore[union-attr]
        "old-vllm", "--port", "8000")
    assert images.launch({"image": "vllm/vllm-openai:latest"}).argv == ("anything",)  # type: ignore[union-attr]
    assert ImageTable.with_builtins(python=PY).launch({"image": "registry.example/x:1"}) is None


@pytest.mark.parametrize("command", [None, ["vllm", "serve"], ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                                     ["python", "-m", "vllm.entrypoints.openai.api_server"]])
def test_a_vllm_containers_launcher_is_stripped_and_its_args_go_to_the_stand_in_through_the_zygote(
        command: list[str] | None) -> None:
    launch = table().launch({"image": "docker.io/vllm/vllm-openai:v0.11.0", "command": command,
                             "args": ["--model", "m", "--port", "8000"]})
    assert launch is not None
    assert launch.argv == (PY, "-m", "infer_ctl.sandbox.modelserver", "vllm", "--model", "m", "--port", "8000")
    assert launch.zygote_args == ("vllm", "--model", "m", "--port", "8000")


def test_sglangs_launcher_is_stripped_and_another_command_for_a_built_in_image_is_refused() -> None:
    sglang = table().launch({"image": "lmsysorg/sglang:v0.5.2", "command": ["python3", "-m", "sglang.launch_server"],
                             "args": ["--model-path", "m"]})
    assert sglang is not None and sglang.zygote_args == ("sglang", "--model-path", "m")
    with pytest.raises(LaunchError, match=r"command \['bash', '-c', 'x'\] of image vllm/vllm-openai:latest"):
        table().launch({"image": "vllm/vllm-openai:latest", "command": ["bash", "-c", "x"]})


def test_a_users_command_runs_as_a_plain_process_with_the_containers_command_and_args_appended() -> None:
    launch = table({"image": "example.com/tiny*", "command": [PY, "tiny.py"]}).launch(
        {"image": "example.com/tiny:1", "command": ["--flag"], "args": ["--port", "9"]})
    assert launch is not None and launch.zygote_args is None
    assert launch.argv == (PY, "tiny.py", "--flag", "--port", "9")


@pytest.mark.parametrize(("image", "version"), [
    ("vllm/vllm-openai:v0.11.0", "0.11.0"), ("docker.io/vllm/vllm-openai:0.10.2", "0.10.2"),
    ("vllm/vllm-openai:latest", ""), ("vllm/vllm-openai", ""), ("vllm/vllm-openai@sha256:abc", ""),
    ("localhost:5000/vllm/vllm-openai", ""), ("lmsysorg/sglang:v0.5.2-cu126", "0.5.2-cu126"),
], ids=lambda v: str(v) or "newest")
def test_the_engine_version_comes_from_the_image_tag(image: str, version: str) -> None:
    assert engine_version(image) == version
