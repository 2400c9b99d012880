"""The node agent's runtime for infer-ctl's own image: a controller Pod of deploy/ run as a local process.

There is no container runtime in the sandbox. A Pod whose container image is infer-ctl's
(`ghcr.io/infer-ctl/infer-ctl`, any tag) runs as what the image's entrypoint runs, `infer-ctl <args>` of the
installed package, with what kubelet would give the container:

- the container's `env` (`value`, and `valueFrom.configMapKeyRef` read from the API server), and `$(VAR)`
  references in `args` expanded from it as kubelet expands them;
- its ServiceAccount: a bound token from the TokenRequest API for `spec.serviceAccountName` in a kubeconfig
  (`KUBECONFIG`), so the process has exactly the permissions the manifests' RBAC grants, no more;
- its ConfigMap volumes (the policies) written to a temporary directory, `emptyDir` volumes as empty ones, and
  `hostPath` volumes as the node's directory on this machine (`host_path`: the node agent's per-node disk, e.g. the
  model cache the node-side reporter scans); a mount path in `env` values or `args` is replaced by that directory
  (there is no mount namespace; a read-only mount is not enforced);
- `env` from the downward API's fieldRef (metadata.name and .namespace, spec.nodeName, spec.serviceAccountName);
- ports: every Pod of the machine shares 127.0.0.1, so the ports in `--metrics-port`, `--liveness-port` and
  `--readiness-port` are replaced by free ones and the `--*-address` flags by 127.0.0.1 (two replicas of one
  Deployment would otherwise collide); the probes follow the remapped ports;
- probes: the readiness probe's HTTP GET decides the Pod's Ready condition, the liveness probe's failures
  (`failureThreshold` in a row) restart the process, as kubelet does (restartCount, a back-off).

Its output (the JSON log lines with `--log-format json`) goes to `<workdir>/<namespace>_<pod>.log`.

An entry of the user's image table (`sandbox up --images FILE`) that matches the image replaces that entrypoint by
its command, the container's args appended: scripts/run-image.sh runs the image built by scripts/build-image.sh
from its unpacked root filesystem, so that the controller that runs is the image's (docs/image.md).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infer_ctl.kube.client import KubeClient, KubeError, Resource
from infer_ctl.sandbox.ports import free_port

IMAGE_REPOSITORY = "ghcr.io/infer-ctl/infer-ctl"
CONFIG_MAPS = Resource("v1", "configmaps", "ConfigMap")
PORT_FLAGS = ("--metrics-port", "--liveness-port", "--readiness-port")
ADDRESS_FLAGS = ("--metrics-address", "--health-address")
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def is_controller_image(image: str) -> bool:
    name = image.partition("@")[0]
    last = name.rpartition("/")[2]
    return (name.rpartition(":")[0] if ":" in last else name) == IMAGE_REPOSITORY


def entrypoint() -> list[str]:
    """The image's ENTRYPOINT, `infer-ctl`: the console script next to this interpreter, else the module."""
    script = Path(sys.executable).with_name("infer-ctl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "infer_ctl.cli.main"]


def expand(text: str, env: dict[str, str]) -> str:
    """kubelet's `$(VAR)` expansion: a defined variable is replaced, an undefined reference is left as is."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def remap_args(args: list[str]) -> tuple[list[str], dict[int, int]]:
    """Replace the port flags' values by free ports and the address flags' by 127.0.0.1 (both `--flag V` and
    `--flag=V`); returns the new args and {container port: local port}."""
    out: list[str] = []
    ports: dict[int, int] = {}
    pending: str | None = None
    for arg in args:
        if pending is not None:
            out.append(_remapped(pending, arg, ports))
            pending = None
            continue
        flag, eq, value = arg.partition("=")
        if flag in PORT_FLAGS + ADDRESS_FLAGS:
            if eq:
                out.append(f"{flag}={_remapped(flag, value, ports)}")
            else:
                out.append(arg)
                pending = flag
            continue
        out.append(arg)
    return out, ports


def _remapped(flag: str, value: str, ports: dict[int, int]) -> str:
    if flag in ADDRESS_FLAGS:
        return "127.0.0.1"
    local = free_port()
    ports[int(value)] = local
    return str(local)


@dataclass
class Prepared:
    argv: list[str]
    env: dict[str, str]
    ports: dict[int, int]  # container port -> local port
    container: dict[str, Any]
    directory: Path


def _token_kubeconfig(client: KubeClient, namespace: str, account: str, path: Path) -> None:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    answer = client.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", body=body)
    c = client.configuration
    cluster: dict[str, Any] = {"server": c.host}
    if c.ssl_ca_cert:  # inlined, as a Pod gets ca.crt in its token's volume (not a path of the host's)
        cluster["certificate-authority-data"] = base64.b64encode(Path(c.ssl_ca_cert).read_bytes()).decode()
    else:
        cluster["insecure-skip-tls-verify"] = True
    user = f"system:serviceaccount:{namespace}:{account}"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": answer["status"]["token"]}}],
        "contexts": [{"name": "pod", "context": {"cluster": "cluster", "user": user, "namespace": namespace}}],
    }))
    path.chmod(0o600)


def _config_map(client: KubeClient, name: str, namespace: str) -> dict[str, str]:
    obj = client.get(CONFIG_MAPS, name, namespace)
    if obj is None:
        raise KubeError(404, "NotFound", f'configmaps "{name}" not found')
    return {str(k): str(v) for k, v in (obj.get("data") or {}).items()}


_FIELD_REFS = {"metadata.name": ("metadata", "name"), "metadata.namespace": ("metadata", "namespace"),
               "spec.nodeName": ("spec", "nodeName"), "spec.serviceAccountName": ("spec", "serviceAccountName")}


def prepare(client: KubeClient, pod: dict[str, Any], workdir: Path,
            host_path: Callable[[str], Path] | None = None, command: Sequence[str] | None = None) -> Prepared:
    """What the container would get (see the module's docstring), blocking (run it in a thread). `host_path`: where
    a hostPath of the Pod's node is on this machine (None: hostPath volumes are empty directories). `command`: what
    stands for the image's entrypoint (None: the installed package's `infer-ctl`); an image table entry of the
    user's gives it, e.g. scripts/run-image.sh, which runs the built image's own entrypoint from its root filesystem."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    spec = pod.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    directory = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))
    # volumes
    mounts: dict[str, str] = {}
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"]) or {}
        target = directory / "volumes" / mount["name"]
        target.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            for key, value in _config_map(client, volume["configMap"]["name"], namespace).items():
                (target / key).write_text(value)
        elif "hostPath" in volume and host_path is not None:
            target = host_path(str(volume["hostPath"]["path"]))
            target.mkdir(parents=True, exist_ok=True)  # DirectoryOrCreate; any other type finds what is there
        mounts[mount["mountPath"]] = str(target)

    def unmounted(text: str) -> str:
        for path, local in mounts.items():
            if text == path or text.startswith(path + "/"):
                return local + text[len(path):]
        return text

    # env, in order (a later value may refer to an earlier one)
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = unmounted(expand(str(var["value"]), env))
        elif field_ref := (var.get("valueFrom") or {}).get("fieldRef"):
            where = _FIELD_REFS.get(str(field_ref.get("fieldPath")))
            if where is None:
                raise KubeError(0, "CreateContainerConfigError", f"env {var['name']}: fieldRef "
                                f"{field_ref.get('fieldPath')!r} is not one the sandbox resolves "
                                f"({', '.join(sorted(_FIELD_REFS))})")
            env[var["name"]] = str((pod.get(where[0]) or {}).get(where[1]) or "")
        elif ref := (var.get("valueFrom") or {}).get("configMapKeyRef"):
            data = _config_map(client, ref["name"], namespace)
            if ref["key"] in data:
                env[var["name"]] = data[ref["key"]]
            elif not ref.get("optional"):
                raise KubeError(0, "CreateContainerConfigError", f"couldn't find key {ref['key']} in ConfigMap "
                                                                 f"{namespace}/{ref['name']}")
    kubeconfig = directory / "kubeconfig"
    _token_kubeconfig(client, namespace, spec.get("serviceAccountName") or "default", kubeconfig)
    args = [unmounted(expand(str(a), env)) for a in (container.get("command") or [])[1:] + (container.get("args")
                                                                                              or [])]
    args, ports = remap_args(args)
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME", "PYTHONPATH")}
    full_env = {**base, **env, "KUBECONFIG": str(kubeconfig), "TMPDIR": mounts.get("/tmp", str(directory)),
                "POD_NAME": name, "POD_NAMESPACE": namespace}
    _hand_over(directory, _run_as(spec, container))
    head = list(command) if command is not None else entrypoint()
    return Prepared(head + args, full_env, ports, container, directory)


def _run_as(spec: dict[str, Any], container: dict[str, Any]) -> tuple[int, int] | None:
    """The container's runAsUser and runAsGroup (its securityContext's over the Pod's), or None."""
    pod, own = spec.get("securityContext") or {}, container.get("securityContext") or {}
    uid = own.get("runAsUser", pod.get("runAsUser"))
    if uid is None:
        return None
    return int(uid), int(own.get("runAsGroup", pod.get("runAsGroup", uid)))


def _hand_over(directory: Path, owner: tuple[int, int] | None) -> None:
    """As kubelet makes a Pod's token and volumes readable by its runAsUser: the Pod's directory (kubeconfig,
    ConfigMap and emptyDir volumes) owned by that user and its parent traversable, when this agent runs as root.
    The installed package runs as the agent's own user and reads them anyway; an image run from its root
    filesystem as its own user (scripts/run-image.sh) needs it."""
    if owner is None or os.geteuid() != 0:
        return
    parent = directory.parent
    parent.chmod(parent.stat().st_mode | 0o111)
    for path in (directory, *directory.rglob("*")):
        os.chown(path, *owner, follow_symlinks=False)


@dataclass(eq=False)
class ControllerProcess:
    """One run of the container's process; the node agent's `Child` interface (pid, exited, signal, stop)."""

    process: asyncio.subprocess.Process
    exited: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def __post_init__(self) -> None:
        self._waiter = asyncio.ensure_future(self._wait())

    async def _wait(self) -> None:
        code = await self.process.wait()
        if not self.exited.done():
            self.exited.set_result(code)

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def signal(self, sig: int) -> None:
        if not self.exited.done():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    async def stop(self, grace_s: float) -> None:
        if not self.exited.done():
            await terminate(self.signal, self.exited, grace_s)


async def terminate(send: Callable[[int], None], exited: asyncio.Future[Any], grace_s: float) -> None:
    """As kubelet ends a container: SIGTERM, then SIGKILL once `grace_s` has passed (and 5 s more to see it go)."""
    send(signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(exited), timeout=max(grace_s, 0.1))
    except TimeoutError:
        send(signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(exited), timeout=5)


async def start(prepared: Prepared, log_path: Path) -> ControllerProcess:
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            *prepared.argv, env=prepared.env, stdin=asyncio.subprocess.DEVNULL, stdout=log,
            stderr=asyncio.subprocess.STDOUT, cwd=prepared.directory, start_new_session=True)
    return ControllerProcess(process)


def probe_url(probe: dict[str, Any] | None, container: dict[str, Any], ports: dict[int, int]) -> str | None:
    """The local URL of an httpGet probe (a named port resolved through the container's ports, then remapped)."""
    get = (probe or {}).get("httpGet")
    if not get:
        return None
    port = get.get("port")
    if isinstance(port, str) and not port.isdigit():
        port = next((p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port), None)
        if port is None:
            return None
    local = ports.get(int(port), int(port))
    return f"http://127.0.0.1:{local}{get.get('path') or '/'}"


async def http_ok(url: str, timeout_s: float) -> bool:
    def get() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as answer:
                return 200 <= int(answer.status) < 400
        except OSError:
            return False

    return await asyncio.to_thread(get)


def cleanup(prepared: Prepared) -> None:
    shutil.rmtree(prepared.directory, ignore_errors=True)
