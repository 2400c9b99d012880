"""Kueue's manager (sigs.k8s.io/kueue, built by scripts/kube-binaries.sh) as a process against a LocalCluster.

`with LocalKueue(cluster) as kueue:` installs Kueue into the cluster and runs `bin/kueue` on 127.0.0.1; leaving
the block stops it and uninstalls everything it installed, so a shared (session) cluster is left as it was:

- **CRDs** from the Kueue module version that was built (`kueue/crd/*.yaml` next to the cache's `bin/`, copied
  there by the build script from the Go module cache), with the conversion webhooks that Kueue's kustomize
  patches add (`config/components/crd/patches/webhook_in_*.yaml`: localqueues, clusterqueues, cohorts, workloads,
  multikueueclusters), pointed at the manager by URL.
- **Webhooks**: Kueue's own `config/components/webhook/manifests.yaml`, renamed as its kustomize prefix does
  (`kueue-mutating-webhook-configuration`, `kueue-validating-webhook-configuration`), each
  `clientConfig.service` replaced by `clientConfig.url` = https://127.0.0.1:PORT/<same path>. The API server
  cannot reach a Service here (no kube-proxy, and EndpointSlices refuse loopback addresses).
- **Certificates**: Kueue's internal certificate management stays on (its default). It keeps its CA and serving
  certificate in the Secret `kueue-webhook-server-cert` and expects kubelet to mount that Secret into the
  webhook's certDir; with internal management off, Kueue instead insists on a metrics certificate at the fixed
  path /etc/kueue/metrics/certs (cmd/kueue/main.go), which a process on a shared machine should not need. So the
  Secret is seeded with a CA and a serving certificate made here with `openssl` (SANs: the Service DNS name,
  which Kueue's cert rotator checks, and IP:127.0.0.1, which the API server checks) and the same files are
  written into certDir (what kubelet's Secret volume would do). The rotator finds them valid, keeps them, and
  injects the CA into the webhook configurations and CRDs itself. `start()` checks that it did not replace them.
- **Feature gates**: `VisibilityOnDemand=false`: the visibility API server (an aggregated API) would write a
  self-signed certificate to /visibility and cannot be reached by the API server anyway.
- **Scope**: webhooks for other API groups than kueue.x-k8s.io (Pods, Jobs, Deployments, ...) only see
  namespaces labelled `WEBHOOK_NAMESPACE_LABEL` unless `webhook_namespace_selector` says otherwise (None: Kueue's
  own selectors), so that Pods other tests create in the same cluster do not go through Kueue. The manager runs
  with the cluster's admin kubeconfig (not Kueue's RBAC).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import copy
import json
import logging
import os
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infer_ctl.sandbox.localcluster import (
    PORT_ATTEMPTS,
    LocalCluster,
    LocalClusterError,
    die_with_parent,
    kube_binaries,
)
from infer_ctl.sandbox.ports import free_port

log = logging.getLogger(__name__)

NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"  # Kueue's defaults (apis/config/v1beta2/defaults.go)
WEBHOOK_SECRET = "kueue-webhook-server-cert"
WEBHOOK_CONFIGS = {"MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
                   "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration"}
CONVERSION_CRDS = ("localqueues.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io", "cohorts.kueue.x-k8s.io",
                   "workloads.kueue.x-k8s.io", "multikueueclusters.kueue.x-k8s.io")
FEATURE_GATES = "VisibilityOnDemand=false"
WEBHOOK_NAMESPACE_LABEL = "infer-ctl.io/kueue-webhooks"
DEFAULT_WEBHOOK_SELECTOR: Mapping[str, Any] = {"matchLabels": {WEBHOOK_NAMESPACE_LABEL: "enabled"}}


class LocalKueueError(LocalClusterError):
    """Kueue could not be built, installed or started; the message says which step and shows its log."""


def kueue_assets(bin_dir: Path | None = None) -> tuple[Path, Path]:
    """(the kueue binary, the directory with Kueue's `crd/` and `webhook/`), built on first use."""
    bin_dir = bin_dir or kube_binaries()
    binary, assets = bin_dir / "kueue", bin_dir.parent / "kueue"
    if not binary.is_file() or not (assets / "crd").is_dir() or not (assets / "webhook" / "manifests.yaml").is_file():
        raise LocalKueueError(f"{bin_dir} has no kueue binary or {assets} no Kueue CRDs/webhook manifests: they are "
                              "built by scripts/kube-binaries.sh (kubebin/kueue); run it from a checkout, or point "
                              "INFER_CTL_KUBE_BIN at a directory built by it")
    return binary, assets


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LocalKueueError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def make_certificates(directory: Path, namespace: str = NAMESPACE) -> dict[str, bytes]:
    """A CA (CN and DNS SAN `kueue-ca`, as Kueue's rotator checks it; PKCS#1 key, as it parses it) and a serving
    certificate for the webhook Service's DNS name and 127.0.0.1. Keys as in Kueue's Secret."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_ext = directory / "ca.ext"
    ca_ext.write_text("[req]\ndistinguished_name=dn\nprompt=no\n[dn]\nO=kueue\nCN=kueue-ca\n"
                      "[ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,digitalSignature\n"
                      "subjectAltName=DNS:kueue-ca\nsubjectKeyIdentifier=hash\n")
    server_ext = directory / "server.ext"
    server_ext.write_text(f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                          f"extendedKeyUsage=serverAuth\n"
                          f"subjectAltName=DNS:{WEBHOOK_SERVICE}.{namespace}.svc,IP:127.0.0.1\n")
    d = str(directory)
    _openssl("genrsa", "-traditional", "-out", f"{d}/ca.key", "2048")
    _openssl("req", "-x509", "-new", "-key", f"{d}/ca.key", "-sha256", "-days", "3650", "-config", str(ca_ext),
             "-extensions", "ca", "-out", f"{d}/ca.crt")
    _openssl("genrsa", "-traditional", "-out", f"{d}/tls.key", "2048")
    _openssl("req", "-new", "-key", f"{d}/tls.key", "-subj", f"/CN={WEBHOOK_SERVICE}.{namespace}.svc",
             "-out", f"{d}/tls.csr")
    _openssl("x509", "-req", "-in", f"{d}/tls.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
             "-CAcreateserial", "-days", "730", "-sha256", "-extfile", str(server_ext), "-out", f"{d}/tls.crt")
    return {name: (directory / name).read_bytes() for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}


def webhook_configurations(manifests: str, base_url: str, ca_bundle: bytes,
                           namespace_selector: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Kueue's webhook configurations with URL client configs (see the module docstring)."""
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        doc["metadata"]["name"] = WEBHOOK_CONFIGS[doc["kind"]]
        for hook in doc.get("webhooks") or ():
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url + path, "caBundle": base64.b64encode(ca_bundle).decode()}
            groups = {g for rule in hook.get("rules") or () for g in rule.get("apiGroups") or ()}
            if groups - {"kueue.x-k8s.io"}:
                if namespace_selector is not None:
                    hook["namespaceSelector"] = copy.deepcopy(dict(namespace_selector))
                elif hook["name"] in {"mpod.kb.io", "mdeployment.kb.io", "mstatefulset.kb.io", "vpod.kb.io",
                                      "vdeployment.kb.io", "vstatefulset.kb.io"}:  # Kueue's webhook kustomization
                    hook["namespaceSelector"] = {"matchExpressions": [{
                        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
                        "values": ["kube-system", NAMESPACE]}]}
        out.append(doc)
    return out


def crds(crd_dir: Path, base_url: str, ca_bundle: bytes) -> list[dict[str, Any]]:
    out = []
    for path in sorted(crd_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            if doc["metadata"]["name"] in CONVERSION_CRDS:
                doc["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "clientConfig": {"url": base_url + "/convert", "caBundle": base64.b64encode(ca_bundle).decode()},
                    "conversionReviewVersions": ["v1"]}}
            out.append(doc)
    return out


@dataclass
class LocalKueue:
    """Kueue installed into `cluster` and its manager running (see the module docstring). `start()`/`stop()` or
    `with LocalKueue(cluster) as kueue:`; `stop()` also uninstalls (webhooks, CRDs with every Kueue object,
    the namespace)."""

    cluster: LocalCluster
    workdir: Path | None = None
    feature_gates: str = FEATURE_GATES
    webhook_namespace_selector: Mapping[str, Any] | None = field(
        default_factory=lambda: copy.deepcopy(dict(DEFAULT_WEBHOOK_SELECTOR)))
    start_timeout_s: float = 90.0
    health_url: str = ""
    webhook_url: str = ""
    _popen: subprocess.Popen[bytes] | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    # (name, group, storage version, namespaced) of each CRD installed
    _crd_names: list[tuple[str, str, str, bool]] = field(default_factory=list)
    _installed: bool = False

    def __enter__(self) -> LocalKueue:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "kueue.log"

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start(self) -> None:
        started = time.monotonic()
        binary, assets = kueue_assets(self.cluster.bin_dir)
        own_workdir = self.workdir is None
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if own_workdir:
                self._tmp = tempfile.TemporaryDirectory(prefix="infer-ctl-kueue-")
                self.workdir = Path(self._tmp.name)
            assert self.workdir is not None
            self.workdir.mkdir(parents=True, exist_ok=True)
            atexit.register(self.stop)
            try:
                self._start(binary, assets)
                break
            except LocalKueueError as exc:
                self.stop()
                # free_port() closes the port it found before Kueue binds it: another process (another test
                # worker's servers) may take it in between, and Kueue exits at once. Installed again on new ports.
                if "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                    raise
                if not own_workdir and self.log_path.exists():  # the next attempt's log starts afresh
                    self.log_path.replace(self.log_path.with_name(f"kueue.attempt-{attempt}.log"))
                log.warning("a port was taken before Kueue bound it (attempt %d of %d); installing it again on new "
                            "ports", attempt, PORT_ATTEMPTS)
            except BaseException:
                self.stop()
                raise
        log.info("Kueue ready (webhooks at %s) in %.1f s", self.webhook_url, time.monotonic() - started)

    def _start(self, binary: Path, assets: Path) -> None:
        assert self.workdir is not None
        work = self.workdir
        certs = make_certificates(work / "pki")
        cert_dir = work / "webhook-certs"  # what kubelet's volume of the Secret would hold
        cert_dir.mkdir(exist_ok=True)
        for name in ("tls.crt", "tls.key", "ca.crt"):
            (cert_dir / name).write_bytes(certs[name])
        health_port, metrics_port, webhook_port, visibility_port = (free_port() for _ in range(4))
        self.webhook_url = f"https://127.0.0.1:{webhook_port}"
        self.health_url = f"http://127.0.0.1:{health_port}"

        # Installation, in the order Kueue's manifests have it: namespace, Secret, CRDs, webhooks.
        self._installed = True
        self.cluster.request("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        self.cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": WEBHOOK_SECRET, "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v).decode() for k, v in certs.items()}})
        crd_docs = crds(assets / "crd", self.webhook_url, certs["ca.crt"])
        self._crd_names = [(d["metadata"]["name"], d["spec"]["group"],
                            next(v["name"] for v in d["spec"]["versions"] if v.get("storage")),
                            d["spec"]["scope"] == "Namespaced") for d in crd_docs]
        self._apply(crd_docs)
        self.cluster.wait_established(*(name for name, *_ in self._crd_names))
        self._apply(webhook_configurations((assets / "webhook" / "manifests.yaml").read_text(), self.webhook_url,
                                           certs["ca.crt"], self.webhook_namespace_selector))

        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True, "webhookServiceName": WEBHOOK_SERVICE,
                                       "webhookSecretName": WEBHOOK_SECRET},
            "clientConnection": {"qps": 50, "burst": 100},
            "integrations": {"frameworks": ["batch/job"]},
        }
        (work / "config.yaml").write_text(yaml.safe_dump(config))
        with self.log_path.open("ab") as out:
            self._popen = subprocess.Popen(
                [str(binary), f"--config={work / 'config.yaml'}", f"--kubeconfig={self.cluster.kubeconfig}",
                 f"--feature-gates={self.feature_gates}", f"--visibility-server-port={visibility_port}",
                 "--zap-log-level=info"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent)  # noqa: PLW1509
        self._wait_ready()
        secret = self.cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/{WEBHOOK_SECRET}")
        if base64.b64decode(secret["data"].get("ca.crt", "")) != certs["ca.crt"]:
            raise LocalKueueError("Kueue's cert rotator replaced the CA seeded into its Secret, so the API server "
                                  f"cannot verify the webhook; the end of {self.log_path}:\n{self.tail()}")

    def _wait_ready(self) -> None:
        assert self._popen is not None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self._popen.poll() is not None:
                raise LocalKueueError(f"kueue exited with code {self._popen.returncode} during start; the end of "
                                      f"{self.log_path}:\n{self.tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError), \
                    urllib.request.urlopen(self.health_url + "/readyz", timeout=5) as resp:
                if 200 <= resp.status < 300:
                    return
            if time.monotonic() > deadline:
                raise LocalKueueError(f"kueue was not ready after {self.start_timeout_s:.0f} s; the end of "
                                      f"{self.log_path}:\n{self.tail()}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def stop(self) -> None:
        """Remove the webhook configurations (so that nothing is sent to a stopped server), stop the manager
        (SIGTERM, SIGKILL after 10 s), then delete Kueue's CRDs (finalizers of its objects removed first: nobody
        is left to remove them) and namespace. Safe to call twice."""
        if self._installed:
            for kind, name in WEBHOOK_CONFIGS.items():
                plural = kind.lower() + "s"
                self._delete(f"/apis/admissionregistration.k8s.io/v1/{plural}/{name}")
        popen, self._popen = self._popen, None
        if popen is not None and popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("kueue did not stop within 10 s of SIGTERM; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(timeout=10)
        if self._installed:
            self._installed = False
            self._uninstall()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _uninstall(self) -> None:
        for name, group, version, _ in self._crd_names:
            plural = name.split(".", 1)[0]
            with contextlib.suppress(Exception):  # the conversion webhook's server is gone
                self._patch(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
                            {"spec": {"conversion": {"strategy": "None", "webhook": None}}})
            try:
                items = self._call("GET", f"/apis/{group}/{version}/{plural}").get("items") or ()
            except (urllib.error.URLError, OSError) as e:
                log.warning("listing %s to remove finalizers failed: %s", name, e)
                continue
            for item in items:
                meta = item["metadata"]
                if not meta.get("finalizers"):
                    continue
                ns = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
                self._patch(f"/apis/{group}/{version}{ns}/{plural}/{meta['name']}",
                            {"metadata": {"finalizers": None}})
        for name, *_ in self._crd_names:
            self._delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        self._delete(f"/api/v1/namespaces/{NAMESPACE}")
        # Wait until they are gone, so that another LocalKueue can be installed into this cluster afterwards.
        deadline = time.monotonic() + 60
        remaining = [name for name, *_ in self._crd_names]
        namespace_gone = False
        while (remaining or not namespace_gone) and time.monotonic() < deadline:
            remaining = [n for n in remaining if self._exists(f"/apis/apiextensions.k8s.io/v1/"
                                                              f"customresourcedefinitions/{n}")]
            namespace_gone = namespace_gone or not self._exists(f"/api/v1/namespaces/{NAMESPACE}")
            if remaining or not namespace_gone:
                time.sleep(0.5)
        if not namespace_gone:
            log.warning("namespace %s still present 60 s after its deletion", NAMESPACE)
        for name in remaining:
            with contextlib.suppress(Exception):
                crd = self._call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                log.warning("Kueue CRD %s still present 60 s after its deletion: finalizers %s, conditions %s",
                            name, crd["metadata"].get("finalizers"), (crd.get("status") or {}).get("conditions"))

    # ------------------------------------------------------------------------------------------ helpers

    def _apply(self, docs: list[dict[str, Any]]) -> None:
        # Server-side: the Workload CRD (1.4 MB) is far beyond client-side apply's annotation limit.
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=infer-ctl-kueue",
                             "-f", "-", input_text=yaml.safe_dump_all(docs))

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.cluster.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.cluster.admin_token}", "Content-Type": content_type,
            "Accept": "application/json"})
        context = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(req, context=context, timeout=30) as resp:
                    return json.loads(resp.read() or b"null")
            except urllib.error.HTTPError as e:
                # 429 while the API server re-installs a CRD's handler (after the conversion patch): retry.
                if e.code != 429 or time.monotonic() > deadline:
                    raise
                time.sleep(min(float(e.headers.get("Retry-After") or 1), 2.0))

    def _patch(self, path: str, body: Any) -> None:
        try:
            self._call("PATCH", path, body, "application/merge-patch+json")
        except urllib.error.HTTPError as e:
            if e.code != 404:
                log.warning("PATCH %s failed: %s %s", path, e.code, e.read()[:300])
        except (urllib.error.URLError, OSError) as e:
            log.warning("PATCH %s failed: %s", path, e)

    def _delete(self, path: str) -> None:
        try:
            self._call("DELETE", path)
        except urllib.error.HTTPError as e:
            if e.code != 404:
                log.warning("DELETE %s failed: %s %s", path, e.code, e.read()[:300])
        except (urllib.error.URLError, OSError) as e:
            log.warning("DELETE %s failed: %s", path, e)

    def _exists(self, path: str) -> bool:
        try:
            self._call("GET", path)
            return True
        except urllib.error.HTTPError as e:
            return e.code != 404
        except (urllib.error.URLError, OSError):
            return False
