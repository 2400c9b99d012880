"""Which infer-ctl this is: the package version and the git commit it was built from.

The commit comes from one of two places, and `BuildInfo.source` says which:
- a git checkout (the package runs from its source tree: ./run, ./test, an editable install): `git rev-parse HEAD`,
  with `-dirty` appended when tracked files differ from that commit;
- an installed wheel: the file `infer_ctl/BUILD_COMMIT`, which setup.py's build step writes from git (or from
  $INFER_CTL_BUILD_COMMIT, for a build without the .git folder, such as an image's).
Neither: "unknown", never a guess.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import metadata, resources
from pathlib import Path

DISTRIBUTION = "infer-ctl"
UNKNOWN = "unknown"
BUILD_COMMIT_FILE = "BUILD_COMMIT"  # in the installed package, written at build time (setup.py)
CHECKOUT = Path(__file__).resolve().parents[1]
_COMMIT = re.compile(r"[0-9a-f]{40}(-dirty)?")


@dataclass(frozen=True, slots=True)
class BuildInfo:
    version: str
    commit: str  # 40 hex digits (+ "-dirty"), or "unknown"
    source: str  # how the commit is known: "git checkout DIR", "recorded at build time", or why it is unknown
    python: str  # e.g. "3.11.7"

    def line(self) -> str:
        """`infer-ctl 0.1.0 (commit 6c1cc86f..., from the git checkout /src; Python 3.11.7)`"""
        return f"infer-ctl {self.version} (commit {self.commit}, {self.source}; Python {self.python})"


def git_commit(directory: Path) -> str | None:
    """HEAD of the git checkout whose top is exactly `directory` (+ "-dirty" when tracked files differ), or None:
    not a checkout, no git, or `directory` lies inside some other repository (a venv inside a checkout)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != directory.resolve():
            return None
        head = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if dirty else head


def recorded_commit() -> str | None:
    """The commit the build step wrote into the installed package, when it did and it reads as one."""
    try:
        text = resources.files("infer_ctl").joinpath(BUILD_COMMIT_FILE).read_text().strip()
    except (FileNotFoundError, NotADirectoryError, OSError):
        return None
    return text if _COMMIT.fullmatch(text) else None


def package_version() -> str:
    """pyproject.toml's version in a checkout (an editable install's metadata can lag behind it), else the
    installed distribution's."""
    pyproject = CHECKOUT / "pyproject.toml"
    if pyproject.is_file() and (CHECKOUT / "infer_ctl").is_dir():
        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except (OSError, tomllib.TOMLDecodeError):
            project = {}
        if project.get("name") == DISTRIBUTION and isinstance(project.get("version"), str):
            return str(project["version"])
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN


@cache
def build_info() -> BuildInfo:
    python = ".".join(str(n) for n in sys.version_info[:3])
    commit = git_commit(CHECKOUT)
    if commit is not None:
        return BuildInfo(package_version(), commit, f"from the git checkout {CHECKOUT}", python)
    commit = recorded_commit()
    if commit is not None:
        return BuildInfo(package_version(), commit, "recorded when the package was built", python)
    return BuildInfo(package_version(), UNKNOWN,
                     "not a git checkout and no commit recorded when the package was built", python)
