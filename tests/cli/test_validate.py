"""`infer-ctl validate`, run as a user runs it: the installed console script, as a CI gate (0 valid, 1 invalid,
2 unreadable)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import InferenceServiceBuilder

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
D = InferenceServiceBuilder.DELETE


def infer_ctl(*args: str, cwd: Path = ROOT, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "infer-ctl"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False,
                          input=stdin)


def test_the_examples_are_valid_and_each_gets_a_summary() -> None:
    assert len(EXAMPLES) >= 4
    result = infer_ctl("validate", *map(str, EXAMPLES))
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("llama-8b", "llama-70b", "bge-embedder", "qwen-coder-small"):
        assert f"InferenceService default/{name} is valid" in result.stdout
    assert "MIG 1g.5gb" in result.stdout  # the small model takes the smallest MIG profile that fits
    assert "4 whole GPUs" in result.stdout  # the 70B model takes 4 GPUs of one node
    assert "scales to zero" in result.stdout


def test_the_shipped_manifests_pass_the_gate() -> None:
    """The examples and the kustomize base, walked as directories (the base's policy files included); the only
    output of --quiet is a warning for each object no schema covers: kustomization.yaml, and the kopf peering
    object, whose CRD is in deploy/kustomize/kopf-peering."""
    result = infer_ctl("validate", "--quiet", "deploy/examples", "deploy/kustomize/base")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert [line.split(": warning: not checked")[0] for line in lines] == [
        "deploy/kustomize/base/kustomization.yaml:12: Kustomization <unnamed>",
        "deploy/kustomize/base/peering.yaml:3: ClusterKopfPeering infer-ctl"], result.stdout
    verbose = infer_ctl("validate", "deploy/kustomize/base")
    assert "deploy/kustomize/base/policies/accelerators.yaml:9: infer-ctl policy file accelerators.yaml is valid" \
        in verbose.stdout
    assert "Namespace infer-ctl-system is valid" in verbose.stdout  # cluster-scoped: no namespace
    assert "Deployment infer-ctl-system/infer-ctl is valid" in verbose.stdout


def test_every_other_manifest_in_deploy_validates_too() -> None:
    """The kopf peering objects are checked against their CRD when it is among the inputs (deploy/kustomize)."""
    result = infer_ctl("validate", "--quiet", "deploy/kustomize", "deploy/sandbox", "deploy/demo",
                       "deploy/monitoring/rules.yaml", "deploy/monitoring/servicemonitor.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ClusterKopfPeering" not in result.stdout  # checked (its CRD is in deploy/kustomize/kopf-peering)


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
    ("an-engine-without-a-runtime-profile", InferenceServiceBuilder().with_("spec.runtime.engine", "tgi"),
     "spec.runtime.engine", "unknown engine 'tgi': the runtime profiles (policies/runtimes.yaml) have vllm, sglang"),
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


# ----------------------------------------------------------------------------------------------- the gate's table


def manifest(*docs: dict[str, Any]) -> str:
    return yaml.safe_dump_all(list(docs), sort_keys=False)


def service(**changes: Any) -> dict[str, Any]:
    builder = InferenceServiceBuilder()
    for path, value in changes.items():
        builder.with_(path.replace("__", "."), value)
    return builder.build()


def deployment(resources: dict[str, Any] | None = None, **container: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "web", "image": "nginx",
                                                           "resources": resources or {}, **container}]}}}}


def namespace(name: str = "infer-ctl-system", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, **meta}}


PEERING_CRD = (ROOT / "deploy" / "kustomize" / "kopf-peering" / "crd.yaml").read_text()
PEERING = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "infer-ctl"}}


@dataclass(frozen=True)
class Case:
    """Files to write (relative to a scratch directory, which is also the working directory), the arguments of
    `infer-ctl validate`, and what must come out."""

    id: str
    files: dict[str, str]
    args: tuple[str, ...]
    code: int
    stdout: tuple[str, ...] = ()
    stderr: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()  # in neither stream
    stdin: str | None = None
    ordered: bool = field(default=False)  # `stdout` lines appear in this order


CASES = [
    Case("a typo in the kind of infer-ctl's API group is an error with a near miss",
         {"s.yaml": manifest({**service(), "kind": "InferenceServce"})}, ("s.yaml",), 1,
         ('s.yaml:1: InferenceServce default/llm is invalid:',
          'kind: "InferenceServce" is not a kind of API group \'infer-ctl.io\' (did you mean "InferenceService"?)')),
    Case("a version infer-ctl does not serve is an error naming the one it does",
         {"s.yaml": manifest({**service(), "apiVersion": "infer-ctl.io/v1"})}, ("s.yaml",), 1,
         ('apiVersion: "infer-ctl.io/v1" does not serve InferenceService: infer-ctl.io/v1alpha1 does '
          '(did you mean "infer-ctl.io/v1alpha1"?)',)),
    Case("after a typo in the kind, the rest of the object is still checked as what it most likely is",
         {"s.yaml": manifest({**service(spec__scaling__maxReplicas="ten"), "kind": "InferenceServce"})},
         ("s.yaml",), 1, ('did you mean "InferenceService"?', "spec.scaling.maxReplicas: must be an integer")),
    Case("a group one letter off infer-ctl's is an error, not an object of somebody else's to skip",
         {"s.yaml": manifest({**service(), "apiVersion": "infer-ctl.com/v1alpha1"})}, ("s.yaml",), 1,
         ("apiVersion: unknown API group 'infer-ctl.com' (did you mean \"infer-ctl.io/v1alpha1\"?)",)),
    Case("a typo in a Kubernetes kind is an error with a near miss, and only the nearest",
         {"d.yaml": manifest({**deployment(), "kind": "Deploymnet"})}, ("d.yaml",), 1,
         ('kind: "Deploymnet" is not a kind of API group \'apps\' (did you mean "Deployment"?)',),
         absent=("DaemonSet",)),
    Case("a Kubernetes kind in the wrong group names the right apiVersion",
         {"d.yaml": manifest({**deployment(), "apiVersion": "v1"})}, ("d.yaml",), 1,
         ("apiVersion: Deployment is not in the core API group ('v1') (did you mean \"apps/v1\"?)",)),
    Case("a version Kubernetes 1.37 no longer serves names the one it does",
         {"d.yaml": manifest({**deployment(), "apiVersion": "apps/v1beta2"})}, ("d.yaml",), 1,
         ('apiVersion: "apps/v1beta2" does not serve Deployment: apps/v1 does (did you mean "apps/v1"?)',)),
    Case("an object of another group with no schema is a clear warning and does not fail the gate",
         {"p.yaml": manifest(PEERING)}, ("p.yaml",), 0,
         ("p.yaml:1: ClusterKopfPeering infer-ctl: warning: not checked: kopf.dev/v1 is neither an API of "
          "Kubernetes 1.37.0 nor infer-ctl's, and no CustomResourceDefinition among the inputs defines "
          "ClusterKopfPeering", "1 not checked")),
    Case("an object whose CRD is among the inputs is checked against it",
         {"crd.yaml": PEERING_CRD, "p.yaml": manifest({**PEERING, "spec": {"colour": "red"}})},
         ("crd.yaml", "p.yaml"), 1, ("ClusterKopfPeering infer-ctl is invalid:",),
         absent=("not checked",)),
    Case("an empty file is an error naming the file",
         {"empty.yaml": ""}, ("empty.yaml",), 1, ("empty.yaml: no Kubernetes objects: the file is empty",)),
    Case("a file of comments only is an error naming the file",
         {"c.yaml": "# TODO: write the Deployment\n"}, ("c.yaml",), 1,
         ("c.yaml: no Kubernetes objects: the file holds only comments",)),
    Case("a file of document separators only is an error naming the file",
         {"d.yaml": "---\n---\n"}, ("d.yaml",), 1, ("d.yaml: no Kubernetes objects: the file holds only empty "
                                                    "documents",)),
    Case("an empty document between objects is not an error",
         {"two.yaml": manifest(namespace()) + "---\n---\n" + manifest(namespace("b"))}, ("two.yaml",), 0,
         ("two.yaml:1: Namespace infer-ctl-system is valid", "two.yaml:7: Namespace b is valid")),
    Case("memory: 1GB in a container's limits is an error with the unit to use",
         {"d.yaml": manifest(deployment({"limits": {"memory": "1GB"}}))}, ("d.yaml",), 1,
         ("d.yaml:1: Deployment shop/web is invalid:",
          "spec.template.spec.containers[0].resources.limits.memory: '1GB' is not a Kubernetes quantity: unit "
          "'GB' is unknown, use G or Gi")),
    Case("every problem of a Kubernetes object is printed, not only the first",
         {"d.yaml": manifest(deployment({"limits": {"cpu": "1.5.2"}, "requests": {"memory": "1GB"}},
                                        imagePullPolicy="ifNotPresent", ports=[{"containerPort": "80"}]))},
         ("d.yaml",), 1,
         ("spec.template.spec.containers[0].resources.limits.cpu: '1.5.2' is not a Kubernetes quantity",
          "spec.template.spec.containers[0].resources.requests.memory: '1GB' is not a Kubernetes quantity",
          "spec.template.spec.containers[0].imagePullPolicy: Unsupported value: 'ifNotPresent': supported values: "
          '"Always", "IfNotPresent", "Never" (did you mean "IfNotPresent"?)',
          'spec.template.spec.containers[0].ports[0].containerPort: Invalid value: "80": must be of type integer')),
    Case("a quantity anywhere a schema has one is parsed (a claim's storage)",
         {"pvc.yaml": manifest({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"},
                                "spec": {"accessModes": ["ReadWriteOnce"],
                                         "resources": {"requests": {"storage": "10 Gi"}}}})}, ("pvc.yaml",), 1,
         ("spec.resources.requests.storage: '10 Gi' is not a Kubernetes quantity",)),
    Case("a request above its limit is an error, as kube-apiserver refuses it",
         {"d.yaml": manifest(deployment({"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}))},
         ("d.yaml",), 1, ("spec.template.spec.containers[0].resources.requests.memory: Invalid value: '2Gi': must "
                          "be less than or equal to memory limit of 1Gi",)),
    Case("a valid quantity written as a number is accepted",
         {"d.yaml": manifest(deployment({"limits": {"cpu": 1.5, "memory": "1Gi"}}))}, ("d.yaml",), 0,
         ("Deployment shop/web is valid (Kubernetes 1.37.0 schema)",)),
    Case("cluster-scoped objects are named without a namespace, namespaced ones with theirs or default",
         {"m.yaml": manifest(namespace(), {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                           "metadata": {"name": "reader"}},
                             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})},
         ("m.yaml",), 0, ("Namespace infer-ctl-system is valid", "ClusterRole reader is valid",
                          "ConfigMap default/c is valid"), absent=("default/infer-ctl-system", "default/reader")),
    Case("a namespace on a cluster-scoped object is a warning that it is ignored",
         {"ns.yaml": manifest(namespace(namespace="default"))}, ("ns.yaml",), 0,
         ("ns.yaml:1: Namespace infer-ctl-system: warning: metadata.namespace is ignored: Namespace is "
          "cluster-scoped",)),
    Case("a directory is walked recursively in sorted order for .yaml, .yml and .json; other and hidden files "
         "are left alone",
         {"d/b.yaml": manifest(namespace("b")), "d/a/z.yml": manifest(namespace("z")),
          "d/c.json": json.dumps(namespace("c")), "d/README.md": "# not a manifest",
          "d/.git/config.yaml": "not: [valid", "d/.hidden.yaml": "not: [valid"}, ("d",), 0,
         ("d/a/z.yml:1: Namespace z is valid", "d/b.yaml:1: Namespace b is valid", "d/c.json:1: Namespace c is valid",
          "3 objects in 3 files: 3 valid"), ordered=True),
    Case("a directory without manifests is unreadable",
         {"d/README.md": "# nothing here"}, ("d",), 2, stderr=("d: no *.yaml, *.yml or *.json files",)),
    Case("- reads the manifests from standard input",
         {}, ("-",), 1, ("<stdin>:1: Deployment shop/web is invalid:", "'1GB' is not a Kubernetes quantity"),
         stdin=manifest(deployment({"limits": {"memory": "1GB"}}))),
    Case("a product in the wrong case gets the catalog's name",
         {"s.yaml": manifest(service(spec__accelerator__products=["h100-80gb"]))}, ("s.yaml",), 1,
         ("spec.accelerator.products[0]: unknown product 'h100-80gb'", '(did you mean "H100-80GB"?)')),
    Case("a product written as the driver's productName gets its catalog entry",
         {"s.yaml": manifest(service(spec__accelerator__products=["NVIDIA H100 80GB HBM3"]))}, ("s.yaml",), 1,
         ('unknown product \'NVIDIA H100 80GB HBM3\'', '(did you mean "H100-80GB"?)')),
    Case("a product named by its family alone gets every entry of the family",
         {"s.yaml": manifest(service(spec__accelerator__products=["A100"]))}, ("s.yaml",), 1,
         ('(did you mean "A100-80GB" or "A100-40GB"?)',)),
    Case("a problem in one field does not hide the catalog's: both are printed, each with its near miss",
         {"s.yaml": manifest(service(spec__accelerator__sharing="exclusive",
                                     spec__accelerator__products=["h100-80gb"]))}, ("s.yaml",), 1,
         ('spec.accelerator.sharing: Unsupported value: "exclusive"', '(did you mean "Exclusive"?)',
          "spec.accelerator.products[0]: unknown product 'h100-80gb'", '(did you mean "H100-80GB"?)')),
    Case("an enumerated value of the CRD in the wrong case gets the right one",
         {"s.yaml": manifest(service(spec__accelerator__sharing="mig", spec__scaling__preset="Balanced"))},
         ("s.yaml",), 1, ('spec.accelerator.sharing: Unsupported value: "mig"', '(did you mean "MIG"?)',
                          '(did you mean "balanced"?)')),
    Case("a key given twice is an error with both lines",
         {"d.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  a: x\n  a: y\n"}, ("d.yaml",), 1,
         ("data.a: duplicate field (lines 5 and 6)",)),
    Case("YAML that does not parse is unreadable, and the other files are still checked",
         {"bad.yaml": "spec: [unclosed\n", "good.yaml": manifest(namespace())}, ("bad.yaml", "good.yaml"), 2,
         ("good.yaml:1: Namespace infer-ctl-system is valid",), ("bad.yaml: not valid YAML",)),
    Case("a missing file is unreadable, and 2 wins over 1",
         {"empty.yaml": ""}, ("nope.yaml", "empty.yaml"), 2, ("empty.yaml: no Kubernetes objects",),
         ("nope.yaml: cannot read: No such file or directory",)),
    Case("JSON that does not parse is unreadable",
         {"x.json": '{"apiVersion": "v1",'}, ("x.json",), 2, stderr=("x.json: not valid JSON",)),
    Case("a document that is not a mapping is invalid",
         {"s.yaml": "- just\n- a list\n"}, ("s.yaml",), 1, ("not a Kubernetes object",)),
    Case("an object without apiVersion and kind is invalid",
         {"s.yaml": "metadata: {name: x}\n"}, ("s.yaml",), 1,
         ("apiVersion: Required value", "kind: Required value")),
    Case("a kind: List (kubectl get -o yaml) has each item checked at its own line",
         {"l.yaml": manifest({"apiVersion": "v1", "kind": "List",
                              "items": [namespace("a"), {**namespace("b"), "kind": "Namespaec"}]})},
         ("l.yaml",), 1, ("l.yaml:4: items[0]: Namespace a is valid",
                          'l.yaml:8: items[1]: Namespaec b is invalid:', '(did you mean "Namespace"?)')),
    Case("a policy file in a directory is checked as the controller reads it",
         {"p/accelerators.yaml": "version: v1alpha1\naccelerators:\n  - name: X\n"}, ("p",), 1,
         ("p/accelerators.yaml:1: infer-ctl policy file accelerators.yaml is invalid:",)),
    Case("a sandbox cluster file is checked as the sandbox reads it, with the catalog's names",
         {"c.yaml": (ROOT / "deploy" / "sandbox" / "small.yaml").read_text().replace(
             "accelerator: H100-80GB", "accelerator: h100", 1)}, ("c.yaml",), 1,
         ("SandboxCluster small is invalid:", '(did you mean "H100-80GB"?)')),
    Case("quiet prints only problems and warnings",
         {"ok.yaml": manifest(namespace()), "p.yaml": manifest(PEERING)}, ("-q", "ok.yaml", "p.yaml"), 0,
         ("warning: not checked",), absent=("is valid", "objects in")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_validate_as_a_ci_gate(tmp_path: Path, case: Case) -> None:
    for name, text in case.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    result = infer_ctl("validate", *case.args, cwd=tmp_path, stdin=case.stdin)
    shown = f"exit {result.returncode}\n--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
    assert result.returncode == case.code, shown
    for text in case.stdout:
        assert text in result.stdout, shown
    for text in case.stderr:
        assert text in result.stderr, shown
    for text in case.absent:
        assert text not in result.stdout + result.stderr, shown
    if case.ordered:
        positions = [result.stdout.index(text) for text in case.stdout]
        assert positions == sorted(positions), shown


def test_the_help_documents_the_exit_codes() -> None:
    result = infer_ctl("validate", "--help")
    assert result.returncode == 0
    for line in ("0  every object is valid", "1  an object is invalid", "2  an input could not be checked"):
        assert line in result.stdout, result.stdout


def test_invalid_policies_make_validate_exit_2(tmp_path: Path) -> None:
    (tmp_path / "accelerators.yaml").write_text("version: v1alpha1\naccelerators: []\n")
    result = infer_ctl("validate", "--policies", str(tmp_path), *map(str, EXAMPLES))
    assert result.returncode == 2
    assert "the policies are invalid" in result.stderr


def test_the_cluster_scoped_table_names_real_kinds_and_agrees_with_the_emulator() -> None:
    """A typo in the table would print a cluster-scoped kind with a namespace; the emulator's resource table
    (held against kube-apiserver) says the same for the kinds both know."""
    from infer_ctl.cli.validate import CLUSTER_SCOPED
    from infer_ctl.sandbox.resources import BUILTIN_TYPES
    from infer_ctl.sandbox.validation import builtin_group_version_kinds

    known = {(group, kind) for group, _, kind in builtin_group_version_kinds()}
    assert known >= CLUSTER_SCOPED, CLUSTER_SCOPED - known
    for resource in BUILTIN_TYPES:
        assert ((resource.group, resource.kind) in CLUSTER_SCOPED) == (not resource.namespaced), resource.kind
