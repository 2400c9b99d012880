"""Packaging: every import declared (deptry), and the built wheel works where a user installs it.

The wheel is built from this checkout with the pinned uv, installed into fresh venvs outside the checkout with the
lock's versions as constraints (what uv.lock says, resolved from the wheel's own metadata, so a dependency missing
from pyproject fails here), then run from a temporary directory: the controller without any extra, each extra
alone with the commands it is for, and the demo and `validate` with all of them.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
import urllib.request
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import IO

import pytest

from infer_ctl.version import git_commit

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
    dev_tools = "pytest|hypothesis|looptime|pytest_asyncio|importlinter|packaging"
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
    # (the sandbox extra adds kubernetes-validate, whose schemas the emulator serves and checks; aiohttp and
    # referencing come with kopf and jsonschema, and stay declared, as the sandbox imports them itself)
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


# Each extra installed alone (pip install 'infer-ctl[EXTRA]'), and what a user of it runs. What each command imports
# lazily, beyond what the run itself reaches, is checked by importing every module its code names (below).
def _imported_by(modules: tuple[str, ...]) -> set[str]:
    """Every module named by an import statement (at any depth: imports inside functions too) in `modules` and,
    transitively, in the infer_ctl and loadgen modules they name."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        base = ROOT.joinpath(*name.split("."))
        source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if not source.is_file():
            continue  # not ours: imported, not read
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                todo.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                todo.append(node.module)
                todo.extend(f"{node.module}.{a.name}" for a in node.names
                            if ROOT.joinpath(*node.module.split("."), f"{a.name}.py").is_file())
    return seen


def _extra_distributions() -> dict[str, set[str]]:
    """extra -> the top-level modules its distributions provide (read from this venv, which holds every extra)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    by_dist: dict[str, set[str]] = {}
    for module, dists in metadata.packages_distributions().items():
        for dist in dists:
            by_dist.setdefault(dist.lower().replace("_", "-"), set()).add(module)
    out = {}
    for extra, requirements in extras.items():
        names = {re.match(r"[A-Za-z0-9._-]+", r)[0].lower().replace("_", "-") for r in requirements}  # type: ignore[index]
        out[extra] = set().union(*(by_dist.get(n, set()) for n in names if not n.startswith("infer-ctl")))
    return out


def _import_all(bin_: Path, modules: set[str], installed: str, cwd: Path) -> None:
    """Import each of `modules` in the venv; a module may fail only for want of another extra's package."""
    others = set().union(*(mods for extra, mods in _extra_distributions().items()
                           if extra not in (installed, "all")))
    ours = _extra_distributions()[installed]
    script = ("import importlib, json, sys\nfailed = {}\nfor m in sys.argv[1:]:\n    try:\n"
              "        importlib.import_module(m)\n    except ImportError as exc:\n"
              "        failed[m] = [type(exc).__name__, exc.name, str(exc)]\nprint(json.dumps(failed))\n")
    result = _run([bin_ / "python", "-c", script, *sorted(modules)], cwd=cwd, env=_clean_env())
    assert result.returncode == 0, result.stderr
    failed = json.loads(result.stdout)
    wrong = {m: why for m, why in failed.items()
             if not (why[0] == "ModuleNotFoundError" and why[1] and why[1].split(".")[0] in others - ours)}
    assert not wrong, wrong


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Lines:
    """A process's output read line by line on a thread, so that a test waits for a line with a deadline."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._new = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._new:
                self.lines.append(line)
                self._new.notify_all()

    def wait_for(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        with self._new:
            while True:
                found = next((line for line in self.lines if text in line), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                assert left > 0, f"no line with {text!r} in {timeout_s} s:\n" + "".join(self.lines[-40:])
                self._new.wait(left)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_the_sandbox_extra_alone_runs_the_sandbox_and_the_wheels_controller_knows_its_commit(
        wheel: tuple[Path, Path], tmp_path: Path) -> None:
    """pip install 'infer-ctl[sandbox]', then `infer-ctl sandbox up` (it once died on kubernetes_validate, which
    only [validate] held) and `infer-ctl controller` against it: its start-up line and its infer_ctl_build_info
    name the commit the wheel was built from, recorded at build time, as `--version` does. `infer-ctl demo` is not
    run here (test_the_demo_runs_from_the_installed_wheel runs it with [all]): every module the demo and the
    sandbox name in their code, and the model server's, is imported instead, failing only for want of 'plot'."""
    bin_ = _venv(tmp_path / "venv", *wheel, extras="sandbox")
    work = tmp_path / "work"
    work.mkdir()
    env = {**_clean_env(), "PYTHONUNBUFFERED": "1"}
    commit = git_commit(ROOT)
    assert commit is not None
    version = _run([bin_ / "infer-ctl", "--version"], cwd=work, env=env)
    assert version.stdout.startswith(f"infer-ctl 0.1.0 (commit {commit}, recorded when the package was built; "
                                     "Python "), version.stdout + version.stderr
    kubeconfig = work / "kubeconfig"
    sandbox = subprocess.Popen([bin_ / "infer-ctl", "sandbox", "up", "--kubeconfig", kubeconfig], cwd=work, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    controller: subprocess.Popen[str] | None = None
    try:
        assert sandbox.stdout is not None
        _Lines(sandbox.stdout).wait_for("CRD:         inferenceservices.infer-ctl.io installed", 90)
        port = _free_port()
        controller = subprocess.Popen([bin_ / "infer-ctl", "controller", "--kubeconfig", kubeconfig,
                                       "--metrics-port", str(port)], cwd=work, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
        assert controller.stdout is not None
        started = _Lines(controller.stdout).wait_for("the controller starts", 60)
        assert f"infer-ctl 0.1.0 (commit {commit}, recorded when the package was built; Python " in started
        deadline = time.monotonic() + 30
        while True:
            try:
                metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline, "the controller's /metrics never answered"
                time.sleep(0.2)
        python = _run([bin_ / "python", "-c", "import platform; print(platform.python_version())"]).stdout.strip()
        assert f'infer_ctl_build_info{{commit="{commit}",python="{python}",version="0.1.0"}} 1.0' in metrics
    finally:
        for process in (controller, sandbox):
            if process is not None:
                _stop(process)
    assert sandbox.returncode == 0
    modules = _imported_by(("infer_ctl.cli.main", "infer_ctl.cli.sandbox", "infer_ctl.cli.demo", "loadgen.__main__",
                            "infer_ctl.sandbox.modelserver"))
    _import_all(bin_, modules, "sandbox", work)


@pytest.mark.slow
def test_the_validate_extra_alone_validates_every_kind(wheel: tuple[Path, Path], tmp_path: Path) -> None:
    """pip install 'infer-ctl[validate]': `validate` of a Namespace (a kind other than InferenceService) too, and
    every module `validate` names imports."""
    bin_ = _venv(tmp_path / "venv", *wheel, extras="validate")
    checked = _run([bin_ / "infer-ctl", "validate", EXAMPLE, NAMESPACE], cwd=tmp_path, env=_clean_env())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "InferenceService default/llama-8b is valid" in checked.stdout
    assert "Namespace" in checked.stdout and "is valid (Kubernetes" in checked.stdout
    assert "pip install" not in checked.stdout + checked.stderr
    _import_all(bin_, _imported_by(("infer_ctl.cli.main", "infer_ctl.cli.validate")), "validate", tmp_path)


@pytest.mark.slow
def test_the_plot_extra_alone_draws_the_simulators_plot(wheel: tuple[Path, Path], tmp_path: Path) -> None:
    """pip install 'infer-ctl[plot]': `simulate --plot` draws its PNG, and every module `simulate` and `bench`
    name imports (the sandbox's, which `bench` runs on, only for want of the 'sandbox' extra's packages)."""
    bin_ = _venv(tmp_path / "venv", *wheel, extras="plot")
    drawn = _run([bin_ / "infer-ctl", "simulate", "--trace", "20,80", "--trace-format", "step", "--step-s", "300",
                  "--policy", "infer-ctl", "--plot", tmp_path / "sim.png"], cwd=tmp_path, env=_clean_env())
    assert drawn.returncode == 0, drawn.stdout + drawn.stderr
    assert (tmp_path / "sim.png").read_bytes().startswith(b"\x89PNG")
    _import_all(bin_, _imported_by(("infer_ctl.cli.main", "infer_ctl.cli.simulate", "infer_ctl.cli.bench")), "plot",
                tmp_path)


def _recorded(wheel: Path) -> str | None:
    with zipfile.ZipFile(wheel) as z:
        return z.read("infer_ctl/BUILD_COMMIT").decode().strip() if "infer_ctl/BUILD_COMMIT" in z.namelist() else None


def test_the_commit_is_recorded_through_the_sdist_and_given_where_there_is_no_git(tmp_path: Path) -> None:
    """setup.py's build step: `uv build` (the sdist, then the wheel from it) carries the checkout's commit; a build
    from a tree without .git (an unpacked sdist without its record, as an image's build context) records the
    commit $INFER_CTL_BUILD_COMMIT gives, refuses one that is not a commit, and records nothing without it, so that
    the installed package says "unknown" rather than a guess."""
    commit = git_commit(ROOT)
    built = _run([_uv(), "build", "--quiet", "--out-dir", tmp_path / "dist", ROOT])
    assert built.returncode == 0, built.stderr
    [sdist], [wheel] = list((tmp_path / "dist").glob("*.tar.gz")), list((tmp_path / "dist").glob("*.whl"))
    assert _recorded(wheel) == commit
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    [tree] = list((tmp_path / "src").iterdir())
    assert (tree / "infer_ctl" / "BUILD_COMMIT").read_text().strip() == commit
    (tree / "infer_ctl" / "BUILD_COMMIT").unlink()

    def build(given: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "INFER_CTL_BUILD_COMMIT"}
        if given is not None:
            env["INFER_CTL_BUILD_COMMIT"] = given
        out = tmp_path / f"out-{given}"
        return _run([_uv(), "build", "--wheel", "--out-dir", out, tree], cwd=tmp_path, env=env)

    given = "0123456789abcdef0123456789abcdef01234567"
    assert build(given).returncode == 0
    assert _recorded(next((tmp_path / f"out-{given}").glob("*.whl"))) == given
    refused = build("main")
    assert refused.returncode != 0
    assert "INFER_CTL_BUILD_COMMIT='main': expected 40 lowercase hex digits" in refused.stderr
    assert build(None).returncode == 0
    assert _recorded(next((tmp_path / "out-None").glob("*.whl"))) is None
