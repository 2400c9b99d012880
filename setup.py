"""setuptools' build steps for infer-ctl (its metadata is all in pyproject.toml): record the git commit the
package is built from as infer_ctl/BUILD_COMMIT, which `infer-ctl --version` and the controller's
infer_ctl_build_info metric read in an installed wheel (infer_ctl/version.py).

Where the commit comes from, first found: $INFER_CTL_BUILD_COMMIT (a build without the .git folder, such as an
image's, passes it); `git rev-parse HEAD` when the source folder is the top of a git checkout ("-dirty" appended
when tracked files differ); the BUILD_COMMIT an sdist carries (a wheel built from that sdist). Else nothing is
written and the installed package says "unknown".
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
RECORD = Path("infer_ctl") / "BUILD_COMMIT"
COMMIT = re.compile(r"[0-9a-f]{40}(-dirty)?")


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30,
                          check=True).stdout.strip()


def build_commit() -> str | None:
    given = os.environ.get("INFER_CTL_BUILD_COMMIT", "").strip()
    if given:
        if not COMMIT.fullmatch(given):
            raise SystemExit(f"INFER_CTL_BUILD_COMMIT={given!r}: expected 40 lowercase hex digits (git rev-parse "
                             "HEAD), optionally followed by -dirty")
        return given
    try:
        if Path(_git("rev-parse", "--show-toplevel")).resolve() == ROOT:
            head = _git("rev-parse", "HEAD")
            return f"{head}-dirty" if _git("status", "--porcelain", "--untracked-files=no") else head
    except (OSError, subprocess.SubprocessError):
        pass
    carried = ROOT / RECORD  # an unpacked sdist
    if carried.is_file() and COMMIT.fullmatch(text := carried.read_text().strip()):
        return text
    return None


def _write(base: Path) -> None:
    commit = build_commit()
    if commit is None:
        # setuptools reuses build/lib between builds: a record left by an earlier build would be a guess
        (base / RECORD).unlink(missing_ok=True)
        return
    (base / RECORD).parent.mkdir(parents=True, exist_ok=True)
    (base / RECORD).write_text(commit + "\n")


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install runs from the checkout, which asks git itself
            _write(Path(self.build_lib))


class SDist(sdist):
    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        _write(Path(base_dir))


setup(cmdclass={"build_py": BuildPy, "sdist": SDist})
