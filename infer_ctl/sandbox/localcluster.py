"""The real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-scheduler, kube-controller-manager.

The binaries are built from their Go modules (`kubebin/`, `scripts/kube-binaries.sh`) into a cache outside the
repository; `kube_binaries()` finds them (or builds them on first use from a checkout). `LocalCluster` starts:

- **etcd** with a temporary data dir (no fsync: the data dies with the cluster);
- **kube-apiserver** on 127.0.0.1 only, with a self-signed serving certificate, static-token authentication
  (an admin token, and one token each for the scheduler and the controller manager, so both run under their
  real bootstrap RBAC roles), RBAC authorization, service-account keys generated at start (TokenRequest works:
  `service_account_kubeconfig` gives a controller the identity and permissions of a ServiceAccount), the
  `GenericWorkload` gate and `scheduling.k8s.io/v1beta1` (Workload and PodGroup, gang scheduling);
- **kube-scheduler** with the default profile (DynamicResources allocates ResourceClaims; GangScheduling via
  GenericWorkload);
- **kube-controller-manager** with the controllers a cluster of fake nodes can use (`CONTROLLERS`), including the
  node-lifecycle controller: it removes the `node.kubernetes.io/not-ready` taint that the API server puts on every
  new Node once the node's Lease is fresh, and taints (and evicts from) a node whose Lease goes stale, so the node
  agent must renew a Lease per node as kubelet does.

There is no kubelet: the project's node agent (`infer_ctl.sandbox.kubeside`) registers the nodes, publishes the
DRA ResourceSlices and runs bound Pods. Every process is started in its own process group, and stopped (SIGTERM,
then SIGKILL) on `stop()`, on leaving the context manager, at interpreter exit, and, through the kernel's
parent-death signal, when the process that started them dies, even by SIGKILL (the signal follows the thread that
forked: start the cluster from a thread that lives as long as it, such as the main thread).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import json
import logging
import math
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infer_ctl.sandbox.ports import free_port

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "scripts" / "kube-binaries.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl")
FEATURE_GATES = "GenericWorkload=true"
RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"
# Names as `kube-controller-manager --help` lists them (1.37). ResourceClaims from templates and their
# deallocation, garbage collection (owner references), namespaces, ServiceAccounts (the ServiceAccount admission
# plugin needs each namespace's `default`), the workload controllers, and the PodGroup controller of
# GenericWorkload, the aggregation of the admin/edit/view ClusterRoles, and the binding of PersistentVolumeClaims to
# PersistentVolumes with the finalizers that keep a volume in use from deletion (the node model caches' local volumes),
# and DaemonSets (the node-side reporter of the nodes' model caches).
CONTROLLERS = ("resourceclaim-controller", "garbage-collector-controller", "namespace-controller",
               "serviceaccount-controller", "serviceaccount-token-controller",
               "root-ca-certificate-publisher-controller", "clusterrole-aggregation-controller",
               "deployment-controller", "replicaset-controller", "statefulset-controller", "job-controller",
               "endpointslice-controller", "disruption-controller", "pod-garbage-collector-controller",
               "podgroup-protection-controller", "node-lifecycle-controller", "taint-eviction-controller",
               "persistentvolume-binder-controller", "persistentvolume-protection-controller",
               "persistentvolumeclaim-protection-controller", "daemonset-controller")
ADMIN_USER = "infer-ctl-admin"
PORT_ATTEMPTS = 3  # starts of the control plane when a component finds its port taken (see `LocalCluster.start`)
_PR_SET_PDEATHSIG = 1


def _open(req: urllib.request.Request, context: ssl.SSLContext | None, *, timeout_s: float) -> Any:
    """urlopen to the local control plane, with no proxy: urlopen's default opener scans os.environ for proxies,
    and this runs on a thread of its own (a cluster started in the background while a test runs) while pytest sets
    and removes PYTEST_CURRENT_TEST there (a KeyError mid-scan once failed a test's setup)."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers).open(req, timeout=timeout_s)


class LocalClusterError(RuntimeError):
    """The control plane could not be built or started; the message names the component and its log."""


def kube_binaries(*, build: bool = True) -> Path:
    """The directory with the five binaries: `$INFER_CTL_KUBE_BIN`, else the build cache (built now if missing and
    `build`; progress goes to stderr). Raises LocalClusterError with what to do when there is none."""
    explicit = os.environ.get("INFER_CTL_KUBE_BIN")
    if explicit:
        path = Path(explicit)
        missing = [b for b in BINARIES if not (path / b).is_file()]
        if missing:
            raise LocalClusterError(f"INFER_CTL_KUBE_BIN={path} lacks {', '.join(missing)}")
        return path
    if not BUILD_SCRIPT.is_file():
        raise LocalClusterError("no Kubernetes binaries: set INFER_CTL_KUBE_BIN to a directory with "
                                f"{', '.join(BINARIES)} (built by scripts/kube-binaries.sh from a checkout)")
    args = ["bash", str(BUILD_SCRIPT)] + ([] if build else ["--check"])
    result = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        if not build:
            raise LocalClusterError("the Kubernetes binaries are not built yet: run scripts/kube-binaries.sh "
                                    "(a cold build takes about 5 minutes on 2 cores)")
        raise LocalClusterError(f"building the Kubernetes binaries failed (scripts/kube-binaries.sh exit "
                                f"{result.returncode}; its output is above)")
    return Path(result.stdout.strip().splitlines()[-1])


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class LocalCluster:
    """A real control plane in `workdir` (a temporary directory when None). `with LocalCluster() as c:` or
    start()/stop(). `kubeconfig` is an admin kubeconfig; `url` the API server's address."""

    workdir: Path | None = None
    bin_dir: Path | None = None
    feature_gates: str = FEATURE_GATES
    controllers: Sequence[str] = CONTROLLERS
    start_timeout_s: float = 90.0
    # kube-apiserver's audit log (level Metadata, one JSON line per completed request: user, userAgent, verb,
    # resource) in logs/audit.log: who sends how many requests (the controller benchmark's API load)
    audit_log: bool = False
    extra_admins: Sequence[str] = ()  # further user names with admin rights (see admin_kubeconfig_as)
    url: str = ""
    admin_token: str = ""
    _processes: list[_Process] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    _ca_data: bytes = b""
    _extra_tokens: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def kubeconfig(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "kubeconfig"

    @property
    def audit_path(self) -> Path:
        """kube-apiserver's audit log (with `audit_log`)."""
        assert self.workdir is not None
        return self.workdir / "logs" / "audit.log"

    def admin_kubeconfig_as(self, user: str, path: Path) -> Path:
        """A kubeconfig with the admin's rights under another user name (the audit log then tells that client's
        requests from the others'): a token of its own, added to the static token file before start()."""
        assert self.workdir is not None and self.url, "start() first"
        token = self._extra_tokens.get(user)
        if token is None:
            raise ValueError(f"user {user!r} was not given in extra_admins before start()")
        self._write_kubeconfig(path, token, user)
        return path

    @property
    def ca_file(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "pki" / "apiserver.crt"

    def start(self) -> None:
        started = time.monotonic()
        bin_dir = self.bin_dir or kube_binaries()
        self.bin_dir = bin_dir
        if self.workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="infer-ctl-kube-")
            self.workdir = Path(self._tmp.name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            for attempt in range(1, PORT_ATTEMPTS + 1):
                try:
                    self._start(bin_dir)
                    break
                except LocalClusterError as exc:
                    # free_port() closes the port it found before the component binds it: another process (another
                    # test worker's servers) may take it in between. The component then exits at once; start again
                    # on new ports, with a new etcd data dir.
                    if "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                        raise
                    log.warning("a port was taken before the control plane bound it (attempt %d of %d); starting "
                                "again on new ports: %s", attempt, PORT_ATTEMPTS, str(exc).splitlines()[0])
                    self._stop_processes()
                    shutil.rmtree(self.workdir / "etcd", ignore_errors=True)
        except BaseException:
            self.stop()
            raise
        log.info("local control plane ready at %s in %.1f s", self.url, time.monotonic() - started)

    def _start(self, bin_dir: Path) -> None:
        assert self.workdir is not None
        work = self.workdir
        pki = work / "pki"
        pki.mkdir(exist_ok=True)
        (work / "logs").mkdir(exist_ok=True)
        self.admin_token = secrets.token_hex(16)
        scheduler_token, kcm_token = secrets.token_hex(16), secrets.token_hex(16)
        (work / "tokens.csv").write_text(
            f'{self.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
            f"{scheduler_token},system:kube-scheduler,system:kube-scheduler\n"
            f"{kcm_token},system:kube-controller-manager,system:kube-controller-manager\n"
            + "".join(f'{self._extra_tokens.setdefault(user, secrets.token_hex(16))},{user},{user},"system:masters"\n'
                      for user in self.extra_admins))
        (work / "tokens.csv").chmod(0o600)
        audit: list[str] = []
        if self.audit_log:
            (work / "audit-policy.yaml").write_text(yaml.safe_dump({
                "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata"}]}))
            audit = [f"--audit-policy-file={work / 'audit-policy.yaml'}", f"--audit-log-path={self.audit_path}",
                     "--audit-log-format=json", "--audit-log-mode=batch"]
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                        "-out", str(pki / "sa.key")], check=True, capture_output=True)
        subprocess.run(["openssl", "pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")],
                       check=True, capture_output=True)

        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn("etcd", [
            str(bin_dir / "etcd"), "--name", "default", "--data-dir", str(work / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync", "--watch-progress-notify-interval=5s", "--log-level=warn"])
        self._wait("etcd", lambda: self._http_ok(f"{etcd_url}/health"))

        self.url = f"https://127.0.0.1:{api_port}"
        self._spawn("kube-apiserver", [
            str(bin_dir / "kube-apiserver"), f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
            f"--cert-dir={pki}", f"--token-auth-file={work / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC", "--anonymous-auth=false",
            # on top of the defaults, as OpenShift and hardened clusters run it: setting blockOwnerDeletion on an
            # ownerReference needs `update` on the owner's finalizers (the controller's replicas set it)
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            f"--service-account-issuer={self.url}", f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
            f"--feature-gates={self.feature_gates}", f"--runtime-config={RUNTIME_CONFIG}",
            # The `kubernetes` Service cannot point at a loopback address; nothing here needs its endpoints.
            "--endpoint-reconciler-type=none", "--profiling=false", "--v=1", *audit])
        self._wait("kube-apiserver", lambda: self._ready_certificate() and self._http_ok(f"{self.url}/readyz"))
        self._write_kubeconfig(self.kubeconfig, self.admin_token, ADMIN_USER)

        scheduler_kc = work / "kube-scheduler.kubeconfig"
        self._write_kubeconfig(scheduler_kc, scheduler_token, "system:kube-scheduler")
        scheduler_port = free_port()
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                  "clientConnection": {"kubeconfig": str(scheduler_kc), "qps": 200, "burst": 400},
                  "leaderElection": {"leaderElect": False},
                  "profiles": [{"schedulerName": "default-scheduler"}]}
        (work / "kube-scheduler.yaml").write_text(yaml.safe_dump(config))
        self._spawn("kube-scheduler", [
            str(bin_dir / "kube-scheduler"), f"--config={work / 'kube-scheduler.yaml'}",
            f"--feature-gates={self.feature_gates}", "--bind-address=127.0.0.1", f"--secure-port={scheduler_port}",
            f"--cert-dir={work / 'pki-scheduler'}", "--v=1"])

        kcm_kc = work / "kube-controller-manager.kubeconfig"
        self._write_kubeconfig(kcm_kc, kcm_token, "system:kube-controller-manager")
        kcm_port = free_port()
        self._spawn("kube-controller-manager", [
            str(bin_dir / "kube-controller-manager"), f"--kubeconfig={kcm_kc}",
            f"--authentication-kubeconfig={kcm_kc}", f"--authorization-kubeconfig={kcm_kc}",
            # Each controller acts as its own ServiceAccount in kube-system with its bootstrap role (as kubeadm
            # runs it): the system:kube-controller-manager user alone may not even get Nodes.
            "--use-service-account-credentials=true",
            "--leader-elect=false", f"--controllers={','.join(self.controllers)}",
            f"--feature-gates={self.feature_gates}", f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={self.ca_file}", "--bind-address=127.0.0.1", f"--secure-port={kcm_port}",
            f"--cert-dir={work / 'pki-kcm'}", "--concurrent-gc-syncs=5", "--v=1"])
        self._wait("kube-scheduler", lambda: self._http_ok(f"https://127.0.0.1:{scheduler_port}/healthz",
                                                           verify=False))
        self._wait("kube-controller-manager", lambda: self._http_ok(f"https://127.0.0.1:{kcm_port}/healthz",
                                                                    verify=False))
        # The ServiceAccount admission plugin refuses Pods until their namespace's `default` ServiceAccount exists.
        self._wait("kube-controller-manager",
                   lambda: self._http_ok(f"{self.url}/api/v1/namespaces/default/serviceaccounts/default"))

    def stop(self) -> None:
        """Stop every process, newest first, each before the next (SIGTERM, SIGKILL after 10 s): the API server
        shuts down in about a second while etcd is up, and waits for it when etcd goes first. Removes a
        temporary workdir. Safe to call twice."""
        self._stop_processes()
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _stop_processes(self) -> None:
        processes, self._processes = self._processes, []
        for proc in reversed(processes):
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGTERM)
                try:
                    proc.popen.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop within 10 s of SIGTERM; killing it", proc.name)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.popen.pid, signal.SIGKILL)
                    proc.popen.wait(timeout=10)

    def alive(self) -> dict[str, bool]:
        return {p.name: p.popen.poll() is None for p in self._processes}

    # ------------------------------------------------------------------------------------------ identities

    def service_account_kubeconfig(self, namespace: str, name: str, path: Path, *,
                                   expiration_s: int = 24 * 3600) -> Path:
        """A kubeconfig that acts as ServiceAccount `namespace/name` (a bound token from the TokenRequest API),
        so a controller runs with exactly the permissions its RBAC grants."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_s}}
        answer = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)
        self._write_kubeconfig(path, answer["status"]["token"], f"system:serviceaccount:{namespace}:{name}")
        return path

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One admin request (for set-up; the project's code uses infer_ctl.kube.client)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.admin_token}", "Content-Type": "application/json",
            "Accept": "application/json"})
        with _open(req, self._ssl_context(), timeout_s=30) as resp:
            return json.loads(resp.read() or b"null")

    def kubectl(self, *args: str, input_text: str | None = None, kubeconfig: Path | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl; with `check`, a failure raises LocalClusterError with kubectl's stderr."""
        assert self.bin_dir is not None
        result = subprocess.run([str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}",
                                 *args], input=input_text, capture_output=True, text=True, check=False, timeout=120)
        if check and result.returncode != 0:
            raise LocalClusterError(f"kubectl {' '.join(args)} failed (exit {result.returncode}): "
                                    f"{result.stderr.strip()}")
        return result

    def wait_established(self, *crds: str, timeout_s: float = 60.0) -> None:
        """`kubectl wait --for=condition=Established` on the named CustomResourceDefinitions, tried again while
        a CRD just created has no status yet: kubectl then fails at once ("status.conditions accessor error: <nil>
        is of the type <nil>") instead of waiting."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(1, math.ceil(deadline - time.monotonic()))
            result = self.kubectl("wait", "--for=condition=Established", f"--timeout={left}s",
                                  *(f"crd/{name}" for name in crds), check=False)
            if result.returncode == 0:
                return
            if "accessor error" not in result.stderr or time.monotonic() >= deadline:
                raise LocalClusterError(f"kubectl wait --for=condition=Established {' '.join(crds)} failed "
                                        f"(exit {result.returncode}): {result.stderr.strip()}")
            time.sleep(0.5)

    # ------------------------------------------------------------------------------------------ helpers

    def _spawn(self, name: str, args: list[str]) -> None:
        assert self.workdir is not None
        log_path = self.workdir / "logs" / f"{name}.log"
        with log_path.open("ab") as out:
            popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=die_with_parent)  # noqa: PLW1509
        self._processes.append(_Process(name, popen, log_path))

    def _wait(self, name: str, ready: Any) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        proc = next(p for p in self._processes if p.name == name)
        while True:
            if proc.popen.poll() is not None:
                raise LocalClusterError(f"{name} exited with code {proc.popen.returncode} during start; "
                                        f"the end of {proc.log_path}:\n{proc.tail()}")
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError, ssl.SSLError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise LocalClusterError(f"{name} was not ready after {self.start_timeout_s:.0f} s; the end of "
                                        f"{proc.log_path}:\n{proc.tail()}")
            time.sleep(0.1)

    def _ready_certificate(self) -> bool:
        if not self._ca_data and self.ca_file.is_file() and self.ca_file.stat().st_size > 0:
            self._ca_data = self.ca_file.read_bytes()
        return bool(self._ca_data)

    def _ssl_context(self, *, verify: bool = True) -> ssl.SSLContext:
        if not verify:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        return ssl.create_default_context(cadata=self._ca_data.decode())

    def _http_ok(self, url: str, *, verify: bool = True) -> bool:
        headers = {"Authorization": f"Bearer {self.admin_token}"} if url.startswith(self.url or "\0") else {}
        req = urllib.request.Request(url, headers=headers)
        context = self._ssl_context(verify=verify) if url.startswith("https") else None
        try:
            with _open(req, context, timeout_s=5) as resp:
                return bool(200 <= resp.status < 300)
        except urllib.error.HTTPError:
            return False

    def _write_kubeconfig(self, path: Path, token: str, user: str) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "infer-ctl-local",
            "clusters": [{"name": "infer-ctl-local", "cluster": {
                "server": self.url, "certificate-authority-data": base64.b64encode(self._ca_data).decode()}}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "infer-ctl-local", "context": {"cluster": "infer-ctl-local", "user": user,
                                                                "namespace": "default"}}],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)


def copy_logs(cluster: LocalCluster, dest: Path) -> None:
    """Keep the components' logs (e.g. of a failed test) after a temporary workdir is removed."""
    if cluster.workdir is not None and (cluster.workdir / "logs").is_dir():
        shutil.copytree(cluster.workdir / "logs", dest, dirs_exist_ok=True)
