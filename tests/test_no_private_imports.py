"""No module of ours imports a private part of a dependency (a module path with a component starting with `_`,
or a private name taken from a module: `from kopf import _core`), nor reaches one through an imported name
(`kopf._core.engines`): those change in any release without notice. Our own packages may use each other's
private names. (Private attributes of a dependency's *instances*, such as `request._payload`, are beyond what a
static walk can tell.)"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("infer_ctl", "loadgen", "tests")
ALLOWED = {"__future__"}  # a compiler directive, not a dependency


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def private_imports(source: str, filename: str = "<source>") -> list[str]:
    """`line: what` for each import of a dependency's private module or name in a module's source, and each private
    attribute reached through a name an import of a dependency bound (`kopf._core.engines`; the standard
    library's documented underscored functions, such as `os._exit`, are not dependencies' internals)."""
    tree = ast.parse(source, filename)
    found, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in OURS or alias.name in ALLOWED:
                    continue
                bound[alias.asname or alias.name.split(".")[0]] = alias.name
                if _private(alias.name):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module.split(".")[0] in OURS or node.module in ALLOWED:
                continue
            bound.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
            names = [a.name for a in node.names if a.name != "*" and a.name.startswith("_")]
            if _private(node.module) or names:
                found.append(f"{node.lineno}: from {node.module} import {', '.join(a.name for a in node.names)}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            module = bound.get(root.id) if isinstance(root, ast.Name) else None
            if module is not None and module.split(".")[0] not in sys.stdlib_module_names:
                found.append(f"{node.lineno}: {ast.unparse(node)} (through {module})")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


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
    ("from kopf._cogs import parsing, rendering", True),
    ("from kopf import _core", True),
    ("import kopf._cogs.rendering", True),
    ("import kopf._cogs as k", True),
    ("from requests.packages.urllib3._collections import HTTPHeaderDict", True),
    ("from prometheus_client.parser import _parse_sample", True),
    ("def f():\n    from kopf._cogs import parsing", True),  # nested in a function
    ("try:\n    import _thread\nexcept ImportError:\n    pass", True),  # a private top-level module
    ("from __future__ import annotations", False),
    ("import kopf\nfrom kopf import Memo", False),
    ("from infer_ctl.core.api import _private_helper", False),  # ours
    ("from tests.prometheus_server import free_port", False),
    ("from . import _sibling", False),  # relative: ours
    ("import collections.abc", False),
    ("from yaml import *", False),
    ("import kopf\nkopf._cogs.parsing.parse_path('/')", True),  # reached through an attribute
    ("import kopf as k\nx = k._core", True),
    ("from kopf import Memo\nMemo._parse", True),
    ("import kopf\nprint(kopf.__version__)", False),  # dunders are public
    ("import os\nos._exit(0)", False),  # the standard library's documented underscored functions
    ("from infer_ctl.sandbox import apiserver\napiserver._status", False),  # ours
])
def test_the_check_tells_private_from_public_imports(source: str, caught: bool) -> None:
    assert bool(private_imports(source)) is caught, private_imports(source)
