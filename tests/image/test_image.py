"""The controller's OCI image as scripts/build-image.sh leaves it in the cache (~/.cache/infer-ctl/image/oci):
the reference deploy/ runs, the entrypoint, a numeric non-root user, the labels, and in its layer the wheel of
this version, the dependencies uv.lock pins and nothing of the build.

Building takes about 3 minutes cold and needs root, mmdebstrap, umoci and the Debian and PyPI mirrors, so the
suite does not build it: without a built image these tests skip and say so (`scripts/build-image.sh` first).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("INFER_CTL_IMAGE_CACHE") or Path.home() / ".cache" / "infer-ctl" / "image")
LAYOUT = CACHE / "oci"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CONTROLLER = ROOT / "deploy" / "kustomize" / "base" / "controller.yaml"
UV = Path(os.environ.get("UV") or Path(sys.executable).with_name("uv"))  # the dev group's


def deployment() -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all(CONTROLLER.read_text()) if d and d["kind"] == "Deployment")


REFERENCE = deployment()["spec"]["template"]["spec"]["containers"][0]["image"]


@dataclass(frozen=True, slots=True)
class Image:
    digest: str
    media_type: str
    manifest: dict[str, Any]
    config: dict[str, Any]
    layers: tuple[Path, ...]

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.config["config"].get("Labels") or {})


def blob(digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return LAYOUT / "blobs" / algorithm / hexdigest


@pytest.fixture(scope="module")
def image() -> Image:
    if not (LAYOUT / "index.json").exists():
        pytest.skip(f"no image built in {LAYOUT}: run scripts/build-image.sh (as root, about 3 min cold)")
    index = json.loads((LAYOUT / "index.json").read_text())
    refs = {m.get("annotations", {}).get("org.opencontainers.image.ref.name"): m for m in index["manifests"]}
    assert REFERENCE in refs, f"{LAYOUT} holds {sorted(map(str, refs))}, not {REFERENCE}, the image deploy/ runs"
    descriptor = refs[REFERENCE]
    manifest = json.loads(blob(descriptor["digest"]).read_text())
    config = json.loads(blob(manifest["config"]["digest"]).read_text())
    layers = tuple(blob(layer["digest"]) for layer in manifest["layers"])
    return Image(descriptor["digest"], descriptor["mediaType"], manifest, config, layers)


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    mode: int
    uid: int
    mtime: int
    is_file: bool


@pytest.fixture(scope="module")
def layer(image: Image) -> tuple[dict[str, Entry], dict[str, bytes]]:
    """Every entry of the image's layer(s), and the contents of the few files the tests read."""
    wanted = re.compile(r"(etc/passwd|etc/group|opt/venv/lib/python3\.\d+/site-packages/([^/]+\.dist-info/METADATA"
                        r"|infer_ctl/BUILD_COMMIT))$")
    entries: dict[str, Entry] = {}
    contents: dict[str, bytes] = {}
    for path in image.layers:
        with tarfile.open(path, "r|gz") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                entries[name] = Entry(name, member.mode, member.uid, int(member.mtime), member.isfile())
                if member.isfile() and wanted.search(name):
                    handle = tar.extractfile(member)
                    assert handle is not None
                    contents[name] = handle.read()
    return entries, contents


def test_the_image_is_tagged_with_the_reference_deploys_manifests_use_and_is_an_oci_image(image: Image) -> None:
    assert f"ghcr.io/infer-ctl/infer-ctl:{VERSION}" == REFERENCE
    assert image.media_type == "application/vnd.oci.image.manifest.v1+json"  # the index's descriptor says so
    assert image.manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    assert image.config["os"] == "linux" and image.config["architecture"] == "amd64"
    for descriptor, path in zip(image.manifest["layers"], image.layers, strict=True):
        assert descriptor["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        assert f"sha256:{digest.hexdigest()}" == descriptor["digest"] and path.stat().st_size == descriptor["size"]


def test_the_entrypoint_is_infer_ctl_and_the_user_is_the_numeric_non_root_one_the_pod_runs_as(image: Image) -> None:
    config = image.config["config"]
    assert config["Entrypoint"] == ["/opt/venv/bin/infer-ctl"]
    assert config["Cmd"] == ["controller", "--help"]
    # Pod Security `restricted`: runAsNonRoot needs a numeric, non-zero user the kubelet can verify
    user, _, group = config["User"].partition(":")
    assert user.isdigit() and group.isdigit() and int(user) != 0
    pod = deployment()["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True and (pod["runAsUser"], pod["runAsGroup"]) == (int(user), int(group))
    assert "PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in config["Env"]


def test_the_labels_name_this_version_and_a_commit_whose_date_is_every_timestamp_of_the_image(image: Image) -> None:
    labels = image.labels
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.title"] == "infer-ctl"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    revision = labels["org.opencontainers.image.revision"]
    found = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%ct", revision], capture_output=True,
                           text=True, check=False)
    if found.returncode != 0:
        pytest.skip(f"the image's revision {revision} is not in this clone's history (built elsewhere?)")
    created = datetime.fromtimestamp(int(found.stdout), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert image.config["created"] == created == labels["org.opencontainers.image.created"]
    assert {h["created"] for h in image.config["history"]} == {created}


def test_the_layer_holds_the_entrypoint_and_the_user_and_no_timestamp_after_the_commit(
        image: Image, layer: tuple[dict[str, Entry], dict[str, bytes]]) -> None:
    entries, contents = layer
    entrypoint = entries["opt/venv/bin/infer-ctl"]
    assert entrypoint.is_file and entrypoint.mode & 0o111
    user = image.config["config"]["User"].partition(":")[0]
    users = {line.split(":")[2]: line.split(":")[0] for line in contents["etc/passwd"].decode().splitlines()}
    assert users.get(user) == "nonroot", f"no user {user} in the image's /etc/passwd"
    assert entries["home/nonroot"].uid == int(user)
    created = int(datetime.strptime(image.config["created"], "%Y-%m-%dT%H:%M:%S%z").timestamp())
    late = [e.name for e in entries.values() if e.mtime > created]
    assert not late, f"mtimes after SOURCE_DATE_EPOCH: {late[:5]}"


def test_nothing_of_the_build_is_left_in_the_image(layer: tuple[dict[str, Entry], dict[str, bytes]]) -> None:
    entries, _ = layer
    leftovers = [name for name in entries if name.startswith(("tmp/build", "tmp/wheels", "root/.cache"))
                 or name in ("etc/resolv.conf", "etc/hostname")
                 or re.match(r"opt/venv/lib/python3\.\d+/site-packages/(pip|setuptools)/", name)]
    assert not leftovers, leftovers[:10]


def _locked(revision: str, tmp: Path) -> dict[str, str]:
    """The runtime requirements uv.lock pins at `revision` (uv export, no dev group, markers for Linux CPython)."""
    tree = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "pyproject.toml", "uv.lock"],
                          capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tree)) as tar:
        tar.extractall(tmp, filter="data")
    exported = subprocess.run([str(UV), "export", "--frozen", "--no-dev", "--no-emit-project", "--no-hashes",
                               "--no-header", "--no-annotate", "--format", "requirements.txt"],
                              cwd=tmp, capture_output=True, text=True, check=True).stdout
    out = {}
    for line in exported.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"sys_platform": "linux",
                                                                      "platform_system": "Linux"}):
            out[_normal(requirement.name)] = str(requirement.specifier).removeprefix("==")
    return out


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(contents: dict[str, bytes]) -> Iterator[tuple[str, str]]:
    for name, data in contents.items():
        if name.endswith("METADATA"):
            head = data.decode(errors="replace").split("\n\n", 1)[0]
            headers = dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)
            yield _normal(headers["Name"]), headers["Version"]


def test_the_venv_holds_this_versions_wheel_built_from_its_commit_and_exactly_the_dependencies_uv_lock_pins(
        image: Image, layer: tuple[dict[str, Entry], dict[str, bytes]], tmp_path: Path) -> None:
    if not UV.exists():
        pytest.skip(f"no uv at {UV} (set UV=): it exports the lock to compare with")
    _, contents = layer
    installed = dict(_installed(contents))
    assert installed.pop("infer-ctl") == VERSION
    revision = image.labels["org.opencontainers.image.revision"]
    # what `infer-ctl --version` and infer_ctl_build_info say inside the image: the commit it was built from
    [commit] = [data.decode().strip() for name, data in contents.items() if name.endswith("infer_ctl/BUILD_COMMIT")]
    assert commit == revision
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{revision}^{{commit}}"],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip(f"the image's revision {revision} is not in this clone's history (built elsewhere?)")
    assert installed == _locked(revision, tmp_path)


def test_the_scripts_name_the_missing_piece_and_the_command_that_makes_it(tmp_path: Path) -> None:
    run = subprocess.run([str(ROOT / "scripts" / "run-image.sh"), "--bundle", str(tmp_path / "none"), "--", "--help"],
                         capture_output=True, text=True, check=False)
    expected = "needs root" if os.geteuid() != 0 else (f"no unpacked image in {tmp_path / 'none'} "
                                                       "(rootfs/ and image-config.json): run scripts/build-image.sh")
    assert run.returncode == 1 and expected in run.stderr, run.stderr
    build = subprocess.run([str(ROOT / "scripts" / "build-image.sh"), "push"], capture_output=True, text=True,
                           check=False)
    assert build.returncode == 1 and "unknown action 'push' (build, unpack, check, info)" in build.stderr
    info = subprocess.run([str(ROOT / "scripts" / "build-image.sh"), "info"], capture_output=True, text=True,
                          check=False, env={**os.environ, "INFER_CTL_IMAGE_CACHE": str(tmp_path)})
    assert info.returncode == 1 and f"no image in {tmp_path / 'oci'}: run scripts/build-image.sh" in info.stderr
