"""`infer-ctl validate FILE|DIR|- ...`: check manifests as the API server and the controller would, and explain them.

What is checked, every problem of every object printed with its file, the line where the object starts and the
field path:
- InferenceServices: the CRD (schema with its defaults, unknown fields, CEL rules), the parser and the
  accelerator catalog (unknown products, a model no allowed product can hold, MIG on a GPU without MIG); a
  summary of what each valid one asks for is printed.
- Kubernetes objects: the Kubernetes 1.37 schemas of kubernetes-validate with unknown fields as errors, every
  resource quantity parsed (`memory: 1GB` is an error: use 1G or 1Gi), a container's requests at most its
  limits, the values of well-known enumerated fields (imagePullPolicy, restartPolicy, Service type ...),
  object names and labels.
- Custom objects whose CustomResourceDefinition is among the inputs: that CRD's schema.
- An unknown kind or version in a known API group (infer-ctl.io, the groups of Kubernetes 1.37, a CRD's group
  among the inputs) is an error, with "did you mean" for near misses (also for products and enumerated values).
- Objects of other API groups cannot be checked: each one gets a warning, which does not change the exit status.
- The policy files accelerators.yaml, scaling.yaml, placement.yaml and runtimes.yaml (a copy such as a kustomize
  base holds) are checked as the controller reads them, a SandboxCluster file as `infer-ctl sandbox up` does.
- A key given twice in a mapping is an error (YAML loaders keep the last one silently); the items of a
  `kind: List` are checked one by one.

Directories are walked recursively for *.yaml, *.yml and *.json, in sorted order (hidden entries are skipped);
`-` reads standard input. Cluster-scoped objects are named without a namespace.

Exit status:
  0  every object is valid (warnings allowed)
  1  an object is invalid, or a file holds no object at all (empty, only comments, only `---`), which
     kubectl apply refuses too ("no objects passed to apply")
  2  an input could not be checked at all: a missing or unreadable file, a directory without manifests,
     YAML or JSON that does not parse, invalid --policies
Every input is checked and reported before exiting; 2 wins over 1.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, TextIO

import yaml

from infer_ctl.core.errors import FieldError
from infer_ctl.core.policy import histogram_metric, latency_histogram
from infer_ctl.core.runtime import token_objectives

KUBERNETES_VERSION = "1.37.0"
EXIT_VALID, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2
STDIN = "-"
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
POLICY_FILES = ("accelerators.yaml", "scaling.yaml", "placement.yaml", "runtimes.yaml")
# The sandbox's cluster file (`infer-ctl sandbox up --cluster FILE`), checked as the sandbox reads it.
SANDBOX_GROUP, SANDBOX_VERSION, SANDBOX_KIND = "sandbox.infer-ctl.io", "v1alpha1", "SandboxCluster"
KUSTOMIZE_GROUP = "kustomize.config.k8s.io"

# The cluster-scoped kinds of Kubernetes 1.37 (the schemas do not say which kinds are namespaced): `kubectl
# api-resources --namespaced=false` of kube-apiserver 1.37.2, plus the alpha kinds it does not enable by default
# (StorageVersion; ResourcePoolStatusRequest, whose registry strategy says NamespaceScoped() false).
CLUSTER_SCOPED: frozenset[tuple[str, str]] = frozenset({
    ("", "ComponentStatus"), ("", "Namespace"), ("", "Node"), ("", "PersistentVolume"),
    *(("admissionregistration.k8s.io", k) for k in (
        "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingWebhookConfiguration")),
    ("apiextensions.k8s.io", "CustomResourceDefinition"), ("apiregistration.k8s.io", "APIService"),
    ("authentication.k8s.io", "SelfSubjectReview"), ("authentication.k8s.io", "TokenReview"),
    ("authorization.k8s.io", "SelfSubjectAccessReview"), ("authorization.k8s.io", "SelfSubjectRulesReview"),
    ("authorization.k8s.io", "SubjectAccessReview"),
    ("certificates.k8s.io", "CertificateSigningRequest"), ("certificates.k8s.io", "ClusterTrustBundle"),
    ("flowcontrol.apiserver.k8s.io", "FlowSchema"), ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"),
    ("internal.apiserver.k8s.io", "StorageVersion"),
    ("networking.k8s.io", "IngressClass"), ("networking.k8s.io", "IPAddress"), ("networking.k8s.io", "ServiceCIDR"),
    ("node.k8s.io", "RuntimeClass"),
    ("rbac.authorization.k8s.io", "ClusterRole"), ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("resource.k8s.io", "DeviceClass"), ("resource.k8s.io", "DeviceTaintRule"), ("resource.k8s.io", "ResourceSlice"),
    ("resource.k8s.io", "ResourcePoolStatusRequest"),
    ("scheduling.k8s.io", "PriorityClass"),
    *(("storage.k8s.io", k) for k in ("CSIDriver", "CSINode", "StorageClass", "VolumeAttachment",
                                      "VolumeAttributesClass")),
    ("storagemigration.k8s.io", "StorageVersionMigration"),
})


def register(sub: Any) -> None:
    parser = sub.add_parser("validate", help="check manifests as the API server and the controller would (a CI gate)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", metavar="FILE",
                        help="YAML or JSON files (several documents each), directories, or - for standard input")
    parser.add_argument("--policies", type=Path, default=None,
                        help="policies folder (default: $INFER_CTL_POLICIES or the checkout's policies/)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only problems and warnings")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from infer_ctl.config.policies import load_policies
    from infer_ctl.core.errors import SpecError

    try:
        policies = load_policies(args.policies)
    except SpecError as exc:
        print("infer-ctl: the policies are invalid:", file=sys.stderr)
        for error in exc.errors:
            print(f"  {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    inputs = read_inputs(args.inputs, sys.stdin)
    for message in inputs.unreadable:
        print(message, file=sys.stderr)
    out = sys.stdout
    checker = Checker(policies=policies, crds=custom_resource_definitions(inputs.documents))
    reports = [report for doc in inputs.documents for report in checker.check(doc)]
    for report in reports:
        report.print(out, quiet=args.quiet)
    objects = [r for r in reports if not r.empty_file]
    empty = len(reports) - len(objects)
    invalid = sum(1 for r in objects if r.errors)
    unchecked = sum(1 for r in objects if not r.errors and not r.checked_against)
    if not args.quiet or invalid or empty or inputs.unreadable:
        counts = [(len(objects) - invalid - unchecked, "valid"), (invalid, "invalid"), (unchecked, "not checked"),
                  (empty, "file(s) without objects"), (len(inputs.unreadable), "input(s) unreadable")]
        told = ", ".join(f"{n} {what}" for n, what in counts if n)
        print(f"\n{_count(len(objects), 'object')} in {_count(inputs.files, 'file')}: {told or 'nothing to check'}",
              file=out)
    if inputs.unreadable:
        return EXIT_UNREADABLE
    return EXIT_INVALID if invalid or empty else EXIT_VALID


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# ---------------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class Document:
    """One YAML document (or JSON file): where it starts, what it holds, and its YAML node (duplicate keys)."""

    source: str
    line: int
    body: Any
    node: yaml.Node | None = None
    empty_file: str = ""  # why a file holds no object (then the file's only Document, with no body)

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


@dataclass(slots=True)
class Inputs:
    documents: list[Document] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # inputs that cannot be checked at all (exit 2)
    files: int = 0


def read_inputs(names: Sequence[str], stdin: TextIO) -> Inputs:
    """Every manifest named: files, directories walked, and standard input for `-`."""
    inputs = Inputs()
    for name in names:
        if name == STDIN:
            _read_text(inputs, "<stdin>", stdin.read(), json_file=False)
            continue
        path = Path(name)
        if path.is_dir():
            found = manifest_files(path)
            if not found:
                inputs.unreadable.append(f"{name}: no *.yaml, *.yml or *.json files in this directory")
            for file in found:
                _read_file(inputs, file)
        else:
            _read_file(inputs, path)
    return inputs


def manifest_files(directory: Path) -> list[Path]:
    """The manifests below `directory`, recursively and sorted; hidden files and directories are skipped."""
    found: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(root, f) for f in files if f.endswith(MANIFEST_SUFFIXES) and not f.startswith(".")]
    return sorted(found)


def _read_file(inputs: Inputs, path: Path) -> None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        inputs.unreadable.append(f"{path}: cannot read: {exc.strerror}")
        return
    except UnicodeDecodeError as exc:
        inputs.unreadable.append(f"{path}: cannot read: not UTF-8 text ({exc.reason} at byte {exc.start})")
        return
    _read_text(inputs, str(path), text, json_file=path.suffix == ".json")


def _read_text(inputs: Inputs, source: str, text: str, *, json_file: bool) -> None:
    inputs.files += 1
    if json_file:
        try:
            docs = [Document(source, 1, json.loads(text))] if text.strip() else []
        except json.JSONDecodeError as exc:
            inputs.unreadable.append(f"{source}: not valid JSON: {exc}")
            return
    else:
        try:
            docs = parse_yaml(source, text)
        except yaml.YAMLError as exc:
            inputs.unreadable.append(f"{source}: not valid YAML: {exc}")
            return
    objects = [d for d in docs if d.body is not None]
    if not objects:
        objects = [Document(source, 0, None, empty_file=_why_empty(text, json_file=json_file))]
    inputs.documents += objects


def parse_yaml(source: str, text: str) -> list[Document]:
    """Every document of a YAML stream with the line it starts on (as yaml.safe_load_all reads them)."""
    loader = yaml.SafeLoader(text)
    docs: list[Document] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                break
            docs.append(Document(source, node.start_mark.line + 1, loader.construct_document(node), node))
    finally:
        loader.dispose()
    return docs


def _why_empty(text: str, *, json_file: bool) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "the file is empty"
    if json_file:
        return "the file holds only null"
    if all(line.startswith("#") for line in lines):
        return "the file holds only comments"
    return "the file holds only empty documents ('---' separators, comments, nulls)"


def _item_nodes(node: yaml.Node | None, count: int) -> list[yaml.Node | None]:
    """The YAML nodes of a List's `items` (for their lines), or Nones (JSON)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if getattr(key_node, "value", None) == "items" and isinstance(value_node, yaml.SequenceNode) and \
                    len(value_node.value) == count:
                return list(value_node.value)
    return [None] * count


def duplicate_keys(node: yaml.Node | None, path: str = "") -> Iterator[FieldError]:
    """Keys given twice in one mapping: YAML loaders keep the last silently; kubectl and kube-apiserver refuse."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str) or key == "<<":
                continue
            line = key_node.start_mark.line + 1
            if key in seen:
                yield FieldError(f"{path}.{key}" if path else key,
                                 f"duplicate field (lines {seen[key]} and {line}): only the last would be read")
            seen.setdefault(key, line)
            yield from duplicate_keys(value_node, f"{path}.{key}" if path else key)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from duplicate_keys(item, f"{path}[{i}]")


# ------------------------------------------------------------------------------------------------- reporting


@dataclass(slots=True)
class Report:
    """What was found about one object. `checked_against` is empty when nothing could check it."""

    where: str
    what: str
    errors: list[FieldError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    checked_against: str = ""
    summary: list[str] = field(default_factory=list)
    empty_file: bool = False

    def print(self, out: TextIO, *, quiet: bool) -> None:
        head = f"{self.where}: {self.what}" if self.what else self.where
        if not self.what and len(self.errors) == 1 and not self.errors[0].path:  # about the file or document
            print(f"{self.where}: {self.errors[0].message}", file=out)
        elif self.errors:
            print(f"{head} is invalid:", file=out)
            for error in self.errors:
                print(f"  {error.path}: {error.message}" if error.path else f"  {error.message}", file=out)
        elif self.checked_against and not quiet:
            print(f"{head} is valid ({self.checked_against})", file=out)
            for line in self.summary:
                print(f"  {line}", file=out)
        for warning in self.warnings:
            print(f"{head}: warning: {warning}", file=out)


def did_you_mean(word: str, choices: Sequence[str]) -> list[str]:
    """Near misses of `word` among `choices`: the same but for case, else names it begins, else difflib's."""
    folded: dict[str, str] = {}
    for choice in choices:
        folded.setdefault(choice.casefold(), choice)
    key = word.casefold()
    if key in folded:
        return [folded[key]]
    if len(key) >= 3:
        starting = sorted((c for f, c in folded.items() if f.startswith(key)), key=len)
        if starting:
            return starting[:3]
    # Only the best of the close ones: "Deploymnet" is "Deployment" (0.9), not also "DaemonSet" (0.63).
    scored = sorted(((difflib.SequenceMatcher(None, key, f).ratio(), f) for f in folded), reverse=True)
    return [folded[f] for ratio, f in scored[:3] if ratio >= max(0.6, scored[0][0] - 0.1)]


def hint(word: str, choices: Sequence[str]) -> str:
    """` (did you mean "X"?)`, or "" without a near miss."""
    return _did_you_mean_text(did_you_mean(word, choices))


def _did_you_mean_text(found: Sequence[str]) -> str:
    return f" (did you mean {' or '.join(json.dumps(c) for c in found)}?)" if found else ""


# ------------------------------------------------------------------------------------------------ API types


@dataclass(frozen=True, slots=True)
class ObjectType:
    """What an object is: a built-in kind of Kubernetes 1.37, an InferenceService, or a CRD's kind."""

    group: str
    version: str
    kind: str
    namespaced: bool
    crd: Any = None  # infer_ctl.kube.crd.Crd for custom resources

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


@cache
def builtin_kinds() -> Mapping[str, Mapping[str, tuple[str, ...]]]:
    """{group: {kind: versions}} of Kubernetes 1.37, from the schemas' x-kubernetes-group-version-kind (empty
    without the 'validate' extra)."""
    from infer_ctl.cli.extras import missing

    if missing("validate"):
        return {}
    from infer_ctl.sandbox.validation import builtin_group_version_kinds

    table: dict[str, dict[str, list[str]]] = {}
    for group, version, kind in builtin_group_version_kinds():
        table.setdefault(group, {}).setdefault(kind, []).append(version)
    return {g: {k: tuple(sorted(v, key=version_priority)) for k, v in kinds.items()} for g, kinds in table.items()}


def version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' order of API versions, the preferred first: v2 < v1 < v1beta2 < v1beta1 < v1alpha1 (sorted
    ascending by this key)."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not match:
        return (3, 0, 0)
    stability = {None: 0, "beta": 1, "alpha": 2}[match.group(2)]
    return (stability, -int(match.group(1)), -int(match.group(3) or 0))


def custom_resource_definitions(documents: Sequence[Document]) -> dict[tuple[str, str], Any]:
    """{(group, kind or listKind): Crd} of the CustomResourceDefinitions among the inputs and of InferenceService
    (always the CRD this infer-ctl ships)."""
    from infer_ctl.kube.crd import parse_crd
    from infer_ctl.kube.inferenceservice import load_crd

    crds: dict[tuple[str, str], Any] = {}
    for doc in documents:
        body = doc.body
        if isinstance(body, dict) and body.get("apiVersion") == "apiextensions.k8s.io/v1" and \
                body.get("kind") == "CustomResourceDefinition":
            try:
                crd = parse_crd(body)
            except (KeyError, TypeError, AttributeError):
                continue  # a broken CRD: its own check (the CustomResourceDefinition schema) says why
            crds[(crd.group, crd.kind)] = crd
            crds[(crd.group, crd.list_kind)] = crd
    ours = load_crd()
    crds[(ours.group, ours.kind)] = ours
    crds[(ours.group, ours.list_kind)] = ours
    return crds


# --------------------------------------------------------------------------------------------------- checking


@dataclass(slots=True)
class Checker:
    """Checks documents; knows the API groups of Kubernetes 1.37, infer-ctl's and those of the CRDs among the
    inputs ({group: {kind: served versions, preferred first}})."""

    policies: Any
    crds: dict[tuple[str, str], Any]
    groups: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    _schemas: Any = None

    def __post_init__(self) -> None:
        self.groups = {g: dict(kinds) for g, kinds in builtin_kinds().items()}
        self.groups[SANDBOX_GROUP] = {SANDBOX_KIND: (SANDBOX_VERSION,)}
        for (group, kind), crd in self.crds.items():
            served = tuple(sorted((v.name for v in crd.versions if v.served), key=version_priority))
            if served:
                self.groups.setdefault(group, {})[kind] = served

    def check(self, doc: Document) -> list[Report]:
        if doc.empty_file:  # an error of the file: kubectl apply refuses it ("no objects passed to apply")
            return [Report(doc.source, "", [FieldError("", f"no Kubernetes objects: {doc.empty_file}")],
                           empty_file=True)]
        body = doc.body
        if Path(doc.source).name in POLICY_FILES and isinstance(body, dict) and "kind" not in body \
                and "version" in body:
            return [self._check_policy_file(doc)]
        if not isinstance(body, dict):
            return [Report(doc.where, "", [FieldError("", "not a Kubernetes object (a mapping with apiVersion and "
                                                          "kind)")])]
        if (body.get("apiVersion") == "v1" and body.get("kind") == "List") or self._is_crd_list(body):
            return self._check_list(doc)
        return [self._check_object(doc.where, body, "", doc.node)]

    def _is_crd_list(self, body: Mapping[str, Any]) -> bool:
        group = str(body.get("apiVersion", "")).rpartition("/")[0]
        crd = self.crds.get((group, str(body.get("kind"))))
        return crd is not None and crd.list_kind == body.get("kind")

    def _check_list(self, doc: Document) -> list[Report]:
        """A `kind: List` (what `kubectl get -o yaml` prints): each item is an object of its own."""
        items = doc.body.get("items")
        if not isinstance(items, list):
            return [Report(doc.where, f"{doc.body.get('kind')}", [FieldError("items", "Required value: a list")])]
        nodes = _item_nodes(doc.node, len(items))
        reports = []
        for i, (item, node) in enumerate(zip(items, nodes, strict=True)):
            where = f"{doc.source}:{node.start_mark.line + 1}" if node is not None else doc.where
            if isinstance(item, dict):
                reports.append(self._check_object(where, item, f"items[{i}]: ", node))
            else:
                reports.append(Report(where, f"items[{i}]", [FieldError("", "not a Kubernetes object")]))
        return reports

    def _check_object(self, where: str, body: dict[str, Any], prefix: str, node: yaml.Node | None) -> Report:
        kind = body.get("kind")
        api_version = body.get("apiVersion")
        report = Report(where, prefix + describe(body, None))
        if not isinstance(kind, str) or not kind or not isinstance(api_version, str) or not api_version:
            report.errors += [FieldError(name, "Required value: every Kubernetes object has one")
                              for name, value in (("apiVersion", api_version), ("kind", kind))
                              if not isinstance(value, str) or not value]
            return report
        obj_type, type_errors, warning = self.resolve(api_version, kind)
        report.errors += [*type_errors, *duplicate_keys(node)]
        if obj_type is None:
            if warning:
                report.warnings.append(warning)
            return report
        report.what = prefix + describe(body, obj_type)
        if type_errors:  # checked as the type it most likely means, to show every other problem at once
            body = {**body, "apiVersion": obj_type.api_version, "kind": obj_type.kind}
        meta = body.get("metadata")
        if not obj_type.namespaced and isinstance(meta, dict) and meta.get("namespace"):
            report.warnings.append(f"metadata.namespace is ignored: {obj_type.kind} is cluster-scoped")
        if obj_type.crd is not None and obj_type.group == _our_group() and obj_type.kind == obj_type.crd.kind:
            self._check_inference_service(body, report)
        elif obj_type.group == SANDBOX_GROUP:
            self._check_sandbox_cluster(body, report)
        elif obj_type.crd is not None:
            self._check_custom(body, obj_type, report)
        else:
            self._check_builtin(body, report)
        return report

    def resolve(self, api_version: str, kind: str) -> tuple[ObjectType | None, list[FieldError], str]:
        """The type of an object: (type, errors, warning). A near miss in a known group is an error, and the type
        it most likely means is returned to check the rest; an unknown group is a warning."""
        group, _, version = api_version.rpartition("/")
        kinds = self.groups.get(group)
        if kinds is None:
            return self._resolve_unknown_group(group, version, kind)
        group_name = f"API group {group!r}" if group else "the core API group ('v1')"
        if kind not in kinds:
            return self._resolve_unknown_kind(group, version, kind, group_name)
        served = kinds[kind]
        if version not in served:
            choices = [f"{group}/{v}" if group else v for v in served]
            error = FieldError("apiVersion", f"{json.dumps(api_version)} does not serve {kind}: "
                                             f"{' and '.join(choices)} {'does' if len(choices) == 1 else 'do'}"
                                             f"{hint(api_version, choices)}")
            return self._type(group, served[0], kind), [error], ""
        return self._type(group, version, kind), [], ""

    def _resolve_unknown_kind(self, group: str, version: str, kind: str,
                              group_name: str) -> tuple[ObjectType | None, list[FieldError], str]:
        elsewhere = [g for g, kinds in self.groups.items() if kind in kinds]
        if elsewhere:  # `v1 Deployment`: the kind of another group
            target = elsewhere[0]
            served = self.groups[target][kind]
            target_version = version if version in served else served[0]
            suggestion = f"{target}/{target_version}" if target else target_version
            return self._type(target, target_version, kind), [FieldError(
                "apiVersion", f"{kind} is not in {group_name}{hint(suggestion, [suggestion])}")], ""
        kinds = self.groups[group]
        near = did_you_mean(kind, [k for k in kinds if not k.endswith("List")])
        error = FieldError("kind", f"{json.dumps(kind)} is not a kind of {group_name}{_did_you_mean_text(near)}")
        if len(near) == 1:
            served = kinds[near[0]]
            return self._type(group, version if version in served else served[0], near[0]), [error], ""
        return None, [error], ""

    def _resolve_unknown_group(self, group: str, version: str,
                               kind: str) -> tuple[ObjectType | None, list[FieldError], str]:
        groups = self.groups
        near = [g for g in difflib.get_close_matches(group, list(groups), n=3, cutoff=0.75) if kind in groups[g]]
        if near:
            target = near[0]
            versions = groups[target][kind]
            suggestion = f"{target}/{version if version in versions else versions[0]}"
            error = FieldError("apiVersion", f"unknown API group {group!r}{hint(suggestion, [suggestion])}")
            return self._type(target, suggestion.rpartition("/")[2], kind), [error], ""
        api_version = f"{group}/{version}" if group else version
        if group == KUSTOMIZE_GROUP:
            return None, [], f"not checked: a kustomize file ({api_version}), read by kustomize, not an API server"
        if not builtin_kinds():
            return None, [], (f"not checked: the Kubernetes {KUBERNETES_VERSION} schemas come with infer-ctl's "
                              "'validate' extra (pip install 'infer-ctl[validate]')")
        return None, [], (f"not checked: {api_version} is neither an API of Kubernetes {KUBERNETES_VERSION} nor "
                          "infer-ctl's, and no CustomResourceDefinition among the inputs defines "
                          f"{kind}")

    def _type(self, group: str, version: str, kind: str) -> ObjectType:
        crd = self.crds.get((group, kind))
        if crd is not None:
            return ObjectType(group, version, kind, crd.namespaced, crd)
        return ObjectType(group, version, kind, (group, kind) not in CLUSTER_SCOPED and group != SANDBOX_GROUP)

    def _check_inference_service(self, body: dict[str, Any], report: Report) -> None:
        from infer_ctl.kube.inferenceservice import check_inference_service

        result = check_inference_service(body, self.policies.catalog, runtimes=self.policies.runtimes)
        report.errors += [with_hint(e, body, self.policies.catalog) for e in result.errors]
        report.checked_against = "CRD, CEL rules, parser, catalog and runtime profiles"
        if result.ok:
            assert result.service is not None
            report.summary = explain_service(result.service, self.policies)

    def _check_custom(self, body: dict[str, Any], obj_type: ObjectType, report: Report) -> None:
        from infer_ctl.kube.crd import apply_defaults, validate
        from infer_ctl.sandbox.validation import validate_metadata

        version = obj_type.crd.version(obj_type.version)
        errors = validate_metadata(body) + validate(version.schema, apply_defaults(version.schema, body))
        report.errors += [with_hint(e, body, None) for e in errors]
        report.checked_against = f"CustomResourceDefinition {obj_type.crd.name} among the inputs"

    def _check_builtin(self, body: dict[str, Any], report: Report) -> None:
        if self._schemas is None:
            from infer_ctl.sandbox.validation import SchemaValidator

            self._schemas = SchemaValidator(check_quantities=True, check_enums=True)
        errors, _ = self._schemas.validate(copy.deepcopy(body), field_validation="Strict")
        report.errors += [with_hint(e, body, None) for e in errors]
        report.checked_against = f"Kubernetes {KUBERNETES_VERSION} schema"

    def _check_sandbox_cluster(self, body: dict[str, Any], report: Report) -> None:
        from infer_ctl.config.cluster import parse_cluster
        from infer_ctl.core.errors import SpecError

        try:
            parse_cluster(body, self.policies.catalog)
        except SpecError as exc:
            report.errors += [with_hint(e, body, self.policies.catalog) for e in exc.errors]
        report.checked_against = "as infer-ctl sandbox up reads it"

    def _check_policy_file(self, doc: Document) -> Report:
        from infer_ctl.core.errors import SpecError
        from infer_ctl.core.policy import parse_catalog, parse_placement_policy, parse_scaling_policy
        from infer_ctl.core.runtime import parse_runtime_profiles

        name = Path(doc.source).name
        parsers: dict[str, Callable[[Mapping[str, Any], str], object]] = {
            "accelerators.yaml": parse_catalog, "scaling.yaml": parse_scaling_policy,
            "placement.yaml": parse_placement_policy, "runtimes.yaml": parse_runtime_profiles}
        report = Report(doc.where, f"infer-ctl policy file {name}", checked_against="as the controller reads it")
        try:
            parsers[name](doc.body, name)
        except SpecError as exc:
            report.errors += exc.errors or [FieldError("", str(exc))]
        return report


def _our_group() -> str:
    from infer_ctl.core import api

    return api.GROUP


def describe(body: Mapping[str, Any], obj_type: ObjectType | None) -> str:
    """`Deployment default/web` (the kind as written); a cluster-scoped object without a namespace (`Namespace
    infer-ctl-system`); an object of an unknown type with its namespace only when it names one."""
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    assert isinstance(meta, dict)
    name = meta.get("name") or (f"{meta['generateName']}*" if meta.get("generateName") else "<unnamed>")
    kind = body.get("kind") or "<no kind>"
    if obj_type is not None and obj_type.namespaced:
        return f"{kind} {meta.get('namespace') or 'default'}/{name}"
    if obj_type is None and meta.get("namespace"):
        return f"{kind} {meta['namespace']}/{name}"
    return f"{kind} {name}"


_SUPPORTED = re.compile(r"supported values: (.*)$")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def value_at(body: Any, path: str) -> Any:
    """The value at a field path such as `spec.accelerator.products[0]` (None when there is none)."""
    value = body
    for key, index in _PATH_PART.findall(path):
        if key and isinstance(value, Mapping):
            value = value.get(key)
        elif index and isinstance(value, list) and int(index) < len(value):
            value = value[int(index)]
        else:
            return None
    return value


def with_hint(error: FieldError, body: Mapping[str, Any], catalog: Any) -> FieldError:
    """The error with "did you mean" added for an unsupported enumerated value or an unknown product."""
    value = value_at(body, error.path)
    if not isinstance(value, str) or "did you mean" in error.message:
        return error
    suffix = _did_you_mean_text(_near_misses(error, value, catalog))
    return FieldError(error.path, error.message + suffix, error.kind) if suffix else error


def _near_misses(error: FieldError, value: str, catalog: Any) -> list[str]:
    """The allowed values come from the message, whose form is kube-apiserver's for every FieldValueNotSupported
    (`Unsupported value: "x": supported values: "a", "b"`), whichever checker wrote it; products from the
    catalog, where a DRA productName ("NVIDIA H100 80GB HBM3") means its entry."""
    supported = _SUPPORTED.search(error.message)
    if error.kind == "FieldValueNotSupported" and supported:
        listed = supported.group(1)
        return did_you_mean(value, _QUOTED.findall(listed) or [v.strip() for v in listed.split(",")])
    if catalog is not None and "unknown product" in error.message:
        entry = catalog.by_product_name(value)
        return [entry.name] if entry is not None else did_you_mean(value, catalog.names)
    return []


# ------------------------------------------------------------------------------------------- the summary


def explain_service(svc: Any, policies: Any) -> list[str]:
    """What an InferenceService asks for, in a few lines a platform engineer can check at a glance."""
    from infer_ctl.core import api
    from infer_ctl.core.checks import memory_per_device_bytes, product_fits
    from infer_ctl.core.duration import format_duration
    from infer_ctl.core.policy import effective_scaling
    from infer_ctl.core.quantity import format_bytes

    spec: api.InferenceServiceSpec = svc.spec
    model, acc, scaling = spec.model, spec.accelerator, spec.scaling
    if model.memory_source == "derived":
        params = f"{model.parameters / 1e9:g}B" if model.parameters else "?"
        kv = f" + {format_bytes(model.kv_cache_bytes)} KV cache" if model.kv_cache_bytes else ""
        how = f"derived: {params} x {model.dtype.value} x {1 + model.overhead_percent / 100:.2f}{kv}"
    else:
        how = "given"
    per_gpu = ""
    if acc.count > 1:
        per_gpu = f", {format_bytes(memory_per_device_bytes(spec))} on each of {acc.count} GPUs"
    lines = [f"model      {model.name}: {format_bytes(model.memory_bytes)} per replica ({how}){per_gpu}"]
    fits = product_fits(spec, policies.catalog)
    allowed = " > ".join(acc.products) if acc.products else "any product that fits"
    cc = f", compute capability >= {acc.min_compute_capability[0]}.{acc.min_compute_capability[1]}" \
        if acc.min_compute_capability else ""
    lines.append(f"devices    {acc.sharing.value} on {allowed} (class {acc.device_class_name}{cc})")
    for fit in fits:
        mark = "fits" if fit.fits else "no  "
        lines.append(f"  {mark}     {fit.accelerator.name:<11} {fit.why}")
    eff = effective_scaling(scaling, policies.scaling, spec.slo.attainment)
    capacity = scaling.max_replicas * scaling.target_rps_per_replica
    lines.append(f"scaling    {scaling.min_replicas}..{scaling.max_replicas} replicas at "
                 f"{scaling.target_rps_per_replica:g} req/s each (up to {capacity:g} req/s); preset "
                 f"{scaling.preset.value}: quantile {eff.quantile:g}, standby {eff.standby_replicas}, "
                 f"scale down after {format_duration(eff.scale_down_stabilization_s)} of lower load")
    if scaling.forecast.enabled:
        forecast = f"{scaling.forecast.method.value} (seasonality {scaling.forecast.seasonality.value})"
    else:
        forecast = "off (reactive only)"
    lead = format_duration(scaling.prewarm.lead_s) if scaling.prewarm.lead_s is not None else \
        "auto (measured cold start p90 + one control period)"
    hint_ = f", cold start hint {format_duration(spec.runtime.cold_start_s)}" if spec.runtime.cold_start_s else ""
    lines.append(f"forecast   {forecast}; prewarm lead {lead}{hint_}")
    if scaling.scale_to_zero.enabled:
        keep_alive_s = scaling.scale_to_zero.keep_alive_s
        keep = f"{format_duration(keep_alive_s)} idle" if keep_alive_s is not None else \
            "an idle time learned from the service's idle-time histogram"
        lines.append(f"zero       scales to zero after {keep}; wakes on the first request")
    if spec.replicas is not None:
        lines.append(f"paused     autoscaling paused: spec.replicas pins {spec.replicas} serving replicas")
    objectives = []
    if spec.slo.latency_p95_ms is not None:
        e2e = latency_histogram(spec, policies.scaling, policies.runtimes)
        read = f"read off {histogram_metric(e2e)}" if e2e else "not measured: no latency histogram"
        objectives.append(f"end to end <= {spec.slo.latency_p95_ms:g} ms ({read})")
    for token in token_objectives(spec, policies.runtimes):
        what = "first token" if token.failed else "between tokens"
        read = f"read off {token.bucket_metric}" if token.histogram else \
            "not measured: the engine's profile names no histogram"
        objectives.append(f"{what} <= {token.latency_ms:g} ms ({read})")
    if objectives:
        lines.append(f"slo        {'; '.join(objectives)}")
    if eff.attainment is not None:
        own = "" if spec.slo.attainment is not None else f" (preset {scaling.preset.value})"
        lines.append(f"objective  {eff.attainment:.2%} of requests within the SLO{own}: aims for quantile "
                     f"{eff.quantile:g}, scale-down stabilization {format_duration(eff.scale_down_stabilization_s)}")
    return lines
