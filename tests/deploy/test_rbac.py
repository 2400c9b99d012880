"""deploy/'s RBAC is the controller's access table (infer_ctl/controller/access.py), both ways, in the kustomize
overlays and the Helm chart (namespaced and cluster-wide): reads cluster-wide, writes only through RoleBindings in
the namespaces the controller manages, none in kube-system, and the controller is told to manage exactly those.
(tests/realcluster/test_deploy.py runs the controller under these rules on kube-apiserver and checks every request
it made against the table.)"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import yaml

from infer_ctl.cli.controller import namespaces
from infer_ctl.controller import access
from infer_ctl.controller.access import Scope
from tests.deploy.test_manifests import KUSTOMIZE, bin_dir, container, helm_template, kustomize, run

READ_VERBS = {"get", "list", "watch"}
REPORTER = "infer-ctl-node-cache-reporter"


def granted(rules: Iterable[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(group, resource, verb, resourceName or '*') of every rule."""
    return {(g, r, v, n) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"] for n in rule.get("resourceNames") or ["*"]}


def table(scope: Scope, peering: str) -> set[tuple[str, str, str, str]]:
    return granted(access.rules(scope, peering))


def role(docs: tuple[dict[str, Any], ...], name: str, kind: str = "ClusterRole") -> list[dict[str, Any]]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return list(found["rules"])


def bindings(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]


INSTALLS = {
    "kustomize-production": lambda: kustomize("production"),
    "kustomize-local": lambda: kustomize("local"),
    "helm": helm_template,
    "helm-namespaces": lambda: helm_template("watchNamespaces={team-a,team-b}"),
    "helm-cluster-wide": lambda: helm_template("clusterWide=true"),
}


@pytest.mark.parametrize("install", list(INSTALLS))
def test_the_cluster_roles_grant_exactly_the_access_table(install: str) -> None:
    docs = INSTALLS[install]()
    assert granted(role(docs, "infer-ctl")) == table(Scope.CLUSTER, "infer-ctl")
    assert granted(role(docs, "infer-ctl-manager")) == table(Scope.MANAGED, "infer-ctl")
    assert granted(role(docs, "infer-ctl-node-caches", "Role")) == table(Scope.OWN, "infer-ctl")


@pytest.mark.parametrize("install", list(INSTALLS))
def test_the_controller_reads_the_node_cache_records_in_its_own_namespace_only(install: str) -> None:
    docs = INSTALLS[install]()
    [controller_role] = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "infer-ctl-node-caches"]
    [binding] = [b for b in bindings(docs) if b["roleRef"]["name"] == "infer-ctl-node-caches"]
    assert controller_role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "infer-ctl-system"
    assert binding["kind"] == "RoleBinding" and binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "infer-ctl", "namespace": "infer-ctl-system"}]
    env = {e["name"]: e for e in container(docs).get("env") or ()}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


@pytest.mark.parametrize("install", list(INSTALLS))
def test_the_node_cache_reporter_writes_only_its_records_in_the_controllers_namespace(install: str) -> None:
    """The DaemonSet's own ServiceAccount: ConfigMaps (get, create, patch) by a Role in infer-ctl-system, and a
    cluster-wide read of Nodes (the owner reference's uid); the cache mounted read-only; restricted's fields."""
    docs = INSTALLS[install]()
    name = "infer-ctl-node-cache-reporter"
    assert granted(role(docs, name, "Role")) == {("", "configmaps", v, "*") for v in ("get", "create", "patch")}
    assert granted(role(docs, name)) == {("", "nodes", "get", "*")}
    subjects = [{"kind": "ServiceAccount", "name": name, "namespace": "infer-ctl-system"}]
    assert {(b["kind"], b["metadata"].get("namespace")) for b in bindings(docs) if b["subjects"] == subjects} == {
        ("RoleBinding", "infer-ctl-system"), ("ClusterRoleBinding", None)}
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name and daemonset["metadata"]["namespace"] == "infer-ctl-system"
    [reporter] = pod["containers"]
    assert reporter["args"][:3] == ["node-cache-reporter", "--dir", "/var/lib/infer-ctl/models"]
    assert {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in reporter["env"]} == {
        "NODE_NAME": "spec.nodeName", "POD_NAMESPACE": "metadata.namespace"}
    [mount] = reporter["volumeMounts"]
    [volume] = pod["volumes"]
    assert mount["readOnly"] is True and volume["hostPath"]["path"] == mount["mountPath"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert reporter["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                           "capabilities": {"drop": ["ALL"]}}


@pytest.mark.parametrize("install", list(INSTALLS))
def test_only_reads_and_the_own_peering_heartbeat_are_cluster_wide(install: str) -> None:
    docs = INSTALLS[install]()
    for group, resource, verb, name in granted(role(docs, "infer-ctl")) | granted(role(docs, REPORTER)):
        assert verb in READ_VERBS or (resource == "clusterkopfpeerings" and verb == "patch" and name == "infer-ctl"), \
            (group, resource, verb, name)
    cluster_wide = {b["roleRef"]["name"] for b in bindings(docs) if b["kind"] == "ClusterRoleBinding"}
    assert cluster_wide == ({"infer-ctl", "infer-ctl-manager", REPORTER} if install == "helm-cluster-wide"
                            else {"infer-ctl", REPORTER})


@pytest.mark.parametrize("install", [i for i in INSTALLS if i != "helm-cluster-wide"])
def test_writes_are_bound_in_the_managed_namespaces_only_and_the_controller_manages_exactly_those(
        install: str) -> None:
    docs = INSTALLS[install]()
    c = container(docs)
    args = c["args"]
    if "$(WATCH_NAMESPACES)" in args:  # kustomize: the value comes from the ConfigMap infer-ctl-config
        (config,) = [d for d in docs
                     if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("infer-ctl-config")]
        args = [a.replace("$(WATCH_NAMESPACES)", config["data"]["WATCH_NAMESPACES"]) for a in args]
    flags = " ".join(args).replace("=", " ").split(" ")
    managed = namespaces([flags[i + 1] for i, a in enumerate(flags) if a == "--namespace"])
    role_bindings = [b for b in bindings(docs) if b["kind"] == "RoleBinding"
                     and b["roleRef"]["name"] == "infer-ctl-manager"]
    assert {b["metadata"]["namespace"] for b in role_bindings} == set(managed) and managed
    assert "kube-system" not in managed
    for binding in role_bindings:
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                      "name": "infer-ctl-manager"}
        (account,) = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "infer-ctl"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                        "namespace": account["metadata"]["namespace"]}]
    expected = {"helm-namespaces": ("team-a", "team-b")}.get(install, ("default",))
    assert managed == expected


def test_the_chart_refuses_to_manage_nothing_and_cluster_wide_drops_the_namespace_flags() -> None:
    with pytest.raises(AssertionError, match="watchNamespaces is empty"):
        helm_template("watchNamespaces=null")
    assert not any(a.startswith("--namespace") for a in container(helm_template("clusterWide=true"))["args"])


def test_every_managed_write_of_the_table_has_a_reason_and_no_grant_is_a_wildcard() -> None:
    for entry in access.ACCESS:
        assert entry.why and "*" not in entry.verbs and entry.resource != "*" and entry.group != "*"
    # the table's own lookup agrees with its rules
    assert access.allowed("", "pods", "create", managed=True)
    assert not access.allowed("", "pods", "create", managed=False)
    assert access.allowed("kopf.dev", "clusterkopfpeerings", "patch", managed=False, name="infer-ctl")
    assert not access.allowed("kopf.dev", "clusterkopfpeerings", "patch", managed=False, name="other")
    assert not access.allowed("scheduling.k8s.io", "priorityclasses", "list", managed=False)


@pytest.mark.parametrize(("given", "expected"), [
    (["a"], ("a",)), (["a,b", "c"], ("a", "b", "c")), (["a, b,", "a"], ("a", "b")), ([], ()),
])
def test_namespace_flags_may_be_repeated_or_comma_separated(given: list[str], expected: tuple[str, ...]) -> None:
    assert namespaces(given) == expected


def model_cache_volumes_kustomize() -> tuple[dict[str, Any], ...]:
    out = run(str(bin_dir() / "kubectl"), "kustomize", str(KUSTOMIZE / "model-cache-volumes"))
    return tuple(d for d in yaml.safe_load_all(out) if d)


@pytest.mark.parametrize("install", ["helm", "kustomize"])
def test_the_model_cache_volumes_role_is_opt_in_and_grants_exactly_its_table(install: str) -> None:
    """The local PersistentVolumes of modelCacheVolume: persistentVolume are cluster-scoped writes: granted by a
    ClusterRole of their own, bound cluster-wide only when the install asks (Helm's modelCacheVolumes, kustomize's
    model-cache-volumes folder), never by the default install."""
    name = "infer-ctl-model-cache-volumes"
    default = helm_template() if install == "helm" else kustomize("production")
    assert not [d for d in default if d["metadata"]["name"] == name]
    docs = helm_template("modelCacheVolumes=true") if install == "helm" else model_cache_volumes_kustomize()
    assert granted(role(docs, name)) == table(Scope.MODEL_CACHE_VOLUMES, "infer-ctl")
    [binding] = [b for b in bindings(docs) if b["roleRef"]["name"] == name]
    assert binding["kind"] == "ClusterRoleBinding"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "infer-ctl", "namespace": "infer-ctl-system"}]
