"""`infer-ctl validate` and `infer-ctl demo`, run as a user runs them: the installed console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.builders import InferenceServiceBuilder

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
D = InferenceServiceBuilder.DELETE


def infer_ctl(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "infer-ctl"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)


def test_the_examples_are_valid_and_each_gets_a_summary() -> None:
    assert len(EXAMPLES) >= 4
    result = infer_ctl("validate", *map(str, EXAMPLES))
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("llama-8b", "llama-70b", "bge-embedder", "qwen-coder-small"):
        assert f"InferenceService default/{name} is valid" in result.stdout
    assert "MIG 1g.5gb" in result.stdout  # the small model takes the smallest MIG profile that fits
    assert "4 whole GPUs" in result.stdout  # the 70B model takes 4 GPUs of one node
    assert "scales to zero" in result.stdout


BAD = [
    ("wrong-types", InferenceServiceBuilder().with_("spec.scaling.maxReplicas", "ten"),
     "spec.scaling.maxReplicas", "must be an integer, got string 'ten'"),
    ("min-above-max", InferenceServiceBuilder().with_("spec.scaling.minReplicas", 9),
     "spec.scaling", "minReplicas (9) must not exceed maxReplicas (4)"),
    ("unknown-sharing", InferenceServiceBuilder().with_("spec.accelerator.sharing", "Timeslice"),
     "spec.accelerator.sharing", 'Unsupported value: "Timeslice"'),
    ("negative-memory", InferenceServiceBuilder().with_("spec.model.memory", "-8Gi"),
     "spec.model.memory", "write the size without a sign"),
    ("bad-quantity", InferenceServiceBuilder().with_("spec.model.memory", "20Gb"),
     "spec.model.memory", "unit 'Gb' is unknown, use G or Gi"),
    ("missing-model", InferenceServiceBuilder().with_("spec.model", D), "spec.model", "Required value"),
    ("unknown-product", InferenceServiceBuilder().with_("spec.accelerator.products", ["H100"]),
     "spec.accelerator.products[0]", "unknown product 'H100'"),
    ("too-big-for-any-gpu", InferenceServiceBuilder().with_("spec.model.memory", "300Gi"),
     "spec.model.memory", "no allowed product can hold a replica"),
    ("mig-on-a-gpu-without-mig", InferenceServiceBuilder().with_("spec.accelerator.sharing", "MIG")
     .with_("spec.accelerator.products", ["L4"]), "spec.accelerator.sharing", "L4: has no MIG"),
]


@pytest.mark.parametrize(("name", "builder", "path", "message"), BAD, ids=[b[0] for b in BAD])
def test_an_invalid_manifest_is_rejected_with_exit_1_the_path_and_the_reason(
    tmp_path: Path, name: str, builder: InferenceServiceBuilder, path: str, message: str
) -> None:
    file = tmp_path / f"{name}.yaml"
    file.write_text(yaml.safe_dump(builder.build()))
    result = infer_ctl("validate", str(file))
    assert result.returncode == 1, result.stdout
    assert "InferenceService default/llm is invalid" in result.stdout
    assert any(line.strip().startswith(f"{path}: ") and message in line for line in result.stdout.splitlines()), \
        result.stdout


def test_builtin_objects_are_checked_against_the_kubernetes_schemas(tmp_path: Path) -> None:
    good = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": 1}}
    file = tmp_path / "mixed.yaml"
    file.write_text(yaml.safe_dump_all([good, bad]))
    result = infer_ctl("validate", str(file))
    assert result.returncode == 1
    assert "ConfigMap default/c is valid" in result.stdout
    assert "data.a: 1 is not of type 'string'" in result.stdout


def test_an_unreadable_or_broken_file_is_named_with_exit_2(tmp_path: Path) -> None:
    missing = infer_ctl("validate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml: cannot read" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    result = infer_ctl("validate", str(broken))
    assert result.returncode == 2 and "broken.yaml: not valid YAML" in result.stderr
