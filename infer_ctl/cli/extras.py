"""The optional parts of infer-ctl (pyproject's extras: `sandbox`, `plot`, `validate`) and a clear error when a
command needs one that is not installed.

What each extra holds is read from the installed distribution's metadata (`Requires-Dist: matplotlib<4,>=3.9;
extra == "plot"`), so pyproject.toml stays the one list. The controller needs none of them.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import metadata

DISTRIBUTION = "infer-ctl"


class MissingExtra(RuntimeError):
    """A command needs an extra that is not installed; the message says what to install."""


@cache
def _requirements(extra: str) -> tuple[str, ...]:
    """The distribution names that `extra` adds (empty when infer-ctl's metadata is not installed)."""
    try:
        lines = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return ()
    names = []
    for line in lines:
        requirement, _, marker = line.partition(";")
        if re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", marker):
            name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
            if name:
                names.append(name.group(0))
    return tuple(names)


def missing(extra: str) -> tuple[str, ...]:
    """The distributions of `extra` that are not installed (never the nested `infer-ctl[...]` ones)."""
    out = []
    for name in _requirements(extra):
        if name.lower() == DISTRIBUTION:
            continue
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(name)
    return tuple(out)


def require(extra: str, what: str) -> None:
    """Raise `MissingExtra` naming `what` needs it and the pip command that installs it."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(f"{what} needs infer-ctl's '{extra}' extra ({', '.join(absent)} not installed): "
                           f"pip install 'infer-ctl[{extra}]'")
