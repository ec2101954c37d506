"""The layer rule: imports only point down, for every package of the project; and every module is
named where its package is described (its ``__init__`` docstring; for ``benchmarks``, its README).

protocol                      (stdlib + NumPy only; test_protocol_core checks the third-party side)
datasets      -> protocol
server        -> protocol, datasets
native_peer   -> protocol, datasets
browser_peer  -> protocol
tools         -> the above
lab           -> the above and tools
deploy        -> the above and lab
benchmarks    -> the above and lab
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "datasets", "server", "native_peer", "browser_peer", "tools", "lab", "deploy", "benchmarks")
_PEERS = {"protocol", "datasets", "server", "native_peer", "browser_peer"}
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "datasets": {"protocol"},
    "server": {"protocol", "datasets"},
    "native_peer": {"protocol", "datasets"},
    "browser_peer": {"protocol"},
    "tools": _PEERS,
    "lab": _PEERS | {"tools"},
    "deploy": _PEERS | {"tools", "lab"},
    "benchmarks": _PEERS | {"tools", "lab", "deploy"},
}


def _our_imports(path: Path) -> set[str]:
    """The packages of this project that the module at ``path`` imports (absolute imports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & set(PACKAGES)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_only_point_down(package: str) -> None:
    modules = sorted((REPO / package).rglob("*.py"))
    assert modules, f"{package} has no modules"
    violations = {
        str(path.relative_to(REPO)): sorted(imported - ALLOWED[package] - {package})
        for path in modules
        if (imported := _our_imports(path)) - ALLOWED[package] - {package}
    }
    assert violations == {}


def test_the_rule_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from server.app import create_app\nimport lab.demo\nfrom . import sibling\n")
    assert _our_imports(module) == {"server", "lab"}


def _named_modules(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_named_where_its_package_is_described(package: str) -> None:
    if package == "benchmarks":  # its README is the index: each module by its ``python -m`` name or path
        described = {
            n[len("benchmarks.") :]
            for n in re.findall(r"benchmarks[./][a-z_]+", (REPO / package / "README.md").read_text())
        }
    else:
        described = _named_modules(ast.get_docstring(ast.parse((REPO / package / "__init__.py").read_text())) or "")
    modules = {path.stem for path in (REPO / package).glob("*.py")} - {"__init__", "__main__"}
    assert sorted(modules - described) == []


def test_an_unnamed_module_is_seen(tmp_path: Path) -> None:
    docstring = "    store   the store\n    blobs   artifacts"
    assert {"store", "blobs"} <= _named_modules(docstring) and "replay" not in _named_modules(docstring)
