"""`infer-ctl --version`: the package version and the commit, and how the commit is known (git in a checkout; the
installed wheel's record is checked in tests/test_packaging.py, which builds one)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from infer_ctl.version import BuildInfo, build_info, git_commit, package_version

ROOT = Path(__file__).resolve().parents[1]


def git(where: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A checkout with one commit of one tracked file."""
    where = tmp_path / "repo"
    where.mkdir()
    git(where, "init", "--quiet")
    (where / "tracked.txt").write_text("one\n")
    git(where, "add", "tracked.txt")
    git(where, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "--quiet", "-m", "first")
    return where


def test_a_clean_checkout_gives_its_head(repo: Path) -> None:
    assert git_commit(repo) == git(repo, "rev-parse", "HEAD")


def test_a_changed_tracked_file_marks_the_commit_dirty_and_an_untracked_one_does_not(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    (repo / "untracked.txt").write_text("new\n")
    assert git_commit(repo) == head
    (repo / "tracked.txt").write_text("two\n")
    assert git_commit(repo) == f"{head}-dirty"


def test_a_folder_inside_some_other_checkout_is_not_a_checkout(repo: Path, tmp_path: Path) -> None:
    """A venv's site-packages inside a checkout is an installed package: its commit is not that checkout's HEAD."""
    inside = repo / ".venv" / "lib" / "site-packages"
    inside.mkdir(parents=True)
    assert git_commit(inside) is None
    assert git_commit(tmp_path) is None  # no repository at all


def test_the_version_is_pyprojects() -> None:
    assert package_version() == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_version_flag_prints_the_checkouts_commit_and_says_it_came_from_git(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "infer_ctl.cli.main", "--version"], cwd=tmp_path,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                            timeout=60, check=True)
    commit = git_commit(ROOT)
    assert commit is not None  # the suite runs from a checkout
    python = ".".join(str(n) for n in sys.version_info[:3])
    assert result.stdout == (f"infer-ctl {package_version()} (commit {commit}, from the git checkout {ROOT}; "
                             f"Python {python})\n")
    assert build_info() == BuildInfo(package_version(), commit, f"from the git checkout {ROOT}", python)
