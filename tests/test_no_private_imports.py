"""No module of ours imports a private part of a dependency (a module path with a component starting with `_`,
or a private name taken from a module: `from kmock import _internal`): those change in any release without
notice. Our own packages may import each other's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("infer_ctl", "loadgen", "tests")
ALLOWED = {"__future__"}  # a compiler directive, not a dependency


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def private_imports(source: str, filename: str = "<source>") -> list[str]:
    """`line: what` for each import of a dependency's private module or name in a module's source."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in OURS and alias.name not in ALLOWED and _private(alias.name):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module.split(".")[0] in OURS or node.module in ALLOWED:
                continue
            names = [a.name for a in node.names if a.name != "*" and a.name.startswith("_")]
            if _private(node.module) or names:
                found.append(f"{node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
    return found


def _modules() -> list[Path]:
    return sorted(p for package in OURS for p in (ROOT / package).rglob("*.py") if ".venv" not in p.parts)


def test_the_walk_covers_every_package_of_ours() -> None:
    modules = _modules()
    for package in OURS:
        assert any(p.relative_to(ROOT).parts[0] == package for p in modules), package
    assert Path(__file__).resolve() in modules


def test_no_module_imports_a_private_part_of_a_dependency() -> None:
    offences = [f"{path.relative_to(ROOT)}:{line}" for path in _modules()
                for line in private_imports(path.read_text(encoding="utf-8"), str(path))]
    assert not offences, "private imports of dependencies:\n" + "\n".join(offences)


@pytest.mark.parametrize(("source", "caught"), [
    ("from kmock._internal import parsing, rendering", True),
    ("from kmock import _internal", True),
    ("import kmock._internal.rendering", True),
    ("import kmock._internal as k", True),
    ("from requests.packages.urllib3._collections import HTTPHeaderDict", True),
    ("from prometheus_client.parser import _parse_sample", True),
    ("def f():\n    from kmock._internal import parsing", True),  # nested in a function
    ("try:\n    import _thread\nexcept ImportError:\n    pass", True),  # a private top-level module
    ("from __future__ import annotations", False),
    ("import kmock\nfrom kmock import Request", False),
    ("from infer_ctl.core.api import _private_helper", False),  # ours
    ("from tests.prometheus_server import free_port", False),
    ("from . import _sibling", False),  # relative: ours
    ("import collections.abc", False),
    ("from yaml import *", False),
])
def test_the_check_tells_private_from_public_imports(source: str, caught: bool) -> None:
    assert bool(private_imports(source)) is caught, private_imports(source)
