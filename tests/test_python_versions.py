"""The Pythons infer-ctl takes: pyproject's requires-python and classifiers, the lock's wheels and the bootstrap
of ./run and ./test (scripts/bootstrap.sh) say the same, and the bootstrap takes any Python from the minimum on.

These machines have only Python 3.11: the choice of a newer one is checked with stand-in interpreters that answer
the bootstrap's version question, and the lock is checked to hold a Linux wheel of every compiled dependency for
every classified version (so that 3.12, 3.13 and 3.14 install without a compiler)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP = ROOT / "scripts" / "bootstrap.sh"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = tomllib.loads((ROOT / "uv.lock").read_text())


def classified() -> list[tuple[int, int]]:
    found = [re.fullmatch(r"Programming Language :: Python :: (\d+)\.(\d+)", c)
             for c in PYPROJECT["project"]["classifiers"]]
    return sorted((int(m[1]), int(m[2])) for m in found if m)


def test_requires_python_the_classifiers_the_lock_and_the_bootstrap_agree_on_the_minimum() -> None:
    minimum = re.fullmatch(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert minimum, "requires-python is '>=X.Y' (no upper bound: the classifiers say what is checked)"
    lowest = (int(minimum[1]), int(minimum[2]))
    versions = classified()
    assert versions[0] == lowest
    assert versions == [(3, minor) for minor in range(lowest[1], versions[-1][1] + 1)], "no gaps"
    assert LOCK["requires-python"] == PYPROJECT["project"]["requires-python"]
    assert re.search(rf"^PYTHON_MIN={lowest[0]}\.{lowest[1]}$", BOOTSTRAP.read_text(), re.MULTILINE)


def _installs_on(wheel: str, version: tuple[int, int]) -> bool:
    """Whether a wheel (by its file name) installs on CPython `version` on Linux x86-64."""
    python, abi, platform = wheel.removesuffix(".whl").split("-")[-3:]
    if platform != "any" and not ("linux" in platform and "x86_64" in platform):
        return False
    tags = python.split(".")
    if f"cp{version[0]}{version[1]}" in tags or "py3" in tags:
        return True
    return abi == "abi3" and any(int(t[3:]) <= version[1] for t in tags if re.fullmatch(r"cp3\d+", t))


@pytest.mark.parametrize(("wheel", "version", "installs"), [
    ("numpy-2.4.6-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", (3, 12), True),
    ("numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", (3, 12), False),
    ("numpy-2.4.6-cp312-cp312-macosx_14_0_arm64.whl", (3, 12), False),
    ("charset_normalizer-3.5.3-cp38-abi3-manylinux2014_x86_64.whl", (3, 13), True),
    ("ruff-0.17.6-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", (3, 14), True),
    ("pyyaml-6.0.4-py3-none-any.whl", (3, 14), True),
], ids=["its own version", "another version's", "another platform's", "the stable ABI from an older version",
        "any Python 3, built for Linux", "pure Python"])
def test_a_wheel_installs_on_the_versions_its_tags_name(wheel: str, version: tuple[int, int],
                                                        installs: bool) -> None:
    assert _installs_on(wheel, version) is installs


def test_every_locked_package_has_a_wheel_for_every_classified_python() -> None:
    missing = []
    for package in LOCK["package"]:
        wheels = [w["url"].rsplit("/", 1)[1] for w in package.get("wheels", [])]
        if not wheels:
            continue  # the project itself (editable)
        for version in classified():
            if not any(_installs_on(w, version) for w in wheels):
                missing.append(f"{package['name']} {package['version']} on {version[0]}.{version[1]}")
    assert not missing, missing


def choose(tmp_path: Path, interpreters: dict[str, str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """What bootstrap.sh's _python chooses among stand-ins `name -> the X.Y it reports` (nothing else on PATH)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(parents=True)
    for name, version in interpreters.items():
        (bin_ / name).write_text(f"#!/bin/sh\necho {version}\n")
        (bin_ / name).chmod(0o755)
    result = subprocess.run(["/bin/bash", "-c", f"source {BOOTSTRAP}; _python"], capture_output=True, text=True,
                            env={"PATH": str(bin_), "HOME": str(tmp_path), **(env or {})}, timeout=30, check=False)
    return result.returncode, result.stdout.strip().removeprefix(f"{bin_}/"), result.stderr.strip()


@pytest.mark.parametrize(("interpreters", "chosen"), [
    ({"python3": "3.12"}, "python3"),
    ({"python3": "3.13", "python3.11": "3.11"}, "python3"),
    ({"python3": "3.10", "python3.12": "3.12", "python3.11": "3.11"}, "python3.12"),
    ({"python3": "3.9", "python3.11": "3.11"}, "python3.11"),
    ({"python3.14": "3.14", "python3.13": "3.13"}, "python3.13"),
], ids=["the system's 3.12 (Ubuntu 24.04)", "the system's 3.13 (Debian 13) before an older 3.11",
        "a newer one when the system's is too old", "3.9 is older than 3.11 (numbers, not text)",
        "python3.13 when there is no python3"])
def test_the_bootstrap_takes_any_python_from_the_minimum_on(tmp_path: Path, interpreters: dict[str, str],
                                                            chosen: str) -> None:
    assert choose(tmp_path, interpreters)[:2] == (0, chosen)


def test_the_bootstrap_refuses_an_older_python_and_says_what_it_needs(tmp_path: Path) -> None:
    code, out, err = choose(tmp_path, {"python3": "3.10"})
    assert (code, out) == (1, "")
    assert err == ("infer-ctl needs Python 3.11 or newer (python3, python3.13, python3.12 or python3.11, none found); "
                   "install it with: apt-get install python3 python3-venv")


def test_infer_ctl_python_names_the_interpreter_and_is_checked_too(tmp_path: Path) -> None:
    interpreters = {"python3": "3.12", "python3.10": "3.10", "mypython": "3.13"}
    assert choose(tmp_path, interpreters, {"INFER_CTL_PYTHON": "mypython"})[:2] == (0, "mypython")
    assert choose(tmp_path / "b", interpreters, {"INFER_CTL_PYTHON": "python3.10"}) == (
        1, "", "INFER_CTL_PYTHON=python3.10 is Python 3.10; infer-ctl needs 3.11 or newer")


def test_on_this_machine_the_bootstrap_finds_a_python_it_accepts() -> None:
    result = subprocess.run(["/bin/bash", "-c", f"source {BOOTSTRAP}; py=$(_python) && \"$py\" -c "
                             "'import sys; print(sys.version_info >= (3, 11))'"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert (result.returncode, result.stdout) == (0, "True\n"), result.stderr
