"""Packaging: every import declared (deptry), and the built wheel works where a user installs it.

The wheel is built from this checkout with the pinned uv, installed into fresh venvs outside the checkout with the
lock's versions as constraints (what uv.lock says, resolved from the wheel's own metadata, so a dependency missing
from pyproject fails here), then run from a temporary directory: the controller without any extra, and the demo and
`validate` with all of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "deploy" / "examples" / "llm-8b.yaml"
NAMESPACE = ROOT / "deploy" / "kustomize" / "base" / "namespace.yaml"


def _run(args: list[str | Path], *, cwd: Path = ROOT, timeout: float = 300,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)


def _uv() -> Path:
    uv = BIN / "uv"
    if not uv.exists():
        pytest.fail("uv is not in the test venv: it is in the dev group of pyproject.toml (./test installs it)")
    return uv


def test_every_import_of_the_package_is_declared() -> None:
    """deptry over infer_ctl/ and loadgen/: no missing, unused or only-transitive dependency."""
    result = _run([BIN / "deptry", "."])
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_import_of_the_tests_is_declared() -> None:
    """deptry over tests/ (which the first run leaves out): what the tests import is declared, test tools in the
    dev group; unused-dependency findings are the first run's business."""
    dev_tools = "pytest|hypothesis|looptime|pytest_asyncio|importlinter"
    result = _run([BIN / "deptry", ".", "--exclude", r"\.venv|kubebin|build|dist|infer_ctl|loadgen|scripts",
                   "--ignore", "DEP002", "--per-rule-ignores", f"DEP004={dev_tools}"])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the built wheel, constraints with the lock's versions of every extra)."""
    out = tmp_path_factory.mktemp("dist")
    built = _run([_uv(), "build", "--wheel", "--quiet", "--out-dir", out, ROOT])
    assert built.returncode == 0, built.stderr
    wheels = list(out.glob("infer_ctl-*.whl"))
    assert len(wheels) == 1, wheels
    constraints = out / "constraints.txt"
    exported = _run([_uv(), "export", "--frozen", "--all-extras", "--no-dev", "--no-emit-project", "--no-hashes",
                     "--quiet", "--output-file", constraints])
    assert exported.returncode == 0, exported.stderr
    yield wheels[0], constraints


def _venv(where: Path, wheel: Path, constraints: Path, extras: str = "") -> Path:
    made = _run([_uv(), "venv", "--quiet", "--python", sys.executable, where])
    assert made.returncode == 0, made.stderr
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    installed = _run([_uv(), "pip", "install", "--quiet", "--python", where / "bin" / "python",
                      "--constraint", constraints, target])
    assert installed.returncode == 0, installed.stderr
    return where / "bin"


def _clean_env() -> dict[str, str]:
    """The environment without this checkout on any path (a user's shell)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "INFER_CTL_POLICIES")}


def test_the_controller_installs_without_any_extra(wheel: tuple[Path, Path], tmp_path: Path) -> None:
    """No plotting, emulator or schema packages in a controller install; the controller and `validate` of an
    InferenceService still work, and commands that need an extra say which, with the pip command."""
    bin_ = _venv(tmp_path / "venv", *wheel)
    listed = _run([_uv(), "pip", "list", "--python", bin_ / "python", "--format", "freeze"])
    names = {line.split("==")[0].lower() for line in listed.stdout.split()}
    assert not names & {"matplotlib", "kubernetes-validate"}, sorted(names)
    env, cwd = _clean_env(), tmp_path
    imported = _run([bin_ / "python", "-c", "import infer_ctl.controller.operator, infer_ctl.cli.main"],
                    cwd=cwd, env=env)
    assert imported.returncode == 0, imported.stderr
    assert _run([bin_ / "infer-ctl", "controller", "--help"], cwd=cwd, env=env).returncode == 0
    checked = _run([bin_ / "infer-ctl", "validate", EXAMPLE, NAMESPACE], cwd=cwd, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "InferenceService default/llama-8b is valid" in checked.stdout
    assert "pip install 'infer-ctl[validate]'" in checked.stdout
    # (the sandbox extra adds nothing a controller install lacks since the emulator left kmock: aiohttp and
    # referencing come with kopf and jsonschema; it stays declared, as the sandbox imports them itself)
    plot = _run([bin_ / "infer-ctl", "simulate", "--trace", "none.csv", "--trace-format", "step", "--plot",
                 "x.png"], cwd=cwd, env=env)
    assert plot.returncode == 2
    assert "pip install 'infer-ctl[plot]'" in plot.stderr, plot.stderr


@pytest.mark.slow
def test_the_demo_runs_from_the_installed_wheel(wheel: tuple[Path, Path], tmp_path: Path) -> None:
    """`pip install 'infer-ctl[all]'`, then the demo from an empty directory: the data files (cluster, demo
    services, CRD, policies) come from the wheel, not from a checkout."""
    bin_ = _venv(tmp_path / "venv", *wheel, extras="all")
    work = tmp_path / "work"
    work.mkdir()
    env = _clean_env()
    demo = _run([bin_ / "infer-ctl", "demo", "--duration", "30", "--rate-scale", "0.2"], cwd=work, env=env,
                timeout=240)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "summary" in demo.stdout
    assert (work / ".demo" / "demo.png").stat().st_size > 0
    checked = _run([bin_ / "infer-ctl", "validate", EXAMPLE, NAMESPACE], cwd=work, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Namespace" in checked.stdout and "is valid (Kubernetes" in checked.stdout
